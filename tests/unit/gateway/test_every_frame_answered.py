"""Every frame a client may send is served or answered, never met with silence (issue 16).

Walks every client-to-server opcode of Appendix A (the codec's table, so a frame added there is
walked too) through a real ConnectionNode with its ConversationRouter: each frame either leaves
for a worker (it is produced to Kafka; the worker answers it, tested elsewhere) or comes back
as a frame carrying its request_id. A frame this server does not serve yet gets
ERROR{PERMISSION_DENIED} whose detail names it as not offered, and the connection stays open.
"""

from __future__ import annotations

import msgspec
import pytest

from qim.gateway.routing.replies import ReplyVerdict
from qim.schemas.frames import Error, ErrorCode, Frame, Ping, Pong, encode_frame
from qim.schemas.frames.opcodes import FRAMES_BY_NAME, Role
from qim.schemas.frames.reactions import ReactionUpdate
from qim.schemas.records import (
    PullReactionsRequest,
    ReactRequest,
    conversation_partition,
    decode_conversation_request,
)
from qim.schemas.records.reactions import ReactionPush, encode_reaction_push
from tests.gateway_support import wait_until
from tests.unit.gateway.test_router import COUNT, harness

SERVED = {"TYPING", "PRESENCE_SUB", "RTC_SIGNAL"}
"""Served since issue 16's real-time part: never answered as "not offered"."""

CLIENT_FRAMES = sorted(
    name
    for name, spec in FRAMES_BY_NAME.items()
    if spec.model_sent_by(Role.CLIENT) is not None and name != "AUTH"
)


def test_the_walk_covers_the_frames_the_issue_names() -> None:
    named = {"TYPING", "PRESENCE_SUB", "REACT", "PULL_REACTIONS", "ROOM_JOIN", "ROOM_LEAVE"}
    named |= {"ROOM_REPLAY", "RTC_SIGNAL", "MEDIA_TICKET", "PREKEY_PUBLISH", "PREKEY_FETCH"}
    assert named <= set(CLIENT_FRAMES)


@pytest.mark.parametrize("name", CLIENT_FRAMES)
async def test_a_client_frame_is_forwarded_or_answered_with_its_request_id(name: str) -> None:
    model = FRAMES_BY_NAME[name].model_sent_by(Role.CLIENT)
    assert model is not None
    rid = 4242
    async with harness() as h:
        conn, pipe = await h.online()
        produced = len(h.producer.sent)
        conn.feed_message(encode_frame(model(), rid))

        def answered() -> bool:
            mine = [f for f in pipe.frames if isinstance(f, Frame) and f.header.request_id == rid]
            return bool(mine) or len(h.producer.sent) > produced

        await wait_until(answered)
        assert not conn.closing, f"{name}: a well-formed frame closed the connection"
        for frame in pipe.frames:
            body = frame.body
            if frame.header.request_id == rid and isinstance(body, Error):
                assert body.request_id == rid
                if body.code == int(ErrorCode.PERMISSION_DENIED) and body.detail:
                    assert name in body.detail
                if name in SERVED:
                    assert "not offered" not in body.detail, f"{name} is served now"
        # the connection still serves: a PING after it is answered
        conn.feed_message(encode_frame(Ping(ping_id=9), rid + 1))
        await wait_until(lambda: any(isinstance(b, Pong) for b in pipe.bodies()))


@pytest.mark.parametrize("name", ["REACT", "PULL_REACTIONS"])
async def test_reactions_are_served_now_forwarded_with_the_sessions_identity(name: str) -> None:
    """Issue 19: REACT / PULL_REACTIONS leave for the ConversationWriter, no longer answered
    as not offered; user, device and tenant are the session's, never the frame's."""
    model = FRAMES_BY_NAME[name].model_sent_by(Role.CLIENT)
    assert model is not None
    body = model(conversation_id="g:team", conversation_seq=3, reaction_key="like")
    async with harness() as h:
        conn, pipe = await h.online()
        conn.feed_message(encode_frame(body, 77))
        await wait_until(lambda: len(h.producer.sent) == 1)
        topic, _, value, partition = h.producer.sent[0]
        request = decode_conversation_request(value)
        assert topic == "qim.conversation-requests"
        assert isinstance(request, ReactRequest if name == "REACT" else PullReactionsRequest)
        assert (request.tenant_id, request.user_id, request.request_id) == ("t1", "alice", 77)
        assert (request.conversation_id, request.conversation_seq) == ("g:team", 3)
        assert partition == conversation_partition("t1", "g:team", COUNT)
        assert not any(isinstance(b, Error) for b in pipe.bodies())


async def test_a_reaction_push_reaches_every_live_session_of_its_recipients_only() -> None:
    async with harness() as h:
        _, alice = await h.online("alice", "phone")
        _, bob = await h.online("bob", "pc")
        push = ReactionPush(
            tenant_id="t1",
            connection_shard=0,
            conversation_id="g:team",
            conversation_seq=3,
            counts={"like": 2},
            summary_version=4,
            recipients=("alice", "carol"),  # carol is offline: dropped, never queued
            self_keys={"alice": ("like",)},
        )
        assert h.router.deliver(encode_reaction_push(push)) is ReplyVerdict.DELIVER
        await wait_until(lambda: any(isinstance(b, ReactionUpdate) for b in alice.bodies()))
        (update,) = [b for b in alice.bodies() if isinstance(b, ReactionUpdate)]
        assert (update.counts, update.summary_version) == ({"like": 2}, 4)
        assert update.self_reaction_keys == ("like",)
        nobody = msgspec.structs.replace(push, recipients=("carol",))
        assert h.router.deliver(encode_reaction_push(nobody)) is ReplyVerdict.NO_SESSION
        # barrier: a later push that names bob; the first one (not his) never reached him
        later = msgspec.structs.replace(push, recipients=("bob",), summary_version=5)
        assert h.router.deliver(encode_reaction_push(later)) is ReplyVerdict.DELIVER
        await wait_until(lambda: any(isinstance(b, ReactionUpdate) for b in bob.bodies()))
        seen = [b for b in bob.bodies() if isinstance(b, ReactionUpdate)]
        assert [u.summary_version for u in seen] == [5]
        assert seen[0].self_reaction_keys is None  # bob did not react: "yours did not change"
