"""Scenario ``rooms``: N connections in one chatroom, one sender at ``rate`` msg/s (spec 14).

Measures what 14.2 and 24.1.10 name: delivery latency (the RoomWriter's ``created_at`` ->
the event read by the client, same host clock), ROOM_BATCH frames per connection per second
(after the ConnectionNode's 100 ms merging; ``room_outbound_frame_rate`` is 10), how many
events each connection got of those sent (rooms may lose messages; the SDK replays gaps), the
sends refused by ``room_msg_rate``, and the CPU of every process (the gateway's above all).
The room is defined through ``qim.rooms`` first (``qim.admin.rooms``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from qim.admin.rooms import define_room
from qim.bench.histogram import Samples
from qim.bench.loadgen import Pacer, new_client
from qim.bench.procstats import ProcSampler
from qim.bench.report import Column, Result
from qim.bench.schedule import run_open_loop, timetable
from qim.bench.target import Target
from qim.client import QimClient, QimError
from qim.schemas.frames import RoomBatch
from qim.schemas.records.rooms import RoomDefinition

__all__ = ["RoomsParams", "run_rooms"]

COLUMNS = [
    Column("connections", "connections"),
    Column("msg/s", "rate"),
    Column("sent", "sent"),
    Column("refused", "refused"),
    Column("delivered %", "delivered_pct"),
    Column("delivery p50 ms", "delivery_ms.p50"),
    Column("delivery p99 ms", "delivery_ms.p99"),
    Column("frames/s/conn mean", "frames_per_s_mean"),
    Column("frames/s/conn max", "frames_per_s_max"),
    Column("gateway CPU %", "gateway_cpu_pct"),
    Column("sender late ms", "scheduler_late_ms"),
]


@dataclass(frozen=True)
class RoomsParams:
    connections: int = 2000
    rate: float = 20.0
    duration_s: float = 20.0
    tenant: str = "bench"
    connect_rate: float = 15.0  # per_ip_connect_rate is 20/s unless raised
    gateway: str = "gw-1"


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class _Member:
    client: QimClient
    events: int = 0
    frames_per_second: Counter[int] = field(default_factory=Counter)


async def _read(member: _Member, room: str, latency: Samples, stop: asyncio.Event) -> None:
    client = member.client
    while not stop.is_set():
        try:
            frame = await client.next_event(timeout=0.5)
        except TimeoutError:
            continue
        except Exception:
            return
        body = frame.body
        if not isinstance(body, RoomBatch) or body.room_id != room:
            continue
        member.frames_per_second[int(time.monotonic())] += 1
        got = await client.room_batch(body)
        now = _wall_ms()
        for event in got.events:
            latency.add(max(0, now - event.created_at))
        member.events += len(got.events)


async def run_rooms(target: Target, params: RoomsParams) -> Result:
    run = uuid.uuid4().hex[:6]
    room = f"r:bench-{run}"
    await define_room(target.kafka_bootstrap, RoomDefinition(tenant_id=params.tenant, room_id=room))
    pacer = Pacer(params.connect_rate)

    async def connect(i: int) -> QimClient:
        await pacer.wait()
        client = new_client(heartbeat=True)
        user = f"room{run}x{i}"
        await client.connect(target.ws_url, target.token(params.tenant, user, "room"), "room")
        await client.join_room(room)
        return client

    outcomes = await asyncio.gather(
        *(connect(i) for i in range(params.connections)), return_exceptions=True
    )
    members = [_Member(c) for c in outcomes if isinstance(c, QimClient)]
    failed = params.connections - len(members)
    errors = Counter(
        f"{type(o).__name__}: {o}"[:120] for o in outcomes if isinstance(o, BaseException)
    )
    latency, stop = Samples(), asyncio.Event()
    readers = [asyncio.create_task(_read(m, room, latency, stop)) for m in members]
    sent, refused, pending, late_s = 0, 0, [], 0.0
    refusals: Counter[str] = Counter()
    try:
        if not members:
            raise RuntimeError(f"no connection joined {room}: {outcomes[:1]!r}")
        sender = members[0].client

        async def one(i: int) -> None:
            nonlocal sent, refused
            try:
                await sender.send_room(room, f"m{i}".encode())
                sent += 1
            except QimError as exc:
                refused += 1
                refusals[f"{exc.name}: {exc.detail}"] += 1

        def fire(i: int, _intended: float) -> None:
            pending.append(asyncio.create_task(one(i)))

        sampler = ProcSampler(target.pids())
        async with sampler.running():
            times = timetable(params.rate, params.duration_s, time.monotonic() + 0.5)
            late_s = await run_open_loop(times, fire, clock=time.monotonic, sleep=asyncio.sleep)
            await asyncio.gather(*pending, return_exceptions=True)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while loop.time() < deadline and any(m.events < sent for m in members):  # noqa: ASYNC110  # bounded poll of the readers
                await asyncio.sleep(0.2)
        report = sampler.report()
    finally:
        stop.set()
        await asyncio.gather(*readers, return_exceptions=True)
        await asyncio.gather(*(m.client.close() for m in members), return_exceptions=True)
    got = sum(m.events for m in members)
    seconds = max(1.0, params.duration_s)
    per_conn_max = [max(m.frames_per_second.values(), default=0) for m in members]
    frames = sum(sum(m.frames_per_second.values()) for m in members)
    row: dict[str, Any] = {
        "connections": len(members),
        "failed": failed,
        "connect_errors": dict(errors.most_common(3)),
        "rate": params.rate,
        "sent": sent,
        "refused": refused,
        "refusals": dict(refusals),
        "scheduler_late_ms": round(late_s * 1000, 1),
        "delivered_pct": round(100 * got / (sent * len(members)), 2) if sent and members else None,
        "delivery_ms": latency.summary(),
        "frames_per_s_mean": round(frames / len(members) / seconds, 2) if members else None,
        "frames_per_s_max": max(per_conn_max, default=None),
        "gateway_cpu_pct": report.get(params.gateway, {}).get("cpu_pct"),
        "processes": report,
    }
    return Result("rooms", asdict(params), [row], COLUMNS, {})
