"""Scenario ``reactions``: a burst of REACTs on one message of a big group, 20 % online (issue 19).

A member sends one message; once every online device has been pushed it (a barrier: its mailbox
entries are written), ``reactions`` online members each REACT once on it, open loop at ``rate``.
Reported (spec 13.6.3, 26.3.8): REACTION_UPDATE frames per connection and the most any one
connection got within one ``reaction_push_merge_window`` (the merge bound is 1 per message per
window), online devices that ended on the final absolute counts, mailbox entries written during
the burst (the mailbox worker's ``mailbox_entries_written_total``; must be 0), the REACT round
trip p50/p99 and the time from the last REACT to the last device's final frame.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from qim.bench.accounting import Deliveries, payload_for
from qim.bench.histogram import Samples
from qim.bench.loadgen import Device, Router, close_all, error_name, login_many, wait_until
from qim.bench.report import Column, Result
from qim.bench.schedule import run_open_loop, timetable
from qim.bench.target import Target
from qim.client import ConnectionClosedError, IllegalTransition, QimError, RequestTimeout

__all__ = ["ReactionsParams", "max_in_window", "run_reactions"]

COLUMNS = [
    Column("members", "members"),
    Column("online", "online"),
    Column("reactions", "reactions"),
    Column("frames/conn", "frames_per_connection.mean"),
    Column("max/conn/window", "max_frames_per_window"),
    Column("final ok", "final_devices"),
    Column("mailbox entries", "mailbox_entries_written"),
    Column("REACT p50 ms", "react_ms.p50"),
    Column("REACT p99 ms", "react_ms.p99"),
    Column("settled s", "settled_s"),
    Column("errors", "errors"),
]
ENTRIES = "mailbox_entries_written_total"
KEYS = ("like", "heart", "laugh", "wow", "sad")


@dataclass(frozen=True)
class ReactionsParams:
    size: int = 1000
    online_fraction: float = 0.2
    reactions: int = 100  # distinct online reactors, one REACT each
    rate: float = 50.0  # REACT/s in the burst (per_user_reaction_rate is per user)
    window_ms: int = 2000  # the stack's reaction_push_merge_window: the bound checked
    drain_s: float = 60.0
    tenant: str = "bench"
    connect_rate: float = 15.0


def max_in_window(times: Sequence[float], window_s: float) -> int:
    """The most of ``times`` (seconds, any order) inside any half-open window of ``window_s``."""
    ordered = sorted(times)
    best, low = 0, 0
    for high, at in enumerate(ordered):
        while at - ordered[low] >= window_s:
            low += 1
        best = max(best, high - low + 1)
    return best


async def _react(
    device: Device, group: str, seq: int, key: str, samples: Samples, errors: dict[str, int]
) -> None:
    started = time.monotonic()
    try:
        await device.client.react(group, seq, key, timeout=30)
    except (QimError, RequestTimeout, ConnectionClosedError, IllegalTransition) as exc:
        errors[error_name(exc)] = errors.get(error_name(exc), 0) + 1
        return
    samples.add((time.monotonic() - started) * 1000)


async def run_reactions(target: Target, params: ReactionsParams) -> Result:
    run = uuid.uuid4().hex[:6]
    size = params.size
    members = [f"r{run}u{i}" for i in range(size)]
    group = f"g:bench-react-{run}"
    await target.create_group(params.tenant, group, members[0], members)
    online = members[: max(1, math.ceil(size * params.online_fraction))]
    router, warm, tag = Router(), Deliveries(frozenset(online)), f"rw{run}"
    router.ledgers[tag] = warm
    devices = await login_many(
        target, params.tenant, online, router.on_entry, connect_rate=params.connect_rate
    )
    try:
        cmid = f"{tag}-0"
        warm.on_send(cmid, time.monotonic())
        ack = await devices[0].client.send_message(
            group, payload_for(cmid, 32), client_message_id=cmid, timeout=30
        )
        seq = ack.conversation_seq

        def pushed() -> bool:
            return {user for (_, user) in warm.first_at} >= warm.recipients

        await wait_until(pushed, params.drain_s, 0.1)
        for device in devices:
            device.reaction_frames.clear()
        reactors = devices[: min(params.reactions, len(devices))]
        before = await target.mailbox_counters()
        samples, errors = Samples(), dict[str, int]()
        tasks: list[asyncio.Task[None]] = []

        def fire(index: int, intended: float) -> None:
            device, key = reactors[index], KEYS[index % len(KEYS)]
            tasks.append(asyncio.create_task(_react(device, group, seq, key, samples, errors)))

        start = time.monotonic() + 0.05
        await run_open_loop(
            timetable(params.rate, len(reactors) / params.rate, start),
            fire,
            clock=time.monotonic,
            sleep=asyncio.sleep,
        )
        await asyncio.gather(*tasks)
        burst_end = time.monotonic()
        final = len(reactors) - sum(errors.values())

        def settled(device: Device) -> bool:
            held = device.client.reactions.get(group, seq)
            return held is not None and held.summary_version >= final

        await wait_until(lambda: all(settled(d) for d in devices), params.drain_s, 0.1)
        after = await target.mailbox_counters()
        last = [d.reaction_frames[-1][0] for d in devices if d.reaction_frames]
        per_device = [[at for at, _ in d.reaction_frames] for d in devices]
    finally:
        await close_all(devices)
    entries = None
    if ENTRIES in after:
        entries = after[ENTRIES] - before.get(ENTRIES, 0.0)
    row: dict[str, Any] = {
        "members": size,
        "online": len(online),
        "reactions": len(reactors),
        "frames_per_connection": Samples(float(len(t)) for t in per_device).summary(()),
        "max_frames_per_window": max(
            (max_in_window(t, params.window_ms / 1000) for t in per_device), default=0
        ),
        "final_devices": f"{sum(settled(d) for d in devices)}/{len(devices)}",
        "mailbox_entries_written": entries,
        "react_ms": samples.summary((50.0, 99.0)),
        "settled_s": round(max(last) - burst_end, 3) if last else None,
        "errors": errors,
    }
    return Result("reactions", asdict(params), [row], COLUMNS, {})
