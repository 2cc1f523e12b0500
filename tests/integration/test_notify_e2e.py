"""Offline push end to end on the local stack's own processes (spec 16.1.1 PD-1, 16.3, 16.6):
the stack's gateway (real AuthService), conversation, mailbox and notify workers, and the
APNs / FCM stand-ins, all started the way `qim up` starts them.

alice has a phone (token registered, then offline) and a desktop (token registered, online);
bob and carol send her messages. The phone is woken through the APNs stand-in with the badge
of alice's UserBadgeState; the desktop gets the socket and never a push; a read on the desktop
sends the phone a silent badge push of 0; a 410 deletes the phone's token and the digest
tombstone reaches the MailboxNode. A conversation alice muted (16.4) wakes the phone with no
alert, while its unread still counts and an unmuted conversation still alerts. An APNs outage
(503s for the phone) changes nothing in what alice's devices read (16.9, AT-121).
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from qim.auth.config import AuthConfig, load_keyring
from qim.auth.tokens import TokenCodec
from qim.client import QimClient
from qim.client.heartbeat import HeartbeatConfig
from qim.client.login import login_and_sync
from qim.devstack import procs
from qim.devstack.stack import Stack, WorkerSpec
from qim.params import Settings
from qim.schemas.records.notify import DeviceKey, decode_push_task
from qim.streams.topics import PUSH_TASKS

pytestmark = pytest.mark.integration

SETTINGS = Settings.load()
PHONE_TOKEN = "e1" * 32
DESKTOP_TOKEN = "e2" * 32
MUTED_PHONE_TOKEN = "e3" * 32
WAIT_S = 120.0


def _worker(stack: Stack, module: str) -> WorkerSpec:
    return next(w for w in stack.cfg.workers if w.module == module)


def _get(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def running(stack: Stack) -> Iterator[Stack]:
    """Stand-ins, the three workers and the gateway of the stack; stopped afterwards."""
    started: list[Callable[[], object]] = []
    try:
        stack.start_push_standins()
        started.append(stack.stop_push_standins)
        for module in ("qim.apps.conversation", "qim.apps.mailbox", "qim.apps.notify"):
            w = _worker(stack, module)
            stack.start_worker(w, timeout_s=180)
            started.append(functools.partial(stack.stop_worker, w))
        gw = stack.cfg.gateways[0]
        stack.start_gateway(gw)
        started.append(lambda: stack.stop_gateway(gw))
        mailbox = _worker(stack, "qim.apps.mailbox")
        shards = stack.cfg.partition_counts["mailbox_shard_count"]
        procs.wait_until(
            lambda: len(_get(mailbox.web_port, "/mailbox").get("serving", ())) == shards,
            timeout_s=WAIT_S,
            what="mailbox shards served",
        )
        yield stack
    finally:
        for stop in reversed(started):
            stop()


async def _until(check: Callable[[], Any], what: str) -> Any:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while True:
        got = await asyncio.to_thread(check)
        if got:
            return got
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.3)


class Scene:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.tenant = f"t{uuid.uuid4().hex[:10]}"
        env = stack.cfg.env()
        keyring, _ = load_keyring(env)
        self.codec = TokenCodec(keyring, clock_skew_ms=AuthConfig.from_env(env).clock_skew_ms)
        self.http = httpx.AsyncClient(timeout=30)
        self.clients: list[QimClient] = []
        self.mailbox = _worker(stack, "qim.apps.mailbox").web_port
        self.notify = _worker(stack, "qim.apps.notify").web_port

    def token(self, user: str, device: str) -> str:
        now = int(time.time() * 1000)
        return self.codec.issue_access(
            self.tenant, user, device, now_ms=now, ttl_ms=3_600_000
        ).token

    async def login(
        self, user: str, device: str, *, synced: bool = False
    ) -> tuple[QimClient, str, int]:
        """AUTH only, or (``synced``) AUTH and the login sync up to ONLINE_READY: only then
        does the gateway write pushes to the socket -- a device that is online for the
        second check (16.1.2), not one whose pushes wait behind the login barrier."""
        client = QimClient(heartbeat=HeartbeatConfig(enabled=False), request_timeout=20)
        token = self.token(user, device)
        url = self.stack.cfg.gateways[0].url
        if synced:
            result = await login_and_sync(client, url, token, device)
            self.clients.append(result.client)
            return result.client, token, result.auth_ok.session_epoch
        self.clients.append(client)
        ok = await client.connect(url, token, device)
        return client, token, ok.session_epoch

    async def register(self, token: str, device: str, epoch: int, push_token: str) -> None:
        body = {
            "device_id": device,
            "session_epoch": epoch,
            "provider": "APNS",
            "token": push_token,
            "bundle_env": "production",
        }
        resp = await self.http.post(
            f"http://127.0.0.1:{self.notify}/v1/device-tokens",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
        )
        assert resp.status_code == 200, resp.text

    def digests(self) -> int:
        return int(_get(self.mailbox, "/mailbox")["device_token_digests"])

    def online(self, user: str) -> list[str]:
        view = _get(self.mailbox, f"/mailbox/user?tenant={self.tenant}&user={user}")
        return sorted(d["device_id"] for d in view.get("devices", ()))

    async def received(self, token: str) -> list[dict[str, Any]]:
        url = f"{self.stack.cfg.push_standins.control_url}/received"
        got = (await self.http.get(url)).json()["received"]
        return [r for r in got if r["token"] == token]

    async def wait_received(self, token: str, count: int) -> list[dict[str, Any]]:
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while len(got := await self.received(token)) < count:
            assert asyncio.get_running_loop().time() < deadline, f"{len(got)} of {count} pushes"
            await asyncio.sleep(0.3)
        return got

    async def tasks_until(self, user: str, event_id: str, device: str) -> list[Any]:
        """alice's PushTasks in her partition up to the first of ``device`` for ``event_id``."""
        key = DeviceKey(self.tenant, user, device)
        partition = key.partition(
            virtual_bucket_count=SETTINGS.virtual_bucket_count,
            mailbox_shard_count=SETTINGS.mailbox_shard_count,
        )
        consumer = AIOKafkaConsumer(bootstrap_servers=self.stack.cfg.kafka.bootstrap)
        await consumer.start()
        tp = TopicPartition(PUSH_TASKS.name, partition)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        seen = []
        try:
            deadline = asyncio.get_running_loop().time() + WAIT_S
            while asyncio.get_running_loop().time() < deadline:
                for record in (await consumer.getmany(tp, timeout_ms=500)).get(tp, []):
                    task = decode_push_task(record.value)
                    if (task.tenant_id, task.user_id) != (self.tenant, user):
                        continue
                    seen.append(task)
                    if task.device_id == device and task.event_id == event_id:
                        return seen
            raise AssertionError(f"no PushTask {event_id} for {device}")
        finally:
            await consumer.stop()

    async def listed(
        self, client: QimClient, conversation_id: str, check: Callable[..., bool]
    ) -> Any:
        """PULL_SESSION_LIST until ``conversation_id``'s row passes ``check`` (server state)."""
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while True:
            rows = {
                e.conversation_id: e for e in (await client.pull_session_list(limit=50)).sessions
            }
            row = rows.get(conversation_id)
            if row is not None and check(row):
                return row
            assert asyncio.get_running_loop().time() < deadline, f"{conversation_id}: {row}"
            await asyncio.sleep(0.3)

    async def aclose(self) -> None:
        for c in self.clients:
            await c.close()
        await self.http.aclose()


async def test_offline_phone_is_woken_with_the_badge_and_the_online_desktop_never(
    running: Stack,
) -> None:
    scene = Scene(running)
    try:
        before = await asyncio.to_thread(scene.digests)
        phone, phone_token, phone_epoch = await scene.login("alice", "phone")
        await scene.register(phone_token, "phone", phone_epoch, PHONE_TOKEN)
        desktop, desktop_token, desktop_epoch = await scene.login("alice", "desktop", synced=True)
        await scene.register(desktop_token, "desktop", desktop_epoch, DESKTOP_TOKEN)
        await _until(lambda: scene.digests() >= before + 2, "digests never reached the node")
        await phone.close()  # the phone goes to the background: offline
        await _until(lambda: scene.online("alice") == ["desktop"], "phone still online")

        bob, _, _ = await scene.login("bob", "phone")
        first = await bob.send_direct("alice", b"hello", client_message_id="m1")
        [woke] = await scene.wait_received(PHONE_TOKEN, 1)
        assert woke["headers"]["apns-push-type"] == "alert"
        assert woke["payload"]["aps"]["badge"] == 1
        event = woke["payload"]["event_id"]

        carol, _, _ = await scene.login("carol", "phone")
        second = await carol.send_direct("alice", b"hi", client_message_id="m2")
        got = await scene.wait_received(PHONE_TOKEN, 2)
        assert got[1]["payload"]["aps"]["badge"] == 2
        # Barrier: every PushTask of alice up to the phone's second one (same partition,
        # in order): none is for the desktop, and the desktop's token was never pushed.
        tasks = await scene.tasks_until("alice", got[1]["payload"]["event_id"], "phone")
        assert {t.device_id for t in tasks} == {"phone"}
        assert [t.event_id for t in tasks if t.kind == "alert"][:1] == [event]
        assert await scene.received(DESKTOP_TOKEN) == []

        # A read of everything on the desktop: the offline phone gets a silent badge push of 0.
        await desktop.mark_read(desktop.direct_conversation_id("bob"), first.conversation_seq)
        await desktop.mark_read(desktop.direct_conversation_id("carol"), second.conversation_seq)
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while True:
            silent = [
                r
                for r in await scene.received(PHONE_TOKEN)
                if r["headers"]["apns-push-type"] == "background"
            ]
            if silent and silent[-1]["payload"]["aps"]["badge"] == 0:
                break
            assert asyncio.get_running_loop().time() < deadline, silent
            await asyncio.sleep(0.3)
        assert silent[-1]["payload"]["aps"]["content-available"] == 1
        assert "alert" not in silent[-1]["payload"]["aps"]

        # APNs says the phone's token is dead: deleted, and the tombstone reaches the node.
        plan = {"provider": "APNS", "token": PHONE_TOKEN, "answers": [410]}
        control = running.cfg.push_standins.control_url
        (await scene.http.post(f"{control}/plan", json=plan)).raise_for_status()
        count = len(await scene.received(PHONE_TOKEN))
        await bob.send_direct("alice", b"again", client_message_id="m3")
        dead = await scene.wait_received(PHONE_TOKEN, count + 1)
        assert dead[-1]["status"] == 410
        await _until(lambda: scene.digests() == before + 1, "tombstone never reached the node")
    finally:
        await scene.aclose()


async def test_a_muted_conversation_wakes_no_alert_while_its_unread_counts_and_others_alert(
    running: Stack,
) -> None:
    scene = Scene(running)
    try:
        before = await asyncio.to_thread(scene.digests)
        phone, phone_token, phone_epoch = await scene.login("alice", "phone")
        await scene.register(phone_token, "phone", phone_epoch, MUTED_PHONE_TOKEN)
        desktop, _, _ = await scene.login("alice", "desktop")
        await _until(lambda: scene.digests() >= before + 1, "digest never reached the node")
        await phone.close()
        await _until(lambda: scene.online("alice") == ["desktop"], "phone still online")
        with_bob = desktop.direct_conversation_id("bob")
        with_carol = desktop.direct_conversation_id("carol")

        def alerts(got: list[dict[str, Any]]) -> list[str]:
            return [
                r["payload"]["conversation_id"]
                for r in got
                if r["headers"]["apns-push-type"] == "alert"
            ]

        bob, _, _ = await scene.login("bob", "phone")
        await bob.send_direct("alice", b"before the mute", client_message_id="m1")
        await scene.wait_received(MUTED_PHONE_TOKEN, 1)
        assert alerts(await scene.received(MUTED_PHONE_TOKEN)) == [with_bob]

        # alice mutes bob on the desktop; the server's state says so before bob writes again.
        await desktop.mute(with_bob)
        await scene.listed(desktop, with_bob, lambda r: r.muted)
        await bob.send_direct("alice", b"while muted", client_message_id="m2")
        # Barrier: the muted message is materialized in alice's mailbox and counts unread.
        await scene.listed(desktop, with_bob, lambda r: r.unread_count == 2)

        carol, _, _ = await scene.login("carol", "phone")
        await carol.send_direct("alice", b"not muted", client_message_id="m3")
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while with_carol not in alerts(got := await scene.received(MUTED_PHONE_TOKEN)):
            assert asyncio.get_running_loop().time() < deadline, got
            await asyncio.sleep(0.3)
        assert alerts(got) == [with_bob, with_carol]  # nothing for the muted message
        woke = next(r for r in got if r["payload"].get("conversation_id") == with_carol)
        # include_muted_in_badge is off by default: bob's 2 unread count in muted_unread only.
        assert woke["payload"]["aps"]["badge"] == 1
        assert woke["payload"]["muted_unread"] == 2
        # Every PushTask of alice up to carol's alert (her partition, in order): the muted
        # message made no alert task, only silent badge ones.
        tasks = await scene.tasks_until("alice", woke["payload"]["event_id"], "phone")
        assert [t.conversation_id for t in tasks if t.kind == "alert"] == [with_bob, with_carol]

        # Unmuted again: bob's next message alerts.
        await desktop.mute(with_bob, muted=False)
        await scene.listed(desktop, with_bob, lambda r: not r.muted)
        await bob.send_direct("alice", b"after the mute", client_message_id="m4")
        while alerts(got := await scene.received(MUTED_PHONE_TOKEN)).count(with_bob) < 2:
            assert asyncio.get_running_loop().time() < deadline + WAIT_S, got
            await asyncio.sleep(0.3)
    finally:
        await scene.aclose()


OUTAGE_PHONE_TOKEN = "e4" * 32
OUTAGE_503S = 10
"""The outage: the APNs stand-in answers this many 503s to the phone's token, then 200 again.
Three pushes of 1 + ``push_retry_max_attempts`` attempts each would need 12 to all fail, so
some retries land after the outage and deliver, and some pushes may exhaust their retries:
the test accounts for both, whichever way the timing splits them."""


def _failed_pushes(port: int) -> float:
    """``offline_push_attempts{provider=APNS, kind=alert, outcome=failed}`` of the worker."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    labels = ('provider="APNS"', 'kind="alert"', 'outcome="failed"')
    for line in text.splitlines():
        if line.startswith("offline_push_attempts_total{") and all(x in line for x in labels):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_a_push_outage_changes_nothing_in_mailboxes_unread_or_the_session_list(
    running: Stack,
) -> None:
    """Spec 16 (first principle) and 16.9: with the push chain down, IM reliability, unread
    counts and the session list are unaffected; only the wake-up suffers (AT-121). alice's
    phone is offline with a token; APNs is down for the phone while bob and carol write to
    her; what alice's devices read is exactly what was sent, during and after the outage, and
    every push of the outage either was delivered by a retry or is counted as failed."""
    scene = Scene(running)
    try:
        before = await asyncio.to_thread(scene.digests)
        phone, phone_token, phone_epoch = await scene.login("alice", "phone")
        await scene.register(phone_token, "phone", phone_epoch, OUTAGE_PHONE_TOKEN)
        await _until(lambda: scene.digests() >= before + 1, "digest never reached the node")
        await phone.close()
        await _until(lambda: scene.online("alice") == [], "phone still online")
        failed_before = await asyncio.to_thread(_failed_pushes, scene.notify)
        plan = {"provider": "APNS", "token": OUTAGE_PHONE_TOKEN, "answers": [503] * OUTAGE_503S}
        control = running.cfg.push_standins.control_url
        (await scene.http.post(f"{control}/plan", json=plan)).raise_for_status()

        bob, _, _ = await scene.login("bob", "phone")
        carol, _, _ = await scene.login("carol", "phone")
        sent: dict[str, list[tuple[bytes, Any]]] = {"bob": [], "carol": []}
        for sender, client, body in (
            ("bob", bob, b"outage 1"),
            ("carol", carol, b"outage 2"),
            ("bob", bob, b"outage 3"),
        ):
            ack = await client.send_direct("alice", body, client_message_id=body.decode())
            sent[sender].append((body, ack))
        # The outage is on: the phone's first push was answered 503.
        first = await scene.wait_received(OUTAGE_PHONE_TOKEN, 1)
        assert first[0]["status"] == 503

        async def expect_state(extra: dict[str, list[tuple[bytes, Any]]]) -> None:
            """alice's state read by a fresh device: it must equal what was sent, computed
            here from the SEND_ACKs alone (no push involved)."""
            everything = {u: sent[u] + extra.get(u, []) for u in sent}
            reader, _, _ = await scene.login("alice", f"tablet-{uuid.uuid4().hex[:6]}")
            convs = {u: reader.direct_conversation_id(u) for u in everything}
            expected = {
                convs[u]: (len(msgs), msgs[-1][1].conversation_seq, msgs[-1][1].message_id)
                for u, msgs in everything.items()
            }
            # Barrier: both rows show the last message (the fan-out has materialized it).
            for conv, (_, seq, _) in expected.items():
                await scene.listed(reader, conv, lambda r, s=seq: r.latest_conversation_seq == s)
            rows = {
                e.conversation_id: e for e in (await reader.pull_session_list(limit=50)).sessions
            }
            assert set(rows) == set(expected)
            for conv, (unread, seq, message_id) in expected.items():
                row = rows[conv]
                assert (row.unread_count, row.latest_conversation_seq, row.last_message_id) == (
                    unread,
                    seq,
                    message_id,
                ), row
                assert row.read_conversation_seq == 0 and not row.muted
            batch = await reader.pull_mailbox(0)
            got = sorted(
                (e.conversation_id, e.conversation_seq, e.message_id, e.payload_or_ciphertext)
                for e in batch.entries
                if e.message_id in {a.message_id for m in everything.values() for _, a in m}
            )
            want = sorted(
                (convs[u], a.conversation_seq, a.message_id, body)
                for u, msgs in everything.items()
                for body, a in msgs
            )
            assert got == want
            await reader.close()
            # AUTH_OK of a fresh login carries the UserBadgeState the pushes carry (16.3).
            total = sum(len(m) for m in everything.values())
            badge_reader = QimClient(heartbeat=HeartbeatConfig(enabled=False), request_timeout=20)
            scene.clients.append(badge_reader)
            device = f"badge-{uuid.uuid4().hex[:6]}"
            ok = await badge_reader.connect(
                running.cfg.gateways[0].url, scene.token("alice", device), device
            )
            assert (ok.total_unread, ok.total_mention, ok.muted_unread) == (total, 0, 0)
            await badge_reader.close()

        await expect_state({})  # during the outage

        # Every push of the outage reaches its verdict: delivered by a later retry, or failed
        # after 1 + push_retry_max_attempts attempts (and counted by the failed metric).
        attempts_per_push = 1 + SETTINGS.push_retry_max_attempts
        deadline = asyncio.get_running_loop().time() + WAIT_S

        def verdicts(got: list[dict[str, Any]]) -> tuple[int, dict[str, list[int]]] | None:
            by_event: dict[str, list[int]] = {}
            for r in got:
                by_event.setdefault(r["payload"]["event_id"], []).append(r["status"])
            final = all(200 in s or len(s) == attempts_per_push for s in by_event.values())
            busy = sum(s.count(503) for s in by_event.values()) < OUTAGE_503S
            return None if busy or not final else (len(by_event), by_event)

        while True:
            got = await scene.received(OUTAGE_PHONE_TOKEN)
            done = verdicts(got)
            if done is not None:
                failed_now = await asyncio.to_thread(_failed_pushes, scene.notify)
                exhausted = [e for e, s in done[1].items() if 200 not in s]
                if failed_now - failed_before == len(exhausted):
                    break
            summary = [(r["payload"].get("event_id"), r["status"]) for r in got]
            assert asyncio.get_running_loop().time() < deadline, summary
            await asyncio.sleep(0.5)
        pushes, by_event = done
        print(f"outage verdicts: {by_event}")
        assert sum(s.count(503) for s in by_event.values()) == OUTAGE_503S
        for statuses in by_event.values():  # a 200 ends a push: nothing after it
            assert statuses.count(200) <= 1 and statuses[-1] in (200, 503), statuses
            assert len(statuses) <= attempts_per_push
        delivered = [r for r in got if r["status"] == 200]
        assert pushes == len(delivered) + len(exhausted) and pushes >= 2
        for r in delivered:  # a late delivery still carries an absolute badge from the state
            assert 1 <= r["payload"]["aps"]["badge"] <= 3

        await expect_state({})  # after the outage: nothing moved

        # The outage is over: the next message wakes the phone on the first attempt with the
        # badge of everything unread (the failed pushes did not lose a count).
        body = b"after the outage"
        ack = await carol.send_direct("alice", body, client_message_id="after")
        count = len(got)
        woke = (await scene.wait_received(OUTAGE_PHONE_TOKEN, count + 1))[count:]
        assert [r["status"] for r in woke] == [200]
        assert woke[0]["payload"]["aps"]["badge"] == 4
        await expect_state({"carol": [(body, ack)]})
    finally:
        await scene.aclose()
