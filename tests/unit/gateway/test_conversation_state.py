"""CONVERSATION_STATE [ext] through a real ConnectionNode (``session_requests``).

* each action goes to ``qim.user-requests`` at the user's MailboxShard as a UserStateRequest
  whose identity is the session's grant (the frame has none to offer), carrying only the
  fields its action uses;
* an unknown action, MARK_READ's action, a malformed conversation id or an unknown policy is
  answered ERROR{PERMISSION_DENIED} with the frame's request_id and never forwarded;
* before AUTH the frame ends the connection, exactly as MARK_READ does.
"""

from __future__ import annotations

import pytest

from qim.gateway.conversation_state import state_fields
from qim.schemas.frames import AuthOk, ConversationState, Error, ErrorCode, MarkRead
from qim.schemas.records.user_requests import UserStateRequest
from tests.gateway_support import WsClient, wait_until
from tests.unit.gateway.test_login_sync_support import TENANT, login, shard, sync_node

CONV = "g:crew"
FORWARDED = {"kind": "conversation_state", "result": "forwarded"}


async def test_each_action_is_forwarded_with_the_sessions_identity() -> None:
    frames = [
        ConversationState(conversation_id=CONV, action="pin", pin_rank=2, flag=True),
        ConversationState(conversation_id=CONV, action="pin"),
        ConversationState(conversation_id=CONV, action="mute", flag=True, pin_rank=9),
        ConversationState(conversation_id=CONV, action="archive", flag=True),
        ConversationState(conversation_id=CONV, action="mark_unread", flag=True),
        ConversationState(conversation_id=CONV, action="clear_history"),
        ConversationState(conversation_id=CONV, action="delete", notification_policy="NONE"),
        ConversationState(
            conversation_id=CONV, action="notification_policy", notification_policy="MENTION_ONLY"
        ),
    ]
    async with sync_node() as h:
        client = await login(h, "bob", "tablet")
        ok = client.bodies()[-1]
        assert isinstance(ok, AuthOk)
        for n, body in enumerate(frames):
            await client.send(body, request_id=40 + n)
        await wait_until(lambda: len(h.producer.others) == len(frames))
        requests = []
        for partition, request in h.producer.others:
            assert partition == shard("bob") and isinstance(request, UserStateRequest)
            assert (request.tenant_id, request.user_id, request.device_id) == (
                TENANT,
                "bob",
                "tablet",
            )
            assert request.session_epoch == ok.session_epoch
            requests.append(request)
        assert [r.request_id for r in requests] == [40 + n for n in range(len(frames))]
        assert [(r.action, r.flag, r.pin_rank, r.notification_policy) for r in requests] == [
            ("pin", False, 2, ""),  # flag means nothing to pin
            ("pin", False, None, ""),  # unpin
            ("mute", True, None, ""),
            ("archive", True, None, ""),
            ("mark_unread", False, None, ""),
            ("clear_history", False, None, ""),
            ("delete", False, None, ""),
            ("notification_policy", False, None, "MENTION_ONLY"),
        ]
        assert {r.conversation_id for r in requests} == {CONV}
        await wait_until(
            lambda: h.sample("qim_gateway_mailbox_requests_total", **FORWARDED) == len(frames)
        )
        assert client.bodies()[-1] == ok  # no reply frame, like MARK_READ
        await client.close()


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (ConversationState(conversation_id=CONV, action="teleport"), "unknown"),
        (ConversationState(conversation_id=CONV, action="mark_read"), "unknown"),
        (ConversationState(conversation_id="crew", action="pin", pin_rank=1), "malformed"),
        (ConversationState(conversation_id="", action="delete"), "malformed"),
        (
            ConversationState(
                conversation_id=CONV, action="notification_policy", notification_policy="LOUD"
            ),
            "notification_policy",
        ),
    ],
)
async def test_a_refused_frame_gets_permission_denied_and_is_not_forwarded(
    body: ConversationState, detail: str
) -> None:
    async with sync_node() as h:
        client = await login(h, "bob")
        await client.send(body, request_id=61)
        error = await client.expect(Error)
        assert (error.code, error.request_id) == (int(ErrorCode.PERMISSION_DENIED), 61)
        assert detail in error.detail
        await client.send(MarkRead(conversation_id=CONV, read_conversation_seq=1), request_id=62)
        await wait_until(lambda: len(h.producer.others) == 1)  # the session is still usable
        (_, mark) = h.producer.others[0]
        assert isinstance(mark, UserStateRequest) and mark.action == "mark_read"
        refused = {"kind": "conversation_state", "result": "refused"}
        assert h.sample("qim_gateway_mailbox_requests_total", **refused) == 1
        await client.close()


async def test_before_auth_it_ends_the_connection_like_mark_read() -> None:
    bodies = [
        MarkRead(conversation_id=CONV),
        ConversationState(conversation_id=CONV, action="delete"),
    ]
    async with sync_node() as h:
        answers = []
        for body in bodies:
            client = await WsClient.connect(h.url)
            await client.send(body, request_id=5)
            answers.append(await client.refusal())
        mark_read, conversation_state = answers
        assert mark_read, "a frame before AUTH is answered, then the connection closes"
        assert conversation_state == mark_read
        assert h.producer.others == []


def test_state_fields_are_pure_and_keep_only_what_the_action_uses() -> None:
    body = ConversationState(
        conversation_id=CONV, action="archive", flag=True, pin_rank=3, notification_policy="ALL"
    )
    assert state_fields(body) == {
        "conversation_id": CONV,
        "action": "archive",
        "flag": True,
        "pin_rank": None,
        "notification_policy": "",
    }
    assert isinstance(state_fields(ConversationState(conversation_id=CONV)), str)
