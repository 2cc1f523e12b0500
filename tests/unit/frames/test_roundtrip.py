"""Every body of A.3/A.4 (and the A.4.1 entry inside them) survives encode -> decode intact."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qim.schemas.frames import (
    U128_ZERO,
    Body,
    EventType,
    Frame,
    FrameDecoder,
    FrameSpec,
    MailboxBatch,
    MediaTicket,
    MentionType,
    Role,
    SyncEntry,
    decode_message,
    encode_body,
    encode_frame,
    u128_from_bytes,
    u128_to_bytes,
)
from tests.unit.frames.support import (
    all_models,
    body_of,
    full_instance,
    model_strategy,
    receiver,
    wire_keys,
)

MODELS = all_models()
IDS = [cls.__name__ for _spec, cls, _sender in MODELS]


@pytest.mark.parametrize(("spec", "cls", "sender"), MODELS, ids=IDS)
def test_every_field_set_round_trips_on_both_transports(
    spec: FrameSpec, cls: type[Body], sender: Role
) -> None:
    body = full_instance(cls)
    assert wire_keys(body) == len(cls.__struct_fields__), "every field must be on the wire"
    frame = encode_frame(body, request_id=77)
    via_ws = decode_message(frame, receiver(sender))
    decoder = FrameDecoder(receiver(sender))
    decoder.receive_data(frame)
    via_stream = decoder.next_frame()
    assert via_stream is not None
    for decoded in (via_ws, via_stream):
        assert isinstance(decoded, Frame)
        assert decoded.header.opcode == spec.opcode
        assert decoded.header.stream_id == spec.stream
        assert decoded.header.request_id == 77
        assert decoded.body == body
        assert decoded.raw_body == frame[20:]


@pytest.mark.parametrize(("spec", "cls", "sender"), MODELS, ids=IDS)
def test_all_defaults_encode_to_an_empty_map(
    spec: FrameSpec, cls: type[Body], sender: Role
) -> None:
    """omit_defaults: a body with nothing set is an empty map (map16 past 15 fields)."""
    raw = encode_body(cls())
    assert msgspec.msgpack.decode(raw) == {} and len(raw) <= 3
    assert body_of(encode_frame(cls()), receiver(sender)) == cls()


@settings(max_examples=600, deadline=None)
@given(st.sampled_from(MODELS).flatmap(lambda m: st.tuples(st.just(m), model_strategy(m[1]))))
def test_random_bodies_round_trip(case: tuple[tuple[FrameSpec, type[Body], Role], Body]) -> None:
    (_spec, _cls, sender), body = case
    assert body_of(encode_frame(body), receiver(sender)) == body


@given(st.integers(min_value=0, max_value=2**128 - 1), st.integers(0, 2**128 - 1))
def test_u128_is_16_bytes_big_endian_and_keeps_order(a: int, b: int) -> None:
    """u128 ids travel as 16-octet big-endian bin; byte order = numeric order (§6.2, §6.4)."""
    ra, rb = u128_to_bytes(a), u128_to_bytes(b)
    assert len(ra) == 16 and u128_from_bytes(ra) == a
    assert (ra < rb) == (a < b)


def test_u128_bounds() -> None:
    with pytest.raises(ValueError):
        u128_to_bytes(2**128)
    with pytest.raises(ValueError):
        u128_to_bytes(-1)
    with pytest.raises(ValueError):
        u128_from_bytes(b"\x00" * 15)


def test_u64_top_value_round_trips_as_msgpack_uint() -> None:
    entry = SyncEntry(mailbox_seq=2**64 - 1, message_id=u128_to_bytes(2**128 - 1))
    raw = encode_body(MailboxBatch(entries=(entry,)))
    assert b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff" in raw  # msgpack uint64
    batch = msgspec.msgpack.decode(raw, type=MailboxBatch)
    assert batch.entries[0] == entry


def test_field_named_bytes_keeps_its_wire_name() -> None:
    """A.3 MEDIA_TICKET calls the field ``bytes``; the attribute is byte_size."""
    assert msgspec.msgpack.decode(encode_body(MediaTicket(byte_size=5))) == {"bytes": 5}


def test_u128_fields_refuse_other_lengths() -> None:
    raw = msgspec.msgpack.encode({"message_id": b"\x01" * 15})
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(raw, type=SyncEntry)
    assert SyncEntry().message_id == U128_ZERO


def test_equal_bodies_encode_to_identical_bytes() -> None:
    """msgspec omits by identity; the named constants are plain ints so nothing leaks through."""
    named = SyncEntry(event_type=EventType.MESSAGE, mention_type=MentionType.NONE, flags=0)
    assert encode_body(named) == encode_body(SyncEntry()) == encode_body(SyncEntry(event_ordinal=0))
