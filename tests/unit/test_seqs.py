"""mailbox_seq / room_seq layout and seq_bucket (spec §6.5, §6.6, §7.1, App. B.2, §26 #12)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qim.schemas.seqs import (
    MAX_COUNTER,
    MAX_EPOCH,
    MailboxSeqParts,
    RoomSeqParts,
    compose_mailbox_seq,
    compose_room_seq,
    mailbox_seq_from_bytes,
    mailbox_seq_to_bytes,
    room_seq_from_bytes,
    room_seq_to_bytes,
    seq_bucket,
    split_mailbox_seq,
    split_room_seq,
)

epochs = st.integers(0, MAX_EPOCH)
counters = st.integers(0, MAX_COUNTER)
seqs = st.builds(compose_mailbox_seq, epochs, counters)


def test_spec_6_5_mailbox_seq_worked_example() -> None:
    seq = compose_mailbox_seq(3, 10008)
    assert seq == 844424930141976
    assert mailbox_seq_to_bytes(seq) == bytes([0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x27, 0x18])
    assert split_mailbox_seq(seq) == MailboxSeqParts(shard_epoch=3, log_offset=10008)


def test_spec_6_5_max_epoch_is_max_positive_signed_bigint_prefix() -> None:
    assert compose_mailbox_seq(0x7FFF, 0) == 0x7FFF000000000000


def test_spec_6_6_room_seq_worked_example() -> None:
    seq = compose_room_seq(2, 77)
    assert seq == 562949953421389
    assert room_seq_to_bytes(seq).hex() == "000200000000004d"
    assert split_room_seq(seq) == RoomSeqParts(room_epoch=2, counter=77)
    assert room_seq_from_bytes(room_seq_to_bytes(seq)) == seq


def test_epoch_0x7fff_and_offset_2_48_minus_1_are_accepted() -> None:
    seq = compose_mailbox_seq(0x7FFF, (1 << 48) - 1)
    assert seq == (1 << 63) - 1
    assert mailbox_seq_to_bytes(seq).hex() == "7fffffffffffffff"
    assert compose_room_seq(0x7FFF, (1 << 48) - 1) == seq


@pytest.mark.parametrize(("epoch", "offset"), [(0x8000, 0), (-1, 0), (0, 1 << 48), (0, -1)])
def test_epoch_above_0x7fff_or_offset_beyond_48_bits_is_rejected_per_spec_6_5(
    epoch: int, offset: int
) -> None:
    with pytest.raises(ValueError):
        compose_mailbox_seq(epoch, offset)
    with pytest.raises(ValueError):
        compose_room_seq(epoch, offset)


def test_bit_63_is_never_accepted_on_decode() -> None:
    with pytest.raises(ValueError):
        split_mailbox_seq(1 << 63)
    with pytest.raises(ValueError):
        mailbox_seq_from_bytes(bytes.fromhex("8000000000000000"))
    with pytest.raises(ValueError):
        room_seq_from_bytes(bytes.fromhex("8000000000000000"))
    with pytest.raises(ValueError):
        mailbox_seq_to_bytes(1 << 63)
    with pytest.raises(ValueError):
        mailbox_seq_from_bytes(b"\x00" * 7)


def test_bool_is_not_an_epoch() -> None:
    with pytest.raises(TypeError):
        compose_mailbox_seq(True, 0)


@given(epochs, counters)
def test_compose_split_round_trip(epoch: int, offset: int) -> None:
    seq = compose_mailbox_seq(epoch, offset)
    assert split_mailbox_seq(seq) == (epoch, offset)
    assert mailbox_seq_from_bytes(mailbox_seq_to_bytes(seq)) == seq
    assert split_room_seq(compose_room_seq(epoch, offset)) == (epoch, offset)


@given(seqs, seqs)
def test_encoded_byte_order_equals_numeric_order_per_spec_6_1(a: int, b: int) -> None:
    assert (mailbox_seq_to_bytes(a) < mailbox_seq_to_bytes(b)) == (a < b)


@given(seqs, seqs)
def test_signed_bigint_order_matches_unsigned_order_per_spec_6_5(a: int, b: int) -> None:
    (sa,) = struct.unpack(">q", mailbox_seq_to_bytes(a))
    (sb,) = struct.unpack(">q", mailbox_seq_to_bytes(b))
    assert sa >= 0
    assert (sa < sb) == (a < b)


@given(st.integers(0, MAX_EPOCH - 1), counters, counters)
def test_epoch_bump_outranks_any_offset_per_spec_6_5(epoch: int, old: int, new: int) -> None:
    assert compose_mailbox_seq(epoch + 1, new) > compose_mailbox_seq(epoch, old)


def test_seq_bucket_default_width_4096_per_app_b2() -> None:
    assert [seq_bucket(s) for s in (0, 4095, 4096, 10008)] == [0, 0, 1, 2]
    assert seq_bucket(100, 10) == 10
    assert seq_bucket((1 << 64) - 1) == ((1 << 64) - 1) // 4096


@pytest.mark.parametrize(("seq", "width"), [(-1, 4096), (1 << 64, 4096), (1, 0), (1, -4)])
def test_seq_bucket_rejects_invalid_inputs(seq: int, width: int) -> None:
    with pytest.raises(ValueError):
        seq_bucket(seq, width)
