"""Fault steps of ``qim chaos``: each ``await step.run(stack)`` injects one fault into the
stack and returns what it did (for the report): a broker or Redis restart, a SIGKILL of one
qim process followed by its restart (no shutdown hook, no last commit: what a crash is), and a
SIGSTOP past the process's lease followed by SIGCONT (a paused process must find itself fenced
or taken over, never write as an owner it no longer is), and a full data disk of one worker
(its data dir is a small tmpfs the private stack mounted: filled to ENOSPC, held, freed)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from qim.bench.procstats import read_sample
from qim.devstack import kafka, procs, redis
from qim.devstack.stack import Stack

__all__ = [
    "BrokerRestart",
    "DiskFull",
    "Fault",
    "ProcessKill",
    "ProcessPause",
    "RedisRestart",
    "gateway_pid",
    "pid_file_of",
    "process_names",
    "rss_bytes",
]


class Fault(Protocol):
    @property
    def name(self) -> str: ...

    async def run(self, stack: Stack) -> dict[str, Any]: ...


@dataclass(frozen=True)
class BrokerRestart:
    """Stop the stack's Kafka (SIGTERM, as ``qim down`` does), keep it down ``down_s``, start
    it again on the same data dir and ports; returns once it answers metadata requests."""

    down_s: float = 12.0
    name: str = "broker-restart"

    async def run(self, stack: Stack) -> dict[str, Any]:
        cfg = stack.cfg.kafka
        started = time.monotonic()
        stopped = await asyncio.to_thread(kafka.stop, cfg)
        down_at = time.monotonic()
        await asyncio.sleep(self.down_s)
        await asyncio.to_thread(kafka.start, cfg)
        up_at = time.monotonic()
        return {
            "fault": self.name,
            "was_running": stopped,
            "stop_s": round(down_at - started, 2),
            "outage_s": round(up_at - down_at, 2),  # down_s plus the start
        }


@dataclass(frozen=True)
class RedisRestart:
    """Stop the stack's Redis (it persists: AOF / RDB, the safety check of 15.x), keep it down
    ``down_s``, start it again on the same data dir and port."""

    down_s: float = 5.0
    name: str = "redis-restart"

    async def run(self, stack: Stack) -> dict[str, Any]:
        cfg = stack.cfg.redis
        stopped = await asyncio.to_thread(redis.stop, cfg)
        down_at = time.monotonic()
        await asyncio.sleep(self.down_s)
        await asyncio.to_thread(redis.start, cfg)
        return {
            "fault": self.name,
            "was_running": stopped,
            "outage_s": round(time.monotonic() - down_at, 2),
        }


def process_names(stack: Stack) -> list[str]:
    """Every qim process of the stack a fault may hit: workers, then gateways."""
    return [w.name for w in stack.cfg.workers] + [g.name for g in stack.cfg.gateways]


def pid_file_of(stack: Stack, process: str) -> Path:
    for w in stack.cfg.workers:
        if w.name == process:
            return stack.cfg.base_dir / "workers" / w.name / "worker.pid"
    for g in stack.cfg.gateways:
        if g.name == process:
            return stack.cfg.base_dir / "gateways" / g.name / "gateway.pid"
    raise KeyError(f"no process {process!r} in this stack")


async def _restart(stack: Stack, process: str) -> None:
    for w in stack.cfg.workers:
        if w.name == process:
            await asyncio.to_thread(stack.start_worker, w, timeout_s=180.0)
            return
    for g in stack.cfg.gateways:
        if g.name == process:
            await asyncio.to_thread(stack.start_gateway, g, timeout_s=120.0)
            return
    raise KeyError(f"no process {process!r} in this stack")


def gateway_pid(stack: Stack) -> int | None:
    """The first gateway's pid while it runs (what the RSS bounds of a run are measured on)."""
    return procs.read_pid(pid_file_of(stack, stack.cfg.gateways[0].name))


def rss_bytes(pid: int | None) -> int | None:
    sample = None if pid is None else read_sample(pid)
    return None if sample is None else sample.rss_bytes


def _live_pid(stack: Stack, process: str) -> int:
    pid_file = pid_file_of(stack, process)
    pid = procs.read_pid(pid_file)
    if pid is None:
        last = last_log_errors(pid_file.with_suffix(".log"))
        raise RuntimeError(f"{process} is not running; its log last said: {last}")
    return pid


def last_log_errors(log_file: Path, *, keep: int = 3, scan_bytes: int = 256 * 1024) -> list[str]:
    """The last error / critical lines of a process log (why a process that should run has
    exited), skipping the connection noise of a broker outage; at most ``keep`` lines of at
    most 600 characters each."""
    try:
        with log_file.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - scan_bytes))
            tail = f.read().decode("utf-8", "replace").splitlines()
    except OSError as exc:
        return [f"(no log: {exc})"]
    noise = ("Unable connect", "Unable to update metadata", "NodeNotReadyError", "Connection at")
    picked = [
        line[:600]
        for line in tail
        if ('"level":"error"' in line or '"level":"critical"' in line or "Traceback" in line)
        and not any(n in line for n in noise)
    ]
    return picked[-keep:] or [line[:600] for line in tail[-keep:]]


@dataclass(frozen=True)
class ProcessKill:
    """SIGKILL one qim process, wait ``down_s``, start it again and wait until it serves."""

    process: str
    down_s: float = 2.0
    name: str = "kill-9"

    async def run(self, stack: Stack) -> dict[str, Any]:
        pid = _live_pid(stack, self.process)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        await asyncio.to_thread(
            procs.wait_until, lambda: not procs.pid_alive(pid), timeout_s=10.0,
            what=f"{self.process} dead",
        )  # fmt: skip
        await asyncio.sleep(self.down_s)
        await _restart(stack, self.process)
        return {
            "fault": self.name,
            "process": self.process,
            "pid": pid,
            "back_after_s": round(time.monotonic() - killed_at, 2),
        }


@dataclass(frozen=True)
class ProcessPause:
    """SIGSTOP one qim process for ``paused_s`` (longer than its lease), then SIGCONT it."""

    process: str
    paused_s: float = 12.0
    name: str = "sigstop"

    async def run(self, stack: Stack) -> dict[str, Any]:
        pid = _live_pid(stack, self.process)
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(self.paused_s)
        finally:
            os.kill(pid, signal.SIGCONT)
        return {"fault": self.name, "process": self.process, "pid": pid, "paused_s": self.paused_s}


@dataclass(frozen=True)
class DiskFull:
    """Fill the filesystem of one worker's data dir to ENOSPC, hold it ``hold_s``, free it.

    The data dir must be its own small filesystem (``qim chaos run --private --disk-full W``
    mounts a tmpfs there before the worker starts), or this would fill the machine's disk:
    a data dir on the same device as the stack folder is refused. A worker that exits on the
    error is started again, as its supervisor would (reported as ``restarted``); one that
    stays up must recover by itself once the space is back."""

    process: str
    hold_s: float = 15.0
    name: str = "disk-full"

    async def run(self, stack: Stack) -> dict[str, Any]:
        data = stack.cfg.base_dir / "workers" / self.process / "data"
        if os.stat(data).st_dev == os.stat(stack.cfg.base_dir).st_dev:
            raise RuntimeError(f"{data} is not a filesystem of its own: not filling it")
        pid = _live_pid(stack, self.process)
        ballast = data / "chaos-ballast"
        filled = await asyncio.to_thread(_fill, ballast)
        try:
            await asyncio.sleep(self.hold_s)
        finally:
            ballast.unlink(missing_ok=True)
        restarted = not procs.pid_alive(pid)
        if restarted:
            await _restart(stack, self.process)
        return {
            "fault": self.name,
            "process": self.process,
            "filled_bytes": filled,
            "held_s": self.hold_s,
            "restarted": restarted,
        }


def _fill(path: Path, chunk: int = 1 << 20) -> int:
    """Write ``path`` until the filesystem says ENOSPC; the bytes written."""
    written = 0
    block = b"\0" * chunk
    with path.open("wb", buffering=0) as f:
        while True:
            try:
                written += f.write(block) or 0
            except OSError:
                break
            if written % (64 * chunk) == 0:
                os.fsync(f.fileno())
    return written
