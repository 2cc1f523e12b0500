"""RTC_SIGNAL across two gateways (issue 16, spec 13.5, AT-63, AT-65, INV-33).

alice calls bob, whose three devices are owned by the other gateway. Checked on the real
stack: an INVITE rings on all three; ACCEPT on one device reaches alice and cancels the
other two (``answered_elsewhere``), never the one that answered; an unanswered INVITE ends
after ``rtc_ring_timeout`` with ``cancel{reason=timeout}`` on both sides; a call to a callee
with no online device goes to offline push (no NotificationService here: it times out); an
oversized payload and a stranger's signal are refused with theirs; and afterwards bob's mailbox,
session list, unread and the conversation's history hold only the messages really sent.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from qim.client import QimClient
from qim.devstack.stack import Stack
from qim.params import Settings
from qim.schemas.frames import Body, Error, ErrorCode, Frame
from qim.schemas.frames.rtc import RtcSignalDown
from tests.integration.device_support import eventually
from tests.integration.mailbox_support import Client as MailboxProbe
from tests.integration.realtime_support import collect_until, nodes, pipeline, user_on

pytestmark = pytest.mark.integration

RING_MS = 3000
SETTINGS = Settings.load(
    overrides={
        "per_ip_connect_rate": {"count": 100_000, "period_ms": 1000},
        "rtc_ring_timeout": RING_MS,
    },
    env={},
)


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


def signals(bodies: list[Body], call_id: str) -> list[tuple[str, str]]:
    return [
        (b.signal_type, b.reason)
        for b in bodies
        if isinstance(b, RtcSignalDown) and b.call_id == call_id
    ]


async def error_for(client: QimClient, rid: int) -> Error:
    bodies = await collect_until(
        client,
        lambda f: isinstance(f.body, Error) and f.body.request_id == rid,
        f"the answer to {rid}",
    )
    error = bodies[-1]
    assert isinstance(error, Error)
    return error


async def test_a_call_rings_everywhere_one_answer_cancels_the_rest_and_rings_time_out(
    stack: Stack, tmp_path: Path
) -> None:
    tenant = f"t-rtc-{uuid.uuid4().hex[:6]}"
    group = f"g:rtc-{uuid.uuid4().hex[:6]}"
    async with (
        pipeline(stack, tmp_path),
        MailboxProbe(stack.cfg.kafka.bootstrap) as probe,
        nodes(stack, SETTINGS) as (a, b),
    ):
        alice, carol = user_on(a, tenant, "alice-"), user_on(a, tenant, "carol-")
        bob, mallory = user_on(b, tenant, "bob-"), user_on(b, tenant, "mallory-")
        clients: list[QimClient] = []
        try:
            caller = await a.online(tenant, alice, "phone")
            clients.append(caller)
            devices = [await b.online(tenant, bob, d) for d in ("phone", "laptop", "tablet")]
            clients += devices
            stranger = await b.online(tenant, mallory, "pc")
            clients.append(stranger)
            direct = caller.direct_conversation_id(bob)
            hello = await caller.send_message(direct, b"hello", peer_user_id=bob)
            await stranger.create_group(group, (bob,))

            async def bob_row_at(seq: int) -> bool:
                rows = {r.conversation_id: r for r in await probe.session_list(tenant, bob, 10)}
                row = rows.get(direct)
                return row is not None and row.latest_conversation_seq == seq

            await eventually(lambda: bob_row_at(hello.conversation_seq), "bob's direct row")
            mailbox_before = await probe.pull_all(tenant, bob)
            list_before = {r.conversation_id: r for r in await probe.session_list(tenant, bob, 10)}

            # AT-63: the INVITE rings on all three of bob's devices (on the other gateway)
            await caller.rtc_signal(direct, bob, "invite", "c1", b"sdp-offer")
            for device in devices:
                got = await collect_until(device, signal("c1", "invite"), "the invite")
                invite = got[-1]
                assert isinstance(invite, RtcSignalDown)
                assert (invite.from_user_id, invite.signal_payload) == (alice, b"sdp-offer")

            # AT-65: ACCEPT on the laptop reaches alice and cancels the phone and the tablet
            phone, laptop, tablet = devices
            await laptop.rtc_signal(direct, alice, "accept", "c1", b"sdp-answer")
            accepted = await collect_until(caller, signal("c1", "accept"), "the accept")
            assert isinstance(accepted[-1], RtcSignalDown)
            assert accepted[-1].signal_payload == b"sdp-answer"
            for device in (phone, tablet):
                await collect_until(device, signal("c1", "cancel", "answered_elsewhere"), "cancel")

            # AT-65: nobody answers c2: after rtc_ring_timeout both sides get cancel{timeout}
            await caller.rtc_signal(direct, bob, "invite", "c2")
            for device in devices:
                seen = await collect_until(device, signal("c2", "cancel", "timeout"), "timeout")
                assert ("invite", "") in signals(seen, "c2")
                if device is laptop:  # the device that answered c1 was never cancelled
                    assert signals(seen, "c1") == []
            await collect_until(caller, signal("c2", "cancel", "timeout"), "the caller's timeout")

            # 13.5.2: a callee with no online device is handed to offline push (a voip
            # PushTask); with no NotificationService running here nothing answers for it, so
            # the ring ends at rtc_ring_timeout (the pushed path: test_rtc_voip_push.py)
            await caller.rtc_signal(caller.direct_conversation_id(carol), carol, "invite", "c3")
            ended = await collect_until(caller, signal("c3", "cancel", "timeout"), "c3 timeout")
            assert ("cancel", "offline") not in signals(ended, "c3")

            # refusals carry the request_id: too large (AT-65), not a member of the group
            rid = await caller.rtc_signal(direct, bob, "invite", "c4", b"x" * (8 * 1024 + 1))
            assert (await error_for(caller, rid)).code == int(ErrorCode.PAYLOAD_TOO_LARGE)
            rid = await caller.rtc_signal(group, bob, "invite", "c5")
            assert (await error_for(caller, rid)).code == int(ErrorCode.PERMISSION_DENIED)

            # INV-33: no mailbox entry, session list change, unread or history row from any
            marker = await caller.send_message(direct, b"marker", peer_user_id=bob)
            await eventually(lambda: bob_row_at(marker.conversation_seq), "the marker")
            mailbox_after = await probe.pull_all(tenant, bob)
            assert mailbox_after[: len(mailbox_before)] == mailbox_before
            added = mailbox_after[len(mailbox_before) :]
            assert [e.conversation_seq for e in added] == [marker.conversation_seq]
            rows = {r.conversation_id: r for r in await probe.session_list(tenant, bob, 10)}
            assert rows[direct].unread_count == list_before[direct].unread_count + 1
            assert rows[group] == list_before[group]
            history = await caller.pull_history(direct, limit=50)
            assert [m.payload_or_ciphertext for m in history.messages] in (
                [b"hello", b"marker"],
                [b"marker", b"hello"],
            )
        finally:
            for client in clients:
                await client.close()
