"""CONVERSATION_STATE [ext] (0x0407): its codec round trip and its place in the opcode table."""

from __future__ import annotations

import msgspec
import pytest

from qim.schemas.frames import (
    FRAMES_BY_OPCODE,
    ConversationState,
    Frame,
    MalformedBody,
    Role,
    WrongDirection,
    check_direction,
    decode_message,
    encode_frame,
)
from qim.schemas.frames.control import CONVERSATION_STATE_ACTIONS, NOTIFICATION_POLICIES
from qim.schemas.records.user_state import USER_STATE_ACTIONS

BODIES = [
    ConversationState(conversation_id="g:team", action="pin", pin_rank=-3),
    ConversationState(conversation_id="g:team", action="pin"),
    ConversationState(conversation_id="g:team", action="mute", flag=True),
    ConversationState(
        conversation_id="g:team", action="notification_policy", notification_policy="MENTION_ONLY"
    ),
]


@pytest.mark.parametrize("body", BODIES, ids=lambda b: f"{b.action}-{b.pin_rank}")
def test_round_trip_keeps_the_body_and_the_request_id(body: ConversationState) -> None:
    raw = encode_frame(body, 77)
    frame = decode_message(raw, Role.SERVER)
    assert isinstance(frame, Frame)
    assert (frame.name, frame.header.opcode, frame.header.request_id) == (
        "CONVERSATION_STATE",
        0x0407,
        77,
    )
    assert frame.body == body


def test_unpin_omits_pin_rank_on_the_wire() -> None:
    """pin_rank None (unpin) is absent, not nil: a map with only the fields that are set."""
    raw = msgspec.msgpack.encode(ConversationState(conversation_id="g:x", action="pin"))
    assert msgspec.msgpack.decode(raw) == {"conversation_id": "g:x", "action": "pin"}
    pinned = ConversationState(conversation_id="g:x", action="pin", pin_rank=0)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(pinned))["pin_rank"] == 0


def test_pin_rank_outside_i32_is_refused_by_the_decoder() -> None:
    raw = encode_frame(ConversationState(conversation_id="g:x", action="pin", pin_rank=2**31), 1)
    with pytest.raises(MalformedBody):
        decode_message(raw, Role.SERVER)


def test_actions_are_the_user_state_actions_but_mark_read() -> None:
    assert USER_STATE_ACTIONS - {"mark_read"} == CONVERSATION_STATE_ACTIONS
    assert NOTIFICATION_POLICIES == ("ALL", "MENTION_ONLY", "NONE")


def test_only_a_client_sends_it() -> None:
    assert check_direction(0x0407, Role.CLIENT) is FRAMES_BY_OPCODE[0x0407]
    with pytest.raises(WrongDirection):
        check_direction(0x0407, Role.SERVER)
