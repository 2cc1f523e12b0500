"""Every frame a client may send is served or answered, never met with silence (issue 16).

Walks every client-to-server opcode of Appendix A (the codec's table, so a frame added there is
walked too) through a real ConnectionNode with its ConversationRouter: each frame either leaves
for a worker (it is produced to Kafka; the worker answers it, tested elsewhere) or comes back
as a frame carrying its request_id. A frame this server does not serve yet gets
ERROR{PERMISSION_DENIED} whose detail names it as not offered, and the connection stays open.
"""

from __future__ import annotations

import pytest

from qim.schemas.frames import Error, ErrorCode, Frame, Ping, Pong, encode_frame
from qim.schemas.frames.opcodes import FRAMES_BY_NAME, Role
from tests.gateway_support import wait_until
from tests.unit.gateway.test_router import harness

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
        # the connection still serves: a PING after it is answered
        conn.feed_message(encode_frame(Ping(ping_id=9), rid + 1))
        await wait_until(lambda: any(isinstance(b, Pong) for b in pipe.bodies()))
