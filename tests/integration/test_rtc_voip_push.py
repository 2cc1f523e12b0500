"""A call to a callee with no online device becomes a VoIP push (issue 17 / 16, spec 13.5.2,
AT-64), on the real stack: two gateways, the conversation and mailbox workers, the
NotificationService (``faust -A qim.apps.notify worker``, ``rtc_voip_push_daily_quota`` = 2
here) and the APNs stand-in.

bob is offline with an APNs phone registered (alert token + PushKit ``voip_token``). alice's
INVITE goes caller's gateway -> ConversationWriter (membership) -> bob's gateway, which finds
no connection and hands a ``voip`` PushTask to ``qim.push-tasks``; the stand-in gets ONE push
of type voip, priority 10, on the ``.voip`` topic, to the PushKit token, with the call and no
badge. The woken phone connects and ACCEPTs on the online path. A second call is pushed and,
unanswered, ends with ``cancel{timeout}`` for alice (the ring continues while the push is out:
topology.md decision 34). The third call is over the quota: no push, and alice is answered
``cancel{reason=offline}``; a later call to dave (same NotificationService partition) is the
positive barrier that nothing for bob's third call reached the stand-in (dave's Android phone:
an FCM high-priority data message). A callee whose device
registered no ``voip`` capability is answered ``offline`` and pushed nothing. Afterwards bob's
mailbox, session list and unread hold only the real messages.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from qim.auth.config import AuthConfig, load_keyring
from qim.auth.service import AuthService
from qim.client import QimClient
from qim.devstack.push_standins import APNS_TOPIC
from qim.devstack.stack import Stack
from qim.params import Settings
from qim.schemas.frames import Frame
from qim.schemas.frames.rtc import RtcSignalDown
from tests.integration.device_support import eventually
from tests.integration.mailbox_support import Client as MailboxProbe
from tests.integration.realtime_support import collect_until, nodes, pipeline, user_on
from tests.integration.workers import FaustWorker

pytestmark = pytest.mark.integration

RING_MS = 12_000
SETTINGS = Settings.load(
    overrides={
        "per_ip_connect_rate": {"count": 100_000, "period_ms": 1000},
        "rtc_ring_timeout": RING_MS,
    },
    env={},
)
BOB_ALERT, BOB_VOIP = "b1" * 32, "b2" * 32
DAVE_FCM = "dave-fcm-" + "d" * 40
CAROL_ALERT = "c1" * 32


@pytest.fixture(scope="module")
def notify_worker(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaustWorker]:
    stack.start_push_standins()
    env = {"QIM_RTC_VOIP_PUSH_DAILY_QUOTA": "2"}
    worker = FaustWorker(stack, "qim.apps.notify", tmp_path_factory.mktemp("notify-voip"), env)
    try:
        worker.start()
        yield worker
    finally:
        worker.stop()
        stack.stop_push_standins()


class Pushes:
    """Registration over the notify HTTP API after a real AUTH, and the APNs stand-in's log."""

    def __init__(self, stack: Stack, worker: FaustWorker, auth: AuthService) -> None:
        self.stack, self.worker, self.auth = stack, worker, auth
        self.http = httpx.AsyncClient(timeout=90)  # a loaded box: generous

    async def register(self, tenant: str, user: str, device: str, **body: Any) -> None:
        access = await self.auth.issue_token(tenant, user, device)
        grant = await self.auth.authenticate(access, device, "1.0.0")
        resp = await self.http.post(
            f"http://127.0.0.1:{self.worker.web_port}/v1/device-tokens",
            json={
                "device_id": device,
                "session_epoch": grant.session_epoch,
                "provider": "APNS",
                "bundle_env": "production",
                **body,
            },
            headers={"Authorization": f"Bearer {access}"},
        )
        assert resp.status_code == 200, resp.text

    async def received(self, token: str) -> list[dict[str, Any]]:
        resp = await self.http.get(f"{self.stack.cfg.push_standins.control_url}/received")
        return [r for r in resp.json()["received"] if r["token"] == token]

    async def wait_received(self, token: str, count: int) -> list[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 90
        while len(got := await self.received(token)) < count:
            assert loop.time() < deadline, f"the stand-in got {len(got)} of {count} for {token}"
            await asyncio.sleep(0.2)
        return got

    async def counter(self, name: str, **labels: str) -> float:
        resp = await self.http.get(f"http://127.0.0.1:{self.worker.web_port}/metrics")
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in resp.text.splitlines():
            m = re.fullmatch(rf"{re.escape(name)}\{{(.*)\}} (\S+)", line)
            if m and ",".join(sorted(m.group(1).split(","))) == want:
                return float(m.group(2))
        return 0.0


@pytest.fixture
async def pushes(stack: Stack, notify_worker: FaustWorker) -> AsyncIterator[Pushes]:
    env = stack.cfg.env()
    keyring, _ = load_keyring(env)
    redis = Redis.from_url(stack.cfg.redis.url)
    p = Pushes(stack, notify_worker, AuthService(redis, keyring, AuthConfig.from_env(env)))
    try:
        yield p
    finally:
        await p.http.aclose()
        await redis.aclose()


def signal(call_id: str, signal_type: str, reason: str = "") -> Callable[[Frame], bool]:
    def match(frame: Frame) -> bool:
        body = frame.body
        return (
            isinstance(body, RtcSignalDown)
            and body.call_id == call_id
            and body.signal_type == signal_type
            and (not reason or body.reason == reason)
        )

    return match


def voip_calls(received: list[dict[str, Any]]) -> list[str]:
    return [r["payload"]["call_id"] for r in received if r["headers"]["apns-push-type"] == "voip"]


async def test_an_offline_callee_is_woken_by_one_voip_push_within_its_daily_quota(
    stack: Stack, tmp_path: Path, pushes: Pushes
) -> None:
    tenant = f"t-voip-{uuid.uuid4().hex[:6]}"
    async with (
        pipeline(stack, tmp_path),
        MailboxProbe(stack.cfg.kafka.bootstrap) as probe,
        nodes(stack, SETTINGS) as (a, b),
    ):
        alice = user_on(a, tenant, "alice-")
        bob = user_on(b, tenant, "bob-")
        dave = user_on(b, tenant, "dave-", near=bob)  # bob's NotificationService partition
        carol = user_on(b, tenant, "carol-")
        await pushes.register(tenant, bob, "phone", token=BOB_ALERT, voip_token=BOB_VOIP,
                              capabilities=["voip"])  # fmt: skip
        await pushes.register(tenant, dave, "android", provider="FCM", token=DAVE_FCM,
                              capabilities=["voip"])  # fmt: skip
        await pushes.register(tenant, carol, "phone", token=CAROL_ALERT)  # no voip capability
        clients: list[QimClient] = []
        try:
            caller = await a.online(tenant, alice, "phone")
            clients.append(caller)
            direct = caller.direct_conversation_id(bob)
            hello = await caller.send_message(direct, b"hello", peer_user_id=bob)

            async def bob_row_at(seq: int) -> bool:
                rows = {r.conversation_id: r for r in await probe.session_list(tenant, bob, 10)}
                row = rows.get(direct)
                return row is not None and row.latest_conversation_seq == seq

            await eventually(lambda: bob_row_at(hello.conversation_seq), "bob's direct row")
            mailbox_before = await probe.pull_all(tenant, bob)
            list_before = {r.conversation_id: r for r in await probe.session_list(tenant, bob, 10)}

            # AT-64: bob has no online device -> one VoIP push to the PushKit token, no badge
            await caller.rtc_signal(direct, bob, "invite", "v1", b"sdp-offer")
            (push,) = await pushes.wait_received(BOB_VOIP, 1)
            assert push["status"] == 200 and push["endpoint"] == "production"
            headers = push["headers"]
            assert headers["apns-push-type"] == "voip" and headers["apns-priority"] == "10"
            assert headers["apns-topic"] == f"{APNS_TOPIC}.voip"
            payload = push["payload"]
            assert payload["aps"] == {}  # no badge, no alert
            assert (payload["call_id"], payload["caller_user_id"]) == ("v1", alice)
            assert payload["conversation_id"] == direct
            assert "sdp-offer" not in str(payload)  # the offer stays on the online path

            # the woken phone connects and answers on the online path
            phone = await b.online(tenant, bob, "phone")
            clients.append(phone)
            await phone.rtc_signal(direct, alice, "accept", "v1", b"sdp-answer")
            accepted = await collect_until(caller, signal("v1", "accept"), "bob's accept")
            assert isinstance(accepted[-1], RtcSignalDown)
            assert accepted[-1].signal_payload == b"sdp-answer"
            await phone.close()
            clients.remove(phone)

            async def gone() -> bool:
                return not b.gw.node.registry.devices(tenant, bob)

            await eventually(gone, "bob's phone closed on its gateway")

            # a second call is pushed too; unanswered, alice's ring ends at rtc_ring_timeout
            await caller.rtc_signal(direct, bob, "invite", "v2")
            assert voip_calls(await pushes.wait_received(BOB_VOIP, 2)) == ["v1", "v2"]
            seen = await collect_until(caller, signal("v2", "cancel", "timeout"), "v2 timeout")
            assert ("cancel", "offline") not in [
                (s.signal_type, s.reason)
                for s in seen
                if isinstance(s, RtcSignalDown) and s.call_id == "v2"
            ]

            # the third call of the day is over rtc_voip_push_daily_quota (2): no push, and
            # alice is told at once that nothing could ring
            over_before = await pushes.counter("notify_voip_pushes_total", result="over_quota")
            await caller.rtc_signal(direct, bob, "invite", "v3")
            await collect_until(caller, signal("v3", "cancel", "offline"), "v3 offline")
            # barrier: a later call in the same NotificationService partition is pushed, to
            # dave's Android phone as an FCM high-priority data message (no notification)
            to_dave = caller.direct_conversation_id(dave)
            await caller.rtc_signal(to_dave, dave, "invite", "v4")
            (fcm,) = await pushes.wait_received(DAVE_FCM, 1)
            message = fcm["payload"]["message"]
            assert message["android"] == {"priority": "high"} and "notification" not in message
            assert (message["data"]["call_id"], message["data"]["type"]) == ("v4", "rtc_invite")
            assert "badge" not in message["data"]
            assert voip_calls(await pushes.received(BOB_VOIP)) == ["v1", "v2"]
            assert (
                await pushes.counter("notify_voip_pushes_total", result="over_quota")
                == over_before + 1
            )

            # a callee whose device registered no voip capability: offline, nothing pushed
            to_carol = caller.direct_conversation_id(carol)
            await caller.rtc_signal(to_carol, carol, "invite", "v5")
            await collect_until(caller, signal("v5", "cancel", "offline"), "v5 offline")
            assert await pushes.received(CAROL_ALERT) == []

            # INV-33 / 13.5.2: no mailbox entry, session-list change or unread from any call
            marker = await caller.send_message(direct, b"marker", peer_user_id=bob)
            await eventually(lambda: bob_row_at(marker.conversation_seq), "the marker")
            mailbox_after = await probe.pull_all(tenant, bob)
            assert mailbox_after[: len(mailbox_before)] == mailbox_before
            added = mailbox_after[len(mailbox_before) :]
            assert [e.conversation_seq for e in added] == [marker.conversation_seq]
            rows = {r.conversation_id: r for r in await probe.session_list(tenant, bob, 10)}
            assert rows[direct].unread_count == list_before[direct].unread_count + 1
            assert set(rows) == set(list_before)
            # no VoIP push ever went to the alert token, and none carried a badge
            for r in await pushes.received(BOB_ALERT):
                assert r["headers"]["apns-push-type"] != "voip"
        finally:
            for client in clients:
                await client.close()
