"""§27.1.2 tolerance: unknown opcodes, fields, event types and codes never fail a batch."""

from __future__ import annotations

import msgspec
import pytest

from qim.schemas.frames import (
    FRAMES_BY_NAME,
    Error,
    ErrorCode,
    Frame,
    FrameDecoder,
    MailboxBatch,
    Ping,
    Role,
    SendMessage,
    SyncEntry,
    UnknownFrame,
    decode_message,
    encode_frame,
    frame_bytes,
)
from tests.unit.frames.support import body_of


@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize("opcode", [0x0000, 0x00FE, 0x0B01, 0x0107, 0xF123])
def test_unknown_opcode_is_skipped_by_body_len_and_decoding_continues(
    role: Role, opcode: int
) -> None:
    """Skip the whole frame, count it, continue - never disconnect (§27.1.2 rows 1-2)."""
    known = encode_frame(Ping(ping_id=5)) if role is Role.SERVER else encode_frame(MailboxBatch())
    unknown = frame_bytes(opcode, b"\xc1\xc1 not msgpack at all", request_id=3)
    decoder = FrameDecoder(role)
    decoder.receive_data(unknown + known)
    first = decoder.next_frame()
    assert isinstance(first, UnknownFrame)
    assert first.header.opcode == opcode and first.header.request_id == 3
    assert first.raw_body == b"\xc1\xc1 not msgpack at all"
    assert isinstance(decoder.next_frame(), Frame)
    reply = first.server_reply()
    assert reply is not None and reply.code == ErrorCode.UPGRADE_REQUIRED and reply.request_id == 3


def test_unknown_server_initiated_frame_needs_no_reply() -> None:
    frame = decode_message(frame_bytes(0x0BFF, b"", request_id=0), Role.CLIENT)
    assert isinstance(frame, UnknownFrame) and frame.server_reply() is None


def test_unknown_fields_are_ignored_and_the_raw_body_kept_for_write_back() -> None:
    body = {"conversation_id": "c1", "payload": b"x", "added_in_v9": [1, {"nested": True}]}
    raw = msgspec.msgpack.encode(body)
    frame = decode_message(frame_bytes(FRAMES_BY_NAME["SEND_MESSAGE"].opcode, raw), Role.SERVER)
    assert isinstance(frame, Frame)
    assert frame.body == SendMessage(conversation_id="c1", payload=b"x")
    assert frame.raw_body == raw  # a relay forwards these bytes, unknown key included


def test_missing_fields_take_their_defaults() -> None:
    """§27.2.1: absence means "feature off", e.g. no reply_to."""
    frame = decode_message(frame_bytes(FRAMES_BY_NAME["SEND_MESSAGE"].opcode, b"\x80"), Role.SERVER)
    assert isinstance(frame, Frame) and frame.body == SendMessage()


def test_entry_with_unknown_event_type_still_decodes() -> None:
    """Old clients must still count it toward covered_through_seq (§27.1.2 row 4)."""
    batch = MailboxBatch(
        entries=(SyncEntry(mailbox_seq=10, event_type=200, mention_type=99, flags=0xF0),),
        covered_through_seq=10,
    )
    decoded = decode_message(encode_frame(batch), Role.CLIENT)
    assert isinstance(decoded, Frame) and decoded.body == batch


def test_unknown_custom_type_and_enum_words_pass_through() -> None:
    body = SendMessage(custom_type="card.order.v7", message_type=250)
    assert body_of(encode_frame(body), Role.SERVER) == body


def test_unknown_error_code_in_an_error_frame() -> None:
    raw = msgspec.msgpack.encode({"code": 999, "detail": "new", "brand_new_extra": 1})
    body = body_of(frame_bytes(FRAMES_BY_NAME["ERROR"].opcode, raw), Role.CLIENT)
    assert isinstance(body, Error) and body.code == 999
    assert 999 not in {int(c) for c in ErrorCode}
