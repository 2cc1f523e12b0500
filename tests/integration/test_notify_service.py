"""The NotificationService on the real stack: `faust -A qim.apps.notify worker`, the suite's
Kafka and Redis, and the APNs / FCM stand-ins as a process (`qim push-standins`), the same way
the local stack runs them (spec 16.2, 16.3, 16.5, 16.6; issue 17).

Registration goes through the HTTP management API after a real AUTH (AuthService against the
suite's Redis gives the device its session_epoch, as the gateway's AUTH does). PushTasks are
produced to ``qim.push-tasks`` the way the MailboxNode does. Every "nothing happened" check
waits for a later positive barrier in the same partition (same user), never for a quiet time.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from redis.asyncio import Redis

from qim.agents.notify.sealing import load_sealer
from qim.auth.config import AuthConfig, load_keyring
from qim.auth.service import AuthService
from qim.bench.scenarios.push import PushParams, run_push
from qim.bench.target import Target
from qim.core.notify.rules import collapse_id
from qim.core.notify.tokens import DAY_MS
from qim.devstack.stack import Stack
from qim.params import Settings
from qim.schemas.records.notify import (
    DeviceKey,
    DeviceTokenCommand,
    PushTask,
    decode_digest,
    encode,
)
from qim.streams.topics import DEVICE_TOKEN_COMMANDS, DEVICE_TOKEN_DIGEST, PUSH_TASKS
from tests.integration.workers import FaustWorker

pytestmark = pytest.mark.integration

APNS_TOKEN = "ab" * 32
MAX_INFLIGHT = 4
SETTINGS = Settings.load()


def _partition(key: DeviceKey) -> int:
    return key.partition(
        virtual_bucket_count=SETTINGS.virtual_bucket_count,
        mailbox_shard_count=SETTINGS.mailbox_shard_count,
    )


@pytest.fixture(scope="module")
def notify_worker(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaustWorker]:
    stack.start_push_standins()
    # The 16.6 GC sweeps every second here (hourly by default): only tokens idle for 90 days
    # are touched, which no other test of the module registers.
    # MAX_INFLIGHT bounds what the kill -9 test may lose (the pushes in flight at the kill).
    env = {"QIM_NOTIFY_TOKEN_GC_INTERVAL_S": "1", "QIM_NOTIFY_MAX_INFLIGHT": str(MAX_INFLIGHT)}
    worker = FaustWorker(stack, "qim.apps.notify", tmp_path_factory.mktemp("notify"), env)
    try:
        worker.start()
        yield worker
    finally:
        worker.stop()
        stack.stop_push_standins()


class Harness:
    """One test's tenant: AUTH, the HTTP API, PushTasks, the digest topic, the stand-ins."""

    def __init__(self, stack: Stack, worker: FaustWorker, auth: AuthService) -> None:
        self.stack = stack
        self.worker = worker
        self.auth = auth
        self.tenant = f"t{uuid.uuid4().hex[:10]}"
        self.http = httpx.AsyncClient(timeout=30)
        self.producer = AIOKafkaProducer(bootstrap_servers=stack.cfg.kafka.bootstrap, acks="all")

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.worker.web_port}/v1/device-tokens"

    @property
    def control(self) -> str:
        return self.stack.cfg.push_standins.control_url

    async def login(self, user: str, device: str, *, bind: bool = True) -> tuple[str, int]:
        """An access token and the session_epoch of a real AUTH of ``device``."""
        token = await self.auth.issue_token(self.tenant, user, device if bind else None)
        grant = await self.auth.authenticate(token, device, "1.0.0")
        return token, grant.session_epoch

    async def register(self, access: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        resp = await self.http.post(
            self.api, json=body, headers={"Authorization": f"Bearer {access}"}
        )
        return resp.status_code, resp.json()

    async def push(self, user: str, device: str, **fields: Any) -> None:
        key = DeviceKey(self.tenant, user, device)
        task = PushTask(tenant_id=self.tenant, user_id=user, device_id=device, **fields)
        await self.producer.send_and_wait(
            PUSH_TASKS.name, encode(task), key=key.encode(), partition=_partition(key)
        )

    async def plan(self, provider: str, token: str, answers: list[int]) -> None:
        body = {"provider": provider, "token": token, "answers": answers}
        (await self.http.post(f"{self.control}/plan", json=body)).raise_for_status()

    async def received(self, token: str) -> list[dict[str, Any]]:
        resp = await self.http.get(f"{self.control}/received")
        return [r for r in resp.json()["received"] if r["token"] == token]

    async def wait_received(self, token: str, count: int, timeout_s: float = 90) -> list[Any]:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            got = await self.received(token)
            if len(got) >= count:
                return got
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"stand-in got {len(got)} of {count} pushes for {token}")
            await asyncio.sleep(0.2)

    async def digests(
        self, key: DeviceKey, until: DeviceKey, *, tombstone: bool = False
    ) -> list[bytes | None]:
        """Every digest value of ``key`` in its partition up to the first record of ``until``
        (a tombstone of ``until`` if ``tombstone``): the positive barrier."""
        partition = _partition(key)
        assert partition == _partition(until), "the barrier must share the partition"
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.stack.cfg.kafka.bootstrap, enable_auto_commit=False
        )
        await consumer.start()
        tp = TopicPartition(DEVICE_TOKEN_DIGEST.name, partition)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        seen: list[bytes | None] = []
        try:
            deadline = asyncio.get_running_loop().time() + 90
            while asyncio.get_running_loop().time() < deadline:
                batch = await consumer.getmany(tp, timeout_ms=500)
                for record in batch.get(tp, []):
                    if record.key == key.encode():
                        seen.append(record.value)
                    if record.key == until.encode() and (record.value is None) == tombstone:
                        return seen
            raise AssertionError("the barrier's digest record never came")
        finally:
            await consumer.stop()

    async def aclose(self) -> None:
        await self.http.aclose()
        await self.producer.stop()


@pytest.fixture
async def harness(stack: Stack, notify_worker: FaustWorker) -> AsyncIterator[Harness]:
    env = stack.cfg.env()
    keyring, _ = load_keyring(env)
    redis = Redis.from_url(stack.cfg.redis.url)
    h = Harness(stack, notify_worker, AuthService(redis, keyring, AuthConfig.from_env(env)))
    await h.producer.start()
    try:
        yield h
    finally:
        await h.aclose()
        await redis.aclose()


def _apns(device: str, epoch: int, token: str = APNS_TOKEN, **extra: Any) -> dict[str, Any]:
    return {
        "device_id": device,
        "session_epoch": epoch,
        "provider": "APNS",
        "token": token,
        "bundle_env": "production",
        **extra,
    }


async def test_registered_apns_device_gets_the_push_with_headers_and_absolute_badge(
    harness: Harness,
) -> None:
    h = harness
    token = "a1" * 32
    access, epoch = await h.login("alice", "phone")
    status, body = await h.register(access, _apns("phone", epoch, token))
    assert status == 200, body
    key = DeviceKey(h.tenant, "alice", "phone")
    digests = await h.digests(key, key)
    raw = digests[-1]
    assert raw is not None
    digest = decode_digest(raw)
    assert digest is not None and digest.provider == "APNS" and digest.bundle_env_valid
    # no token and no ciphertext: the record has only the digest's own fields
    assert set(msgspec.msgpack.decode(raw)) <= {"provider", "capabilities", "bundle_env"}
    assert token.encode() not in raw and bytes.fromhex(token) not in raw

    await h.push(
        "alice", "phone", event_id="e1", mailbox_seq=7, conversation_id="g1",
        message_id="m1", preview_or_placeholder="hi", total_unread=5, total_mention=1,
        muted_unread=2, badge_projection_mailbox_seq=7,
    )  # fmt: skip
    [got] = await h.wait_received(token, 1)
    assert got["endpoint"] == "production"
    assert got["headers"]["apns-push-type"] == "alert"
    assert got["headers"]["apns-topic"] == "im.qim.dev"
    assert got["headers"]["apns-collapse-id"] == collapse_id("g1")
    assert got["payload"]["aps"]["badge"] == 5
    assert got["payload"]["badge_projection_mailbox_seq"] == 7
    assert got["payload"]["muted_unread"] == 2


async def test_refused_registrations_store_nothing(harness: Harness) -> None:
    h = harness
    access, epoch = await h.login("bob", "phone")
    other_tenant_body = _apns("phone", epoch, tenant_id="someone-else")
    cases = [
        (_apns("phone", epoch, user_id="mallory"), 403, "other_user"),
        (other_tenant_body, 403, "other_tenant"),
        (_apns("desktop", epoch), 403, "device_mismatch"),
        ({**_apns("phone", epoch), "provider": "PIGEON"}, 400, "unknown_provider"),
        (_apns("phone", epoch, token="not-hex"), 400, "malformed_token"),
        (_apns("phone", epoch + 1), 403, "not_authenticated_on_a_connection"),
    ]
    for body, status, detail in cases:
        got_status, answer = await h.register(access, body)
        assert (got_status, answer["error"], answer["detail"]) == (
            status,
            "PERMISSION_DENIED",
            detail,
        ), body
        assert answer["request_id"]
    # A device-less token may register only the device of its current connection.
    loose, loose_epoch = await h.login("bob", "tablet", bind=False)
    status, answer = await h.register(loose, _apns("watch", loose_epoch))
    assert (status, answer["detail"]) == (403, "not_authenticated_on_a_connection")
    # Barrier: a valid registration of bob's tablet (same partition) is stored after them.
    status, _ = await h.register(loose, _apns("tablet", loose_epoch))
    assert status == 200
    phone = DeviceKey(h.tenant, "bob", "phone")
    assert await h.digests(phone, DeviceKey(h.tenant, "bob", "tablet")) == []
    watch = DeviceKey(h.tenant, "bob", "watch")
    assert await h.digests(watch, DeviceKey(h.tenant, "bob", "tablet")) == []


async def test_apns_410_deletes_the_token_and_publishes_a_tombstone(harness: Harness) -> None:
    h = harness
    token = "b2" * 32
    access, epoch = await h.login("carol", "phone")
    assert (await h.register(access, _apns("phone", epoch, token)))[0] == 200
    key = DeviceKey(h.tenant, "carol", "phone")
    await h.digests(key, key)
    await h.plan("APNS", token, [410])
    await h.push(
        "carol", "phone", event_id="e1", mailbox_seq=1, conversation_id="c", total_unread=1
    )
    [got] = await h.wait_received(token, 1)
    assert (got["status"], got["reason"]) == (410, "Unregistered")
    values = await h.digests(key, key, tombstone=True)
    assert values[-1] is None
    # A later task for the deleted device reaches no provider; a later push of another device
    # of carol (same partition, processed after it) is the barrier.
    other = "c3" * 32
    access2, epoch2 = await h.login("carol", "ipad")
    assert (await h.register(access2, _apns("ipad", epoch2, other)))[0] == 200
    await h.digests(DeviceKey(h.tenant, "carol", "ipad"), DeviceKey(h.tenant, "carol", "ipad"))
    await h.push("carol", "phone", event_id="e2", mailbox_seq=2, conversation_id="c")
    await h.push("carol", "ipad", event_id="e2", mailbox_seq=2, conversation_id="c")
    await h.wait_received(other, 1)
    assert len(await h.received(token)) == 1


async def test_apns_503_is_retried_and_the_token_kept(harness: Harness) -> None:
    h = harness
    token = "d4" * 32
    access, epoch = await h.login("dave", "phone")
    assert (await h.register(access, _apns("phone", epoch, token)))[0] == 200
    key = DeviceKey(h.tenant, "dave", "phone")
    await h.digests(key, key)
    await h.plan("APNS", token, [503, 500])
    await h.push("dave", "phone", event_id="e1", mailbox_seq=1, conversation_id="c", total_unread=3)
    got = await h.wait_received(token, 3)
    assert [g["status"] for g in got] == [503, 500, 200]
    assert all(g["payload"]["aps"]["badge"] == 3 for g in got)
    # the token is kept: the next push (another conversation, no merge) is delivered
    await h.push("dave", "phone", event_id="e2", mailbox_seq=2, conversation_id="d")
    got = await h.wait_received(token, 4)
    assert got[-1]["status"] == 200
    assert all(v is not None for v in await h.digests(key, key))


async def test_fcm_device_gets_the_push_with_oauth_bearer_and_notification_count(
    harness: Harness,
) -> None:
    h = harness
    token = "fcm-" + "x" * 60
    access, epoch = await h.login("erin", "android")
    body = {"device_id": "android", "session_epoch": epoch, "provider": "FCM", "token": token}
    assert (await h.register(access, body))[0] == 200
    key = DeviceKey(h.tenant, "erin", "android")
    await h.digests(key, key)
    await h.push(
        "erin", "android", event_id="e1", mailbox_seq=4, conversation_id="c", total_unread=9
    )
    [got] = await h.wait_received(token, 1)
    message = got["payload"]["message"]
    assert got["status"] == 200
    assert message["android"]["notification"]["notification_count"] == 9
    assert message["android"]["collapse_key"] == collapse_id("c")
    assert message["data"]["badge_projection_mailbox_seq"] == "0"


def test_the_stack_declares_the_notify_worker_and_standins(stack: Stack) -> None:
    assert any(w.module == "qim.apps.notify" for w in stack.cfg.workers)
    assert Path(stack.cfg.env()["QIM_APNS_CA_FILE"]).name == "standin-cert.pem"


async def _registered(h: Harness, user: str, token: str) -> None:
    access, epoch = await h.login(user, "phone")
    assert (await h.register(access, _apns("phone", epoch, token)))[0] == 200
    key = DeviceKey(h.tenant, user, "phone")
    await h.digests(key, key)


async def test_ten_messages_in_one_window_make_one_immediate_and_one_merged_notification(
    harness: Harness,
) -> None:
    h = harness
    token = "f5" * 32
    await _registered(h, "frank", token)
    for i in range(10):
        await h.push(
            "frank", "phone", event_id=f"e{i}", mailbox_seq=i + 1, conversation_id="g",
            total_unread=i + 1, badge_projection_mailbox_seq=i + 1,
        )  # fmt: skip
    await h.push("frank", "phone", event_id="e0", mailbox_seq=1, conversation_id="g")  # a replay
    got = await h.wait_received(token, 2)
    first, merged = got[0]["payload"], got[1]["payload"]
    assert first["aps"]["alert"]["body"] == "New message" and first["aps"]["badge"] == 1
    assert merged["aps"]["alert"]["body"] == "9 new messages" and merged["aps"]["badge"] == 10
    assert got[0]["headers"]["apns-collapse-id"] == got[1]["headers"]["apns-collapse-id"]
    # the merged one came after the replay of e0 was consumed: nothing else was sent
    assert len(await h.received(token)) == 2


async def test_the_eleventh_alert_in_a_minute_becomes_a_silent_badge_update(
    harness: Harness,
) -> None:
    h = harness
    token = "a6" * 32
    await _registered(h, "gina", token)
    for i in range(11):
        await h.push(
            "gina", "phone", event_id=f"e{i}", mailbox_seq=i + 1, conversation_id=f"c{i}",
            total_unread=i + 1, badge_projection_mailbox_seq=i + 1,
        )  # fmt: skip
    got = await h.wait_received(token, 11)
    # the 11 deliveries run concurrently: compare as a set, not in arrival order
    silent = [g for g in got if g["headers"]["apns-push-type"] == "background"]
    assert len(silent) == 1 and len(got) == 11
    assert silent[0]["payload"]["aps"] == {"badge": 11, "content-available": 1}
    assert silent[0]["payload"]["event_id"] == "e10"


async def test_fcm_unregistered_deletes_the_token_and_publishes_a_tombstone(
    harness: Harness,
) -> None:
    h = harness
    token = "fcm-" + "u" * 60
    access, epoch = await h.login("frank", "android")
    body = {"device_id": "android", "session_epoch": epoch, "provider": "FCM", "token": token}
    assert (await h.register(access, body))[0] == 200
    key = DeviceKey(h.tenant, "frank", "android")
    await h.digests(key, key)
    await h.plan("FCM", token, [404])
    await h.push("frank", "android", event_id="e1", mailbox_seq=1, conversation_id="c")
    [got] = await h.wait_received(token, 1)
    assert got["status"] == 404
    assert (await h.digests(key, key, tombstone=True))[-1] is None


async def test_a_token_idle_past_push_token_inactive_days_is_collected(harness: Harness) -> None:
    h = harness
    fresh = "f6" * 32
    access, epoch = await h.login("gina", "ipad")
    assert (await h.register(access, _apns("ipad", epoch, fresh)))[0] == 200
    fresh_key = DeviceKey(h.tenant, "gina", "ipad")
    await h.digests(fresh_key, fresh_key)
    # A phone whose token last succeeded 91 days ago: registered as the API would, back-dated.
    old_key = DeviceKey(h.tenant, "gina", "phone")
    assert _partition(old_key) == _partition(fresh_key)
    sealer = load_sealer(h.stack.cfg.env())
    now_ms = int(time.time() * 1000)
    old = DeviceTokenCommand(
        request_id="r-old",
        tenant_id=h.tenant,
        user_id="gina",
        device_id="phone",
        provider="APNS",
        sealed_token=sealer.seal("f7" * 32, old_key.encode()),
        token_fingerprint=sealer.fingerprint("f7" * 32),
        at_ms=now_ms - 91 * DAY_MS,
    )
    await h.producer.send_and_wait(
        DEVICE_TOKEN_COMMANDS.name, encode(old), key=old_key.encode(), partition=_partition(old_key)
    )
    values = await h.digests(old_key, old_key, tombstone=True)
    assert values[0] is not None and values[-1] is None  # registered, then collected
    # The fresh token is kept: a push to it after the tombstone is delivered.
    await h.push("gina", "ipad", event_id="e1", mailbox_seq=1, conversation_id="c")
    [got] = await h.wait_received(fresh, 1)
    assert got["status"] == 200


async def test_the_push_bench_scenario_runs_at_a_tiny_size(
    stack: Stack, notify_worker: FaustWorker
) -> None:
    """``qim bench push`` against this stack: every PushTask becomes one push the stand-in
    received, with a wake-up latency measured from its commit."""
    params = PushParams(devices=4, rates=(20.0,), duration_s=1.0, drain_s=90.0)
    result = await run_push(Target.from_stack(stack.cfg), params)
    [row] = result.rows
    assert (row["tasks"], row["pushed"], row["missing"]) == (20, 20, 0), row
    assert row["tasks_per_s"] > 0
    wakeup = row["wakeup_ms"]
    assert wakeup["count"] == 20 and 0 <= wakeup["min"] <= wakeup["p99"] <= wakeup["max"]
    assert "PushTasks/s" in result.to_markdown("now") and result.headline


BURST_DEVICES = 60


def _task_metrics(port: int) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return [
            x
            for x in r.read().decode().splitlines()
            if x.startswith(("notify_push_tasks_total", "offline_push_attempts_total"))
        ]


BURST_PARTITIONS = 2


async def test_a_worker_kill_during_a_burst_produces_no_duplicate_notification(
    harness: Harness, notify_worker: FaustWorker
) -> None:
    """16.2.4 / AT-108: ``push_dedup_ttl`` keyed (device_token, event_id) survives a kill -9.

    60 phones (one alert each, so no merge window or rate limit is involved) in two
    partitions; their PushTasks are produced as a burst and the worker is SIGKILLed once a
    third of them reached the stand-in, then restarted on its datadir. It replays from the
    last committed offset; the dedup set it recovers from the changelog must cover every push
    that already left, and only the pushes in flight at the kill may be lost. Barrier: one
    later task per partition, produced after the restart and delivered after every replayed
    task of its partition."""
    h = harness
    sealer = load_sealer(h.stack.cfg.env())
    now_ms = int(time.time() * 1000)
    wanted = sorted({_partition(DeviceKey(h.tenant, f"u{i}", "phone")) for i in range(400)})
    partitions = set(wanted[:BURST_PARTITIONS])
    users = [u for i in range(20_000) if _partition(DeviceKey(h.tenant, u := f"u{i}", "phone"))
             in partitions]  # fmt: skip
    burst, barriers = users[:BURST_DEVICES], []
    for p in sorted(partitions):  # one barrier device per partition, after the burst's users
        barriers.append(next(u for u in users[BURST_DEVICES:] if _partition(
            DeviceKey(h.tenant, u, "phone")) == p))  # fmt: skip

    def token_of(user: str) -> str:
        return uuid.uuid5(uuid.NAMESPACE_OID, f"{h.tenant}/{user}").hex * 2

    for user in burst + barriers:
        key = DeviceKey(h.tenant, user, "phone")
        cmd = DeviceTokenCommand(
            request_id=f"r-{user}",
            tenant_id=h.tenant,
            user_id=user,
            device_id="phone",
            provider="APNS",
            sealed_token=sealer.seal(token_of(user), key.encode()),
            token_fingerprint=sealer.fingerprint(token_of(user)),
            at_ms=now_ms,
        )
        await h.producer.send_and_wait(
            DEVICE_TOKEN_COMMANDS.name, encode(cmd), key=key.encode(), partition=_partition(key)
        )
    # Barrier: the last registration of each partition is in the digest topic (in order).
    for p in sorted(partitions):
        last = [u for u in burst + barriers if _partition(DeviceKey(h.tenant, u, "phone")) == p]
        final = DeviceKey(h.tenant, last[-1], "phone")
        await h.digests(final, final)

    tokens = {token_of(u): u for u in burst + barriers}

    async def receipts() -> list[tuple[str, str]]:
        resp = await h.http.get(f"{h.control}/received")
        return [
            (r["token"], r["payload"]["event_id"])
            for r in resp.json()["received"]
            if r["token"] in tokens and r["status"] == 200
        ]

    async def produce_burst() -> None:
        for n, user in enumerate(burst):
            await h.push(
                user, "phone", event_id=f"burst-{user}", mailbox_seq=n + 1,
                conversation_id=f"c-{user}", total_unread=1, badge_projection_mailbox_seq=n + 1,
            )  # fmt: skip
            await asyncio.sleep(0.02)

    producing = asyncio.create_task(produce_burst())
    deadline = asyncio.get_running_loop().time() + 90
    while len(await receipts()) < BURST_DEVICES // 3:
        assert asyncio.get_running_loop().time() < deadline, await receipts()
        await asyncio.sleep(0.05)
    await asyncio.to_thread(notify_worker.kill)
    before_restart = len(await receipts())
    await producing
    await asyncio.to_thread(notify_worker.start)
    for n, user in enumerate(barriers):
        await h.push(
            user, "phone", event_id=f"barrier-{user}", mailbox_seq=1000 + n,
            conversation_id="c-barrier", total_unread=1,
        )  # fmt: skip
    barrier_tokens = {token_of(u) for u in barriers}
    deadline = asyncio.get_running_loop().time() + 180
    while True:
        got = await receipts()
        if barrier_tokens <= {t for t, _ in got}:
            status = notify_worker.get("/notify")
            if status["deliveries_in_flight"] == 0:
                break
        assert asyncio.get_running_loop().time() < deadline, notify_worker.log_tail()
        await asyncio.sleep(0.2)
    got = await receipts()
    counts: dict[tuple[str, str], int] = {}
    for pair in got:
        counts[pair] = counts.get(pair, 0) + 1
    duplicates = {pair: n for pair, n in counts.items() if n > 1}
    assert duplicates == {}, duplicates
    delivered = {tokens[t] for t, e in counts if e.startswith("burst-")}
    lost = sorted(set(burst) - delivered)
    print(f"kill at {before_restart} receipts; delivered {len(delivered)}, lost {lost}")
    # At-most-once for the pushes in flight at the kill (their dedup state was durable, the
    # provider had not answered): never more than the worker's delivery slots. Every other
    # push of the burst is delivered exactly once, by the old worker or by the replay.
    metrics = await asyncio.to_thread(_task_metrics, notify_worker.web_port)
    print("\n".join(metrics))
    assert len(lost) <= MAX_INFLIGHT, (lost, metrics, notify_worker.log_tail(200))
    assert len(delivered) + len(lost) == BURST_DEVICES
