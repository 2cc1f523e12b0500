"""CPU and RSS of named processes from /proc, sampled while a scenario runs.

The bench reports its own process apart from the system under test (gateway, workers, Kafka,
Redis), so a load generator that saturates a core is visible as such and not mistaken for the
server's cost. Linux only; a process that is gone reads as absent, never as zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ProcSample", "ProcSampler", "parse_stat_cpu_ticks", "parse_status_rss", "read_sample"]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def parse_stat_cpu_ticks(stat: str) -> int:
    """utime + stime from a /proc/<pid>/stat line (fields 14, 15; the name may hold spaces)."""
    rest = stat[stat.rindex(")") + 2 :].split()
    return int(rest[11]) + int(rest[12])  # rest[0] is field 3 (state)


def parse_status_rss(status: str) -> int:
    """VmRSS in bytes from /proc/<pid>/status (0 for a kernel thread without it)."""
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@dataclass(frozen=True, slots=True)
class ProcSample:
    cpu_s: float
    rss_bytes: int


def read_sample(pid: int, proc: Path = Path("/proc")) -> ProcSample | None:
    try:
        stat = (proc / str(pid) / "stat").read_text()
        status = (proc / str(pid) / "status").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return ProcSample(parse_stat_cpu_ticks(stat) / _TICKS, parse_status_rss(status))


@dataclass
class _Track:
    first: ProcSample
    last: ProcSample
    peak_rss: int


@dataclass
class ProcSampler:
    """Samples every ``interval_s``; :meth:`report` gives CPU seconds, CPU % of one core and
    RSS (end and peak) per name over the sampled window."""

    pids: Mapping[str, int]
    interval_s: float = 1.0
    _tracks: dict[str, _Track] = field(default_factory=dict)
    _started: float = 0.0
    _ended: float = 0.0

    def sample(self) -> None:
        now = time.monotonic()
        if not self._tracks:
            self._started = now
        self._ended = now
        for name, pid in self.pids.items():
            got = read_sample(pid)
            if got is None:
                continue
            track = self._tracks.get(name)
            if track is None:
                self._tracks[name] = _Track(got, got, got.rss_bytes)
            else:
                track.last = got
                track.peak_rss = max(track.peak_rss, got.rss_bytes)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ProcSampler]:
        """Sample at entry, every ``interval_s`` meanwhile, and at exit."""
        self.sample()

        async def loop() -> None:
            while True:
                await asyncio.sleep(self.interval_s)
                self.sample()

        task = asyncio.create_task(loop())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self.sample()

    def rss(self, name: str) -> int | None:
        track = self._tracks.get(name)
        return None if track is None else track.last.rss_bytes

    def report(self) -> dict[str, dict[str, Any]]:
        wall = max(self._ended - self._started, 1e-9)
        out: dict[str, dict[str, Any]] = {}
        for name, track in sorted(self._tracks.items()):
            cpu = track.last.cpu_s - track.first.cpu_s
            out[name] = {
                "pid": self.pids[name],
                "cpu_s": round(cpu, 3),
                "cpu_pct": round(100 * cpu / wall, 1),
                "rss_mb": round(track.last.rss_bytes / 2**20, 1),
                "rss_peak_mb": round(track.peak_rss / 2**20, 1),
            }
        return out
