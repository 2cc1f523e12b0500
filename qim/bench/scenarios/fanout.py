"""Scenario ``fanout``: group messages to groups of 1,000 and 10,000 members, 20% online.

Reports mailbox entries materialized per second (the mailbox worker's
``mailbox_entries_written_total``), PushBatches per second (``qim_mailbox_push_batches_total``),
PUSH_EVENTS frames per second received by the online devices, and PUSHED p50/p99 over every
(message, online member) delivery. Senders are online members too (their echo counts), taken
in turn: ``per_sender_in_conversation_rate`` (1 per 3 s) applies per sender in a large group.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from qim.bench.accounting import Deliveries, payload_for
from qim.bench.loadgen import Device, Router, close_all, error_name, login_many, wait_until
from qim.bench.procstats import ProcSampler
from qim.bench.report import Column, Result
from qim.bench.schedule import run_open_loop, timetable
from qim.bench.target import Target
from qim.client import ConnectionClosedError, IllegalTransition, QimError, RequestTimeout

__all__ = ["FanoutParams", "run_fanout"]

COLUMNS = [
    Column("members", "members"),
    Column("online", "online"),
    Column("messages", "messages"),
    Column("entries/s", "entries_per_s"),
    Column("PushBatch/s", "push_batches_per_s"),
    Column("PUSH_EVENTS/s", "push_events_per_s"),
    Column("PUSHED p50", "pushed_ms.p50"),
    Column("PUSHED p99", "pushed_ms.p99"),
    Column("missing", "deliveries.missing"),
    Column("errors", "errors"),
]
ENTRIES = "mailbox_entries_written_total"
BATCHES = "qim_mailbox_push_batches_total"


@dataclass(frozen=True)
class FanoutParams:
    sizes: tuple[int, ...] = (1000,)
    online_fraction: float = 0.2
    messages: int = 10
    rate: float = 2.0  # below every per_conversation_msg_rate tier
    senders: int = 10  # online members that take turns sending
    payload_bytes: int = 200
    drain_s: float = 60.0
    tenant: str = "bench"
    connect_rate: float = 15.0


async def _send(
    sender: Device, group: str, cmid: str, payload: bytes, errors: dict[str, int]
) -> None:
    try:
        await sender.client.send_message(group, payload, client_message_id=cmid, timeout=30)
    except (QimError, RequestTimeout, ConnectionClosedError, IllegalTransition) as exc:
        errors[error_name(exc)] = errors.get(error_name(exc), 0) + 1


async def _warm(sender: Device, group: str, warm: Deliveries, tag: str, within_s: float) -> None:
    """Group messages until every online device has been pushed one (presence is warm)."""
    deadline = time.monotonic() + within_s
    for i in range(10_000):
        cmid = f"{tag}-{i}"
        warm.on_send(cmid, time.monotonic())
        await _send(sender, group, cmid, payload_for(cmid, 16), {})

        def everyone() -> bool:
            return {user for (_, user) in warm.first_at} >= warm.recipients

        if await wait_until(everyone, min(3.0, max(0.0, deadline - time.monotonic())), 0.1):
            return
        if time.monotonic() > deadline:
            raise TimeoutError("fanout warm-up: some online members were never pushed")


async def _one_size(target: Target, params: FanoutParams, size: int, run: str) -> dict[str, Any]:
    members = [f"f{run}n{size}u{i}" for i in range(size)]
    group = f"g:bench-{run}-{size}"
    await target.create_group(params.tenant, group, members[0], members)
    online = members[: max(1, math.ceil(size * params.online_fraction))]
    router = Router()
    warm = Deliveries(frozenset(online))
    deliveries = Deliveries(frozenset(online))
    router.ledgers[f"w{run}{size}"] = warm
    router.ledgers[f"m{run}{size}"] = deliveries
    devices = await login_many(
        target, params.tenant, online, router.on_entry, connect_rate=params.connect_rate
    )
    try:
        senders = devices[: max(1, params.senders)]
        await _warm(senders[0], group, warm, f"w{run}{size}", 120.0)
        frames0 = sum(d.push_frames for d in devices)
        before = await target.mailbox_counters()
        errors: dict[str, int] = {}
        tasks: list[asyncio.Task[None]] = []

        def fire(index: int, intended: float) -> None:
            cmid = f"m{run}{size}-{index}"
            deliveries.on_send(cmid, intended)
            payload = payload_for(cmid, params.payload_bytes)
            sender = senders[index % len(senders)]
            tasks.append(asyncio.create_task(_send(sender, group, cmid, payload, errors)))

        sampler = ProcSampler(target.pids())
        async with sampler.running():
            start = time.monotonic() + 0.05
            times = timetable(params.rate, params.messages / params.rate, start)
            await run_open_loop(times, fire, clock=time.monotonic, sleep=asyncio.sleep)
            await asyncio.gather(*tasks)
            await wait_until(deliveries.complete, params.drain_s, 0.1)
            end = deliveries.last_at if deliveries.complete() else time.monotonic()
        after = await target.mailbox_counters()
        span = max(end - start, 1e-9)
        frames = sum(d.push_frames for d in devices) - frames0
    finally:
        await close_all(devices)

    def rate(name: str) -> float | None:
        if name not in after:
            return None
        return round((after[name] - before.get(name, 0.0)) / span, 1)

    return {
        "members": size,
        "online": len(online),
        "messages": params.messages,
        "span_s": round(span, 3),
        "entries_per_s": rate(ENTRIES),
        "push_batches_per_s": rate(BATCHES),
        "push_events_per_s": round(frames / span, 1),
        "pushed_ms": deliveries.latency().summary((50.0, 99.0)),
        "deliveries": deliveries.summary(),
        "errors": errors,
        "processes": sampler.report(),
    }


async def run_fanout(target: Target, params: FanoutParams) -> Result:
    run = uuid.uuid4().hex[:6]
    rows = [await _one_size(target, params, size, run) for size in params.sizes]
    return Result("fanout", asdict(params), rows, COLUMNS, {})
