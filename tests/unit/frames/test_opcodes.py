"""The opcode table against App. A.2 (ranges), A.3/A.4 (frames, directions) and A.5 (streams)."""

from __future__ import annotations

import pytest

from qim.schemas.frames import (
    FRAMES_BY_NAME,
    FRAMES_BY_OPCODE,
    INTERNAL_OPCODES,
    OPCODE_RANGES,
    Direction,
    FrameDecoder,
    Role,
    Stream,
    WrongDirection,
    check_direction,
    frame_bytes,
    spec_for_model,
)
from tests.unit.frames.support import all_models

A2_GROUPS = {
    0x00: "AUTH AUTH_OK PING PONG REDIRECT KICKED ERROR",
    0x01: "PULL_MAILBOX MAILBOX_BATCH SYNC_COMPLETE ONLINE_READY",
    0x02: "SEND_MESSAGE SEND_ACK PUSH_EVENTS",
    0x03: "PULL_HISTORY HISTORY_BATCH PULL_SESSION_LIST SESSION_LIST_BATCH SESSION_DELTA "
    "BADGE_UPDATE",
    0x04: "MARK_READ RECALL EDIT TYPING PRESENCE_SUB READ_SYNC",
    0x05: "ROOM_JOIN ROOM_LEAVE ROOM_REPLAY ROOM_BATCH",
    0x06: "RTC_SIGNAL",
    0x07: "MEDIA_TICKET",
    0x08: "PREKEY_PUBLISH PREKEY_FETCH",
    0x09: "REACT REACTION_UPDATE PULL_REACTIONS REACTION_LIST",
    0x0A: "PULL_MEMBERS MEMBER_LIST_BATCH CREATE_GROUP LEAVE_GROUP",
}
EXT_FRAMES = {"CONVERSATION_STATE": 0x0407}
"""[ext] frames (not in App. A), each numbered after its range's spec frames."""
A5_STREAMS = {
    Stream.CONTROL: "AUTH PING PONG ERROR KICKED",
    Stream.REALTIME: "PUSH_EVENTS SEND_ACK SESSION_DELTA BADGE_UPDATE",
    Stream.BULK: "MAILBOX_BATCH HISTORY_BATCH SESSION_LIST_BATCH",
    Stream.ROOM: "ROOM_BATCH",
}


def test_exactly_42_client_visible_frame_names() -> None:
    """A.4: 24 uplink + 21 downlink - 3 bidirectional = 42, matching A.2; plus the [ext].

    RTC_SIGNAL's relayed downlink half is ours (A.4 has none, digest §5 item 5): one more
    downlink model on an A.3 opcode, no new name."""
    spec = {n: f for n, f in FRAMES_BY_NAME.items() if n not in EXT_FRAMES}
    assert len(spec) == 42
    assert set(spec) == {n for names in A2_GROUPS.values() for n in names.split()}
    up = [f for f in spec.values() if f.direction & Direction.UPLINK]
    down = [f for f in spec.values() if f.direction & Direction.DOWNLINK]
    both = {f.name for f in spec.values() if f.direction == Direction.BOTH}
    assert (len(up), len(down)) == (24, 21 + 1)
    assert both == {"TYPING", "PRESENCE_SUB", "PREKEY_FETCH", "RTC_SIGNAL"}
    assert set(FRAMES_BY_NAME) == set(spec) | set(EXT_FRAMES)


def test_opcodes_are_unique_and_inside_their_a2_range() -> None:
    assert len(FRAMES_BY_OPCODE) == 42 + len(EXT_FRAMES)
    for group, names in A2_GROUPS.items():
        for name in names.split():
            opcode = FRAMES_BY_NAME[name].opcode
            assert opcode >> 8 == group, name
            assert opcode & 0xFF != 0, f"{name}: 0x??00 stays unassigned"


def test_ext_frames_follow_the_spec_frames_of_their_range() -> None:
    """CONVERSATION_STATE [ext] is 0x0407, uplink only, after READ_SYNC (0x0406)."""
    for name, opcode in EXT_FRAMES.items():
        frame = FRAMES_BY_NAME[name]
        assert frame.opcode == opcode
        spec = [f.opcode for f in FRAMES_BY_NAME.values() if f.opcode >> 8 == opcode >> 8]
        assert opcode == max(spec)
    state = FRAMES_BY_NAME["CONVERSATION_STATE"]
    assert state.direction == Direction.UPLINK and state.downlink is None
    assert state.stream == FRAMES_BY_NAME["MARK_READ"].stream == Stream.REALTIME


def test_leave_group_is_0x0a04() -> None:
    """ADR-0021 fixes the only concrete opcode of the source."""
    assert FRAMES_BY_NAME["LEAVE_GROUP"].opcode == 0x0A04


def test_a5_streams_are_the_defaults() -> None:
    for stream, names in A5_STREAMS.items():
        for name in names.split():
            assert FRAMES_BY_NAME[name].stream == stream, name


def test_every_frame_has_a_model_per_direction_and_models_map_back() -> None:
    assert len(all_models()) == 45 + 1 + len(EXT_FRAMES)  # + RTC_SIGNAL's [ext] downlink
    for spec, cls, _sender in all_models():
        assert spec_for_model(cls) is spec


def test_internal_frames_are_reserved_in_the_vendor_range_only() -> None:
    vendor = next(r for r in OPCODE_RANGES if r[2].startswith("reserved"))
    for opcode in INTERNAL_OPCODES.values():
        assert vendor[0] <= opcode <= vendor[1]
        assert opcode not in FRAMES_BY_OPCODE


@pytest.mark.parametrize("name", ["AUTH", "PING", "SEND_MESSAGE", "LEAVE_GROUP"])
def test_uplink_only_frame_from_a_server_is_refused_by_the_client(name: str) -> None:
    opcode = FRAMES_BY_NAME[name].opcode
    with pytest.raises(WrongDirection):
        check_direction(opcode, Role.SERVER)
    decoder = FrameDecoder(Role.CLIENT)
    decoder.receive_data(frame_bytes(opcode, b"\x80"))
    with pytest.raises(WrongDirection) as info:
        decoder.next_frame()
    assert info.value.close


@pytest.mark.parametrize("name", ["AUTH_OK", "PONG", "ERROR", "MAILBOX_BATCH", "READ_SYNC"])
def test_downlink_only_frame_from_a_client_is_refused_by_the_server(name: str) -> None:
    with pytest.raises(WrongDirection):
        check_direction(FRAMES_BY_NAME[name].opcode, Role.CLIENT)


@pytest.mark.parametrize("name", ["TYPING", "PRESENCE_SUB", "PREKEY_FETCH"])
def test_bidirectional_frames_pass_both_ways(name: str) -> None:
    opcode = FRAMES_BY_NAME[name].opcode
    assert check_direction(opcode, Role.CLIENT) is check_direction(opcode, Role.SERVER)


def test_internal_opcode_on_a_client_connection_is_a_violation() -> None:
    for opcode in INTERNAL_OPCODES.values():
        for sender in Role:
            with pytest.raises(WrongDirection):
                check_direction(opcode, sender)
