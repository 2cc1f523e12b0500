"""Scenario ``push``: PushTasks through the NotificationService to the APNs stand-in (spec 16).

Measures what issue 17 names: PushTasks per second through ``faust -A qim.apps.notify
worker`` and the wake-up latency from the message's commit (the PushTask's ``committed_at``,
stamped when the task is produced, as the MailboxNode stamps the GroupDispatch's commit time)
to the stand-in's receipt of the push (its ``received_at_ms``, same host clock).

The PushTasks go to ``qim.push-tasks`` the way the MailboxNode produces them (key and explicit
partition of the device), so the mailbox side is not part of the number; device tokens are
registered as ``DeviceTokenCommand`` records on ``qim.device-token-commands`` (what the
management API produces after AUTH), sealed with the stack's key, and the run starts once
every device's ``device_token_digest`` record is published. Each task has its own conversation
so the merge window holds nothing back: every task is one push (an alert, or a silent badge
update past ``push_rate_per_user_per_min``, which is still a push). Open loop: each task has
an intended send time; latency is measured from it (a late producer shows as latency).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from qim.agents.notify.sealing import load_sealer
from qim.bench.histogram import Samples
from qim.bench.report import Column, Result
from qim.bench.schedule import run_open_loop, timetable
from qim.bench.target import Target
from qim.params import Settings
from qim.schemas.records.notify import DeviceKey, DeviceTokenCommand, PushTask, encode
from qim.streams.topics import DEVICE_TOKEN_COMMANDS, DEVICE_TOKEN_DIGEST, PUSH_TASKS

__all__ = ["PushParams", "run_push"]

COLUMNS = [
    Column("devices", "devices"),
    Column("offered tasks/s", "rate"),
    Column("tasks", "tasks"),
    Column("pushed", "pushed"),
    Column("PushTasks/s", "tasks_per_s"),
    Column("wake-up p50 ms", "wakeup_ms.p50"),
    Column("wake-up p99 ms", "wakeup_ms.p99"),
    Column("wake-up max ms", "wakeup_ms.max"),
    Column("producer late ms", "scheduler_late_ms"),
]


@dataclass(frozen=True)
class PushParams:
    devices: int = 50
    rates: tuple[float, ...] = (50.0, 100.0)
    duration_s: float = 10.0
    drain_s: float = 60.0
    tenant: str = "bench"


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _token(run: str, user: str) -> str:
    return uuid.uuid5(uuid.NAMESPACE_OID, f"{run}/{user}").hex * 2


class _Run:
    def __init__(self, target: Target, params: PushParams, tenant: str) -> None:
        self.target = target
        self.params = params
        self.tenant = tenant
        self.settings = Settings.load()
        self.users = [f"push-{i}" for i in range(params.devices)]
        self.tokens = {_token(tenant, u): u for u in self.users}
        self.producer = AIOKafkaProducer(
            bootstrap_servers=target.kafka_bootstrap, acks="all", linger_ms=2
        )
        self.http = httpx.AsyncClient(timeout=30)

    def key(self, user: str) -> DeviceKey:
        return DeviceKey(self.tenant, user, "phone")

    def partition(self, user: str) -> int:
        return self.key(user).partition(
            virtual_bucket_count=self.settings.virtual_bucket_count,
            mailbox_shard_count=self.settings.mailbox_shard_count,
        )

    async def register(self) -> None:
        sealer = load_sealer(self.target.env)
        now = _wall_ms()
        for user in self.users:
            key = self.key(user)
            token = _token(self.tenant, user)
            cmd = DeviceTokenCommand(
                request_id=f"bench-{self.tenant}-{user}",
                tenant_id=self.tenant,
                user_id=user,
                device_id="phone",
                provider="APNS",
                sealed_token=sealer.seal(token, key.encode()),
                token_fingerprint=sealer.fingerprint(token),
                at_ms=now,
            )
            await self.producer.send(
                DEVICE_TOKEN_COMMANDS.name,
                encode(cmd),
                key=key.encode(),
                partition=self.partition(user),
            )
        await self.producer.flush()
        await self._digests_published()

    async def _digests_published(self, timeout_s: float = 120.0) -> None:
        """Every device's digest record is in ``device_token_digest``: the service stored it."""
        wanted = {self.key(u).encode() for u in self.users}
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.target.kafka_bootstrap, enable_auto_commit=False
        )
        await consumer.start()
        try:
            tps = [
                TopicPartition(DEVICE_TOKEN_DIGEST.name, p)
                for p in sorted({self.partition(u) for u in self.users})
            ]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            deadline = asyncio.get_running_loop().time() + timeout_s
            while wanted:
                if asyncio.get_running_loop().time() > deadline:
                    raise RuntimeError(f"{len(wanted)} device tokens were never registered")
                for records in (await consumer.getmany(*tps, timeout_ms=500)).values():
                    for record in records:
                        if record.value is not None:
                            wanted.discard(record.key)
        finally:
            await consumer.stop()

    async def receipts(self) -> dict[str, int]:
        """event_id -> the first 200 receipt time of this run's tokens at the stand-in."""
        resp = await self.http.get(f"{self.target.push_control_url}/received")
        resp.raise_for_status()
        out: dict[str, int] = {}
        for r in resp.json()["received"]:
            if r.get("token") in self.tokens and r.get("status") == 200:
                event = str((r.get("payload") or {}).get("event_id", ""))
                if event and event not in out:
                    out[event] = int(r["received_at_ms"])
        return out

    async def step(self, index: int, rate: float) -> dict[str, Any]:
        times = timetable(rate, self.params.duration_s)
        loop = asyncio.get_running_loop()
        start_wall = _wall_ms() + 200
        start_mono = loop.time() + 0.2
        intended: dict[str, int] = {}
        sends: list[asyncio.Future[Any]] = []
        users = self.users

        def fire(n: int, at: float) -> None:
            user = users[n % len(users)]
            event = f"s{index}-e{n}"
            committed = start_wall + round((at - start_mono) * 1000)  # the intended time
            intended[event] = committed
            task = PushTask(
                tenant_id=self.tenant,
                user_id=user,
                device_id="phone",
                event_id=event,
                mailbox_seq=n + 1,
                conversation_id=f"c{index}-{n}",
                preview_or_placeholder="bench",
                total_unread=n + 1,
                badge_projection_mailbox_seq=n + 1,
                committed_at=committed,
            )
            sends.append(
                asyncio.ensure_future(
                    self.producer.send(
                        PUSH_TASKS.name,
                        encode(task),
                        key=self.key(user).encode(),
                        partition=self.partition(user),
                    )
                )
            )

        late = await run_open_loop(
            [start_mono + t for t in times], fire, clock=loop.time, sleep=asyncio.sleep
        )
        await asyncio.gather(*sends)
        await self.producer.flush()
        deadline = loop.time() + self.params.drain_s
        while True:
            got = {e: t for e, t in (await self.receipts()).items() if e in intended}
            if len(got) >= len(intended) or loop.time() > deadline:
                break
            await asyncio.sleep(0.25)
        wakeup = Samples(got[e] - intended[e] for e in got)
        first = min(intended.values(), default=start_wall)
        last = max(got.values(), default=first)
        span_s = max(0.001, (last - first) / 1000.0)
        return {
            "devices": len(users),
            "rate": rate,
            "tasks": len(intended),
            "pushed": len(got),
            "missing": len(intended) - len(got),
            "tasks_per_s": round(len(got) / span_s, 1),
            "wakeup_ms": wakeup.summary(),
            "scheduler_late_ms": round(late * 1000, 3),
        }

    async def aclose(self) -> None:
        await self.producer.stop()
        await self.http.aclose()


async def run_push(target: Target, params: PushParams) -> Result:
    if not target.push_control_url:
        raise RuntimeError("this target has no push stand-ins (qim up starts them)")
    tenant = f"{params.tenant}-push-{uuid.uuid4().hex[:8]}"
    run = _Run(target, params, tenant)
    await run.producer.start()
    try:
        await run.register()
        rows = [await run.step(i, rate) for i, rate in enumerate(params.rates)]
    finally:
        await run.aclose()
    best = max(rows, key=lambda r: r["tasks_per_s"]) if rows else None
    headline = (
        f"{best['tasks_per_s']} PushTasks/s at {best['rate']:g} offered; wake-up p99 "
        f"{best['wakeup_ms']['p99']} ms (commit -> stand-in receipt)"
        if best
        else ""
    )
    return Result(
        scenario="push",
        params=asdict(params) | {"tenant": tenant},
        rows=rows,
        columns=COLUMNS,
        data={},
        headline=headline,
    )
