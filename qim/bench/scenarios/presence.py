"""Scenario ``presence``: login / logout of a watched user -> the watcher's PRESENCE_SUB frame.

Spec 13.2 / 16.1.2 ``presence_propagation_target``: P99 <= 1 s end to end (issue 16). ``pairs``
watchers each subscribe (``PRESENCE_SUB{subscribe, user_ids=[subject]}``) to their own subject;
then every subject logs in and out ``cycles`` times. Measured per transition, on one clock (the
bench process holds both ends): from the moment the subject's client **starts** its login
(dial, AUTH, login sync) or its close, to the moment the watcher's client decodes the
incremental ``PRESENCE_SUB`` (request_id 0) that shows the new state. So the number includes
the subject's own connect time (an upper bound for "login -> presence") and every hop of the
path: the subject's gateway writing ``qim.presence``, the broker, the watcher's gateway's
follower of the whole topic (topology.md decision 31), its watch index and the socket.

Each pair waits ``gap_s`` after every change it saw before causing the next, and ``gap_s`` must
exceed the stack's ``presence_sub_merge_window`` (2 s): the first change after a quiet window
leaves at once, so the figure is propagation, not merging. A change not seen within
``timeout_s`` is counted as ``missed`` (and fails the verdict), never dropped from the
samples silently.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from qim.bench.histogram import Samples
from qim.bench.loadgen import Device, Pacer, close_all, login_many, new_client
from qim.bench.report import Column, Result
from qim.bench.target import Target
from qim.client import Identity, login_and_sync
from qim.schemas.frames.control import PresenceSubDown

__all__ = ["PresenceParams", "meets_target", "run_presence"]

COLUMNS = [
    Column("transition", "transition"),
    Column("pairs", "pairs"),
    Column("samples", "latency_ms.count"),
    Column("missed", "missed"),
    Column("p50 ms", "latency_ms.p50"),
    Column("p99 ms", "latency_ms.p99"),
    Column("max ms", "latency_ms.max"),
    Column("target ms", "target_ms"),
    Column("meets", "meets_target"),
]
ONLINE, OFFLINE, ALL = "online", "offline", "all"

clock = time.monotonic


@dataclass(frozen=True)
class PresenceParams:
    pairs: int = 20
    cycles: int = 5  # login + logout per pair
    gap_s: float = 2.5  # > presence_sub_merge_window (2 s)
    target_ms: float = 1000.0  # presence_propagation_target (P99)
    timeout_s: float = 15.0  # a change not seen by then is missed
    tenant: str = "bench"
    connect_rate: float = 15.0


@dataclass
class _Watch:
    """What one watcher's connection saw of its subject: (arrival, state), in order."""

    subject: str
    arrivals: list[tuple[float, str]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def on_frame(self, body: PresenceSubDown) -> None:
        at = clock()
        for entry in body.entries:
            if entry.user_id == self.subject:
                self.arrivals.append((at, entry.state))
        self.changed.set()

    async def seen(self, state: str, since: float, timeout_s: float) -> float | None:
        """Ms from ``since`` to the first arrival of ``state`` at or after it; None if none
        came within ``timeout_s``. Consumes the arrivals up to the match."""
        deadline = since + timeout_s
        while True:
            for i, (at, got) in enumerate(self.arrivals):
                if at >= since and got == state:
                    del self.arrivals[: i + 1]
                    return (at - since) * 1000
            remaining = deadline - clock()
            if remaining <= 0:
                return None
            self.changed.clear()  # no await since the scan: nothing can slip in between
            try:
                await asyncio.wait_for(self.changed.wait(), remaining)
            except TimeoutError:
                return None


def meets_target(p99_ms: float | None, missed: int, target_ms: float) -> bool:
    """The verdict: every change seen, and the P99 within the target."""
    return p99_ms is not None and missed == 0 and p99_ms <= target_ms


async def _cycle_pair(
    target: Target,
    params: PresenceParams,
    watch: _Watch,
    pacer: Pacer,
    samples: dict[str, Samples],
    missed: dict[str, int],
    start_after_s: float,
) -> None:
    await asyncio.sleep(start_after_s)
    token = target.token(params.tenant, watch.subject, "bench")
    for _ in range(params.cycles):
        await pacer.wait()
        since = clock()
        result = await login_and_sync(new_client(), target.ws_url, token, "bench")
        result.client.identity = Identity(params.tenant, watch.subject)
        subject = Device(watch.subject, result, lambda *_: None)
        try:
            took = await watch.seen(ONLINE, since, params.timeout_s)
            _record(samples, missed, ONLINE, took)
            await asyncio.sleep(params.gap_s)
        finally:
            since = clock()
            await subject.close()
        took = await watch.seen(OFFLINE, since, params.timeout_s)
        _record(samples, missed, OFFLINE, took)
        await asyncio.sleep(params.gap_s)


def _record(
    samples: dict[str, Samples], missed: dict[str, int], state: str, took: float | None
) -> None:
    if took is None:
        missed[state] += 1
    else:
        samples[state].add(took)
        samples[ALL].add(took)


async def run_presence(target: Target, params: PresenceParams) -> Result:
    run = uuid.uuid4().hex[:6]
    watchers = [f"p{run}w{i}" for i in range(params.pairs)]
    watches = [_Watch(f"p{run}s{i}") for i in range(params.pairs)]
    devices: list[Device] = await login_many(
        target, params.tenant, watchers, lambda *_: None, connect_rate=params.connect_rate
    )
    samples = {ONLINE: Samples(), OFFLINE: Samples(), ALL: Samples()}
    missed = {ONLINE: 0, OFFLINE: 0}
    try:
        for device, watch in zip(devices, watches, strict=True):
            device.client.on_presence = watch.on_frame
            snapshot = await device.client.subscribe_presence((watch.subject,), timeout=30)
            states = {e.user_id: e.state for e in snapshot.entries}
            if states.get(watch.subject) != OFFLINE:
                raise RuntimeError(f"{watch.subject} is not offline before its first login")
        pacer = Pacer(params.connect_rate)
        spread = params.gap_s / max(1, params.pairs)  # the pairs' changes interleave evenly
        await asyncio.gather(
            *(
                _cycle_pair(target, params, watch, pacer, samples, missed, i * spread)
                for i, watch in enumerate(watches)
            )
        )
    finally:
        await close_all(devices)
    rows: list[dict[str, Any]] = []
    for name, s, lost in (
        ("login", samples[ONLINE], missed[ONLINE]),
        ("logout", samples[OFFLINE], missed[OFFLINE]),
        ("all", samples[ALL], missed[ONLINE] + missed[OFFLINE]),
    ):
        summary = s.summary((50.0, 99.0))
        p99 = summary["p99"]
        rows.append(
            {
                "transition": name,
                "pairs": params.pairs,
                "latency_ms": summary,
                "missed": lost,
                "target_ms": params.target_ms,
                "meets_target": meets_target(p99, lost, params.target_ms),
            }
        )
    overall = rows[-1]
    verdict = "meets" if overall["meets_target"] else "misses"
    headline = (
        f"presence propagation p99 {overall['latency_ms']['p99']} ms over "
        f"{overall['latency_ms']['count']} changes ({overall['missed']} missed): {verdict} "
        f"presence_propagation_target {params.target_ms:g} ms"
    )
    return Result("presence", asdict(params), rows, COLUMNS, {}, headline)
