"""Devices on the client SDK and the open-loop send step (many connections in one process).

Each device is one :class:`~qim.client.QimClient` logged in with ``login_and_sync`` (so it is
past ONLINE_READY and the gateway releases its pushes) with heartbeats on, and one task that
hands every PUSH_EVENTS entry to a :class:`Router`. The router finds the ledger of the step a
message belongs to by the tag in its client_message_id, so a late entry of an earlier step is
never counted in a later one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from qim.bench.accounting import Ledger, cmid_of_payload, payload_for
from qim.bench.procstats import ProcSampler
from qim.bench.schedule import run_open_loop, timetable
from qim.bench.target import Target
from qim.bench.wire import ByteCounter, counting_dial
from qim.client import (
    ConnectionClosedError,
    HeartbeatConfig,
    Identity,
    IllegalTransition,
    QimClient,
    QimError,
    RequestTimeout,
    SyncResult,
    login_and_sync,
)
from qim.schemas.frames import PushEvents, SyncEntry
from qim.schemas.frames.reactions import ReactionUpdate

__all__ = [
    "Device",
    "EntrySink",
    "Pacer",
    "Router",
    "SendStep",
    "close_all",
    "login_many",
    "run_send_step",
    "wait_until",
    "warm_up",
]

clock = time.monotonic


class EntrySink(Protocol):
    def on_entry(self, user: str, payload: bytes, at: float) -> None: ...


class Router:
    """``tag -> Ledger`` (or any :class:`EntrySink`); entries whose tag names no ledger
    are counted as ``stray``."""

    def __init__(self) -> None:
        self.ledgers: dict[str, EntrySink] = {}
        self.stray = 0

    def on_entry(self, user: str, entry: SyncEntry, at: float) -> None:
        payload = entry.payload_or_ciphertext
        cmid = cmid_of_payload(payload) if payload else entry.client_message_id
        ledger = self.ledgers.get(cmid.partition("-")[0]) if cmid else None
        if ledger is None or cmid is None:
            self.stray += 1
            return
        ledger.on_entry(user, payload or (cmid.encode() + b"|"), at)


class Device:
    """One online device; counts PUSH_EVENTS frames and passes each entry to ``sink``."""

    def __init__(
        self, user: str, result: SyncResult, sink: Callable[[str, SyncEntry, float], None]
    ) -> None:
        self.user = user
        self.result = result
        self.sink = sink
        self.push_frames = 0
        self.push_entries = 0
        self.reaction_frames: list[tuple[float, ReactionUpdate]] = []
        """Every REACTION_UPDATE pushed to this device, with its arrival time."""
        self._task = asyncio.create_task(self._collect())

    @property
    def client(self) -> QimClient:
        return self.result.client

    async def _collect(self) -> None:
        async for frame in self.client.events():
            if isinstance(frame.body, ReactionUpdate):
                self.reaction_frames.append((clock(), frame.body))
            elif isinstance(frame.body, PushEvents):
                at = clock()
                self.push_frames += 1
                for entry in frame.body.events:
                    self.push_entries += 1
                    self.sink(self.user, entry, at)

    async def close(self) -> None:
        await self.client.close()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(self._task, 10)


async def wait_until(check: Callable[[], bool], within_s: float, every_s: float = 0.05) -> bool:
    """Poll ``check`` until it holds or ``within_s`` passes; returns its last value."""
    deadline = clock() + within_s
    while True:
        if check():
            return True
        if clock() >= deadline:
            return False
        await asyncio.sleep(every_s)


class Pacer:
    """Spaces connection attempts at ``rate_per_s`` (the gateway's per_ip_connect_rate)."""

    def __init__(self, rate_per_s: float) -> None:
        self._interval = 1.0 / rate_per_s
        self._next = 0.0

    async def wait(self) -> None:
        now = clock()
        slot = max(now, self._next)
        self._next = slot + self._interval
        if slot > now:
            await asyncio.sleep(slot - now)


def new_client(counter: ByteCounter | None = None, *, heartbeat: bool = True) -> QimClient:
    return QimClient(
        heartbeat=HeartbeatConfig(enabled=heartbeat),
        request_timeout=30,
        connect_timeout=30,
        dial=None if counter is None else counting_dial(counter),
    )


async def login_many(
    target: Target,
    tenant: str,
    users: Sequence[str],
    sink: Callable[[str, SyncEntry, float], None],
    *,
    device: str = "bench",
    connect_rate: float = 15.0,
    concurrency: int = 32,
) -> list[Device]:
    """Log every user in (one device each), paced; all or nothing (closes on failure)."""
    pacer, gate = Pacer(connect_rate), asyncio.Semaphore(concurrency)

    async def one(user: str) -> Device:
        async with gate:
            await pacer.wait()
            token = target.token(tenant, user, device)
            result = await login_and_sync(new_client(), target.ws_url, token, device)
            result.client.identity = Identity(tenant, user)
            return Device(user, result, sink)

    outcomes = await asyncio.gather(*(one(u) for u in users), return_exceptions=True)
    devices = [d for d in outcomes if isinstance(d, Device)]
    failed = [e for e in outcomes if isinstance(e, BaseException)]
    if failed:
        await close_all(devices)
        raise failed[0]
    return devices


async def close_all(devices: Sequence[Device]) -> None:
    await asyncio.gather(*(d.close() for d in devices), return_exceptions=True)


def error_name(exc: BaseException) -> str:
    if isinstance(exc, QimError):
        return getattr(exc.code, "name", str(exc.code))
    if isinstance(exc, RequestTimeout):
        return "TIMEOUT"
    return "CLOSED"


async def send_one(
    ledger: Ledger, sender: Device, peer: str, cmid: str, payload: bytes, ack_timeout_s: float
) -> None:
    try:
        await sender.client.send_direct(
            peer, payload, client_message_id=cmid, timeout=ack_timeout_s
        )
    except (QimError, RequestTimeout, ConnectionClosedError, IllegalTransition) as exc:
        ledger.on_error(cmid, error_name(exc))
    else:
        ledger.on_ack(cmid, clock())


@dataclass(frozen=True)
class SendStep:
    """One rate of the sweep: ``tag`` prefixes every client_message_id (no ``-`` in it)."""

    tag: str
    rate: float
    duration_s: float
    payload_bytes: int = 200
    drain_s: float = 30.0
    ack_timeout_s: float = 30.0


async def run_send_step(
    step: SendStep,
    pairs: Sequence[tuple[Device, Device]],
    router: Router,
    sampler: ProcSampler | None = None,
) -> tuple[Ledger, dict[str, Any]]:
    """Open-loop one-to-one sends round-robin over ``pairs`` (sender, recipient); waits for
    every SEND_ACK and up to ``drain_s`` for the pushes; returns the ledger and the timing."""
    if "-" in step.tag:
        raise ValueError("a step tag must not contain '-'")
    ledger = Ledger()
    router.ledgers[step.tag] = ledger
    tasks: set[asyncio.Task[None]] = set()

    def fire(index: int, intended: float) -> None:
        sender, recipient = pairs[index % len(pairs)]
        cmid = f"{step.tag}-{index}"
        ledger.on_send(cmid, sender.user, recipient.user, intended)
        payload = payload_for(cmid, step.payload_bytes)
        task = asyncio.create_task(
            send_one(ledger, sender, recipient.user, cmid, payload, step.ack_timeout_s)
        )
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    sampler = sampler or ProcSampler({})
    async with sampler.running():
        start = clock() + 0.05
        times = timetable(step.rate, step.duration_s, start)
        late = await run_open_loop(times, fire, clock=clock, sleep=asyncio.sleep)
        sent_end = clock()
        while tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await wait_until(ledger.settled, step.drain_s)
    acks = [s.ack_at for s in ledger.messages.values() if s.ack_at is not None]
    span = max((max(acks) if acks else sent_end) - start, step.duration_s, 1e-9)
    timing = {
        "achieved_rate": round(len(acks) / span, 2),
        "scheduler_late_ms": round(late * 1000, 3),
        "settled": ledger.settled(),
    }
    return ledger, timing


async def warm_up(
    pairs: Sequence[tuple[Device, Device]], router: Router, tag: str, *, within_s: float = 120.0
) -> int:
    """Send one message per pair until each pair has seen one pushed and echoed.

    Presence reaches the MailboxNode asynchronously after ONLINE_READY; until it has, a
    message is materialized but not pushed (the pull path covers it, not this benchmark).
    Returns the rounds it took; raises TimeoutError past ``within_s``.
    """
    deadline = clock() + within_s
    waiting = list(range(len(pairs)))
    round_ = 0
    while waiting:
        if clock() > deadline:
            raise TimeoutError(f"{len(waiting)} pairs never got a push during warm-up")
        ledger = Ledger()
        router.ledgers[f"{tag}{round_}"] = ledger
        sends = []
        for i in waiting:
            sender, recipient = pairs[i]
            cmid = f"{tag}{round_}-{i}"
            ledger.on_send(cmid, sender.user, recipient.user, clock())
            sends.append(send_one(ledger, sender, recipient.user, cmid, payload_for(cmid, 16), 30))
        await asyncio.gather(*sends)
        await wait_until(ledger.settled, min(3.0, max(0.0, deadline - clock())))
        waiting = [
            i
            for i in waiting
            if (s := ledger.messages[f"{tag}{round_}-{i}"]).pushed_at is None or s.echoed_at is None
        ]
        round_ += 1
    return round_
