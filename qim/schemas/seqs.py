"""``mailbox_seq`` / ``room_seq`` (u64) and ``seq_bucket`` (spec §6.5, §6.6, §7.1, App. B.2).

Both sequences share one layout: ``0(1) | epoch(15) | counter(48)``. Bit 63 stays zero so the
value is also a non-negative signed bigint: phase-1 stores (ScyllaDB CQL ``bigint``) would
otherwise sort an epoch >= 0x8000 as negative and silently lose range scans. Hence epochs
above 0x7FFF are refused, never wrapped. Layout and bounds are immutable (§27.2.4).
"""

from __future__ import annotations

from typing import Final, NamedTuple

__all__ = [
    "DEFAULT_MESSAGE_SEQ_BUCKET_WIDTH",
    "MAX_COUNTER",
    "MAX_EPOCH",
    "SEQ_SIZE",
    "MailboxSeqParts",
    "RoomSeqParts",
    "compose_mailbox_seq",
    "compose_room_seq",
    "mailbox_seq_from_bytes",
    "mailbox_seq_to_bytes",
    "room_seq_from_bytes",
    "room_seq_to_bytes",
    "seq_bucket",
    "split_mailbox_seq",
    "split_room_seq",
]

MAX_EPOCH: Final = 0x7FFF
MAX_COUNTER: Final = (1 << 48) - 1
SEQ_SIZE: Final = 8
DEFAULT_MESSAGE_SEQ_BUCKET_WIDTH: Final = 4096  # App. B.2, immutable
_EPOCH_SHIFT: Final = 48
_MAX_SEQ: Final = (1 << 63) - 1  # bit 63 must be 0
_U64_MAX: Final = (1 << 64) - 1


def _check(value: int, maximum: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int")
    if not 0 <= value <= maximum:
        raise ValueError(f"{name} must be in [0, {maximum:#x}], got {value}")
    return value


def _compose(epoch: int, counter: int, epoch_name: str, counter_name: str) -> int:
    _check(epoch, MAX_EPOCH, epoch_name)
    _check(counter, MAX_COUNTER, counter_name)
    return (epoch << _EPOCH_SHIFT) | counter


def _split(seq: int, name: str) -> tuple[int, int]:
    _check(seq, _MAX_SEQ, name)
    return seq >> _EPOCH_SHIFT, seq & MAX_COUNTER


def _to_bytes(seq: int, name: str) -> bytes:
    return _check(seq, _MAX_SEQ, name).to_bytes(SEQ_SIZE, "big")


def _from_bytes(data: bytes, name: str) -> int:
    if len(data) != SEQ_SIZE:
        raise ValueError(f"{name} must be {SEQ_SIZE} bytes, got {len(data)}")
    return _check(int.from_bytes(data, "big"), _MAX_SEQ, name)


class MailboxSeqParts(NamedTuple):
    shard_epoch: int
    log_offset: int


class RoomSeqParts(NamedTuple):
    room_epoch: int
    counter: int


def compose_mailbox_seq(shard_epoch: int, log_offset: int) -> int:
    """``(shard_epoch << 48) | log_offset``: epoch bumps make seqs monotonic across takeovers."""
    return _compose(shard_epoch, log_offset, "shard_epoch", "log_offset")


def split_mailbox_seq(mailbox_seq: int) -> MailboxSeqParts:
    """Decode; a set bit 63 is rejected because no valid allocation can produce it."""
    return MailboxSeqParts(*_split(mailbox_seq, "mailbox_seq"))


def mailbox_seq_to_bytes(mailbox_seq: int) -> bytes:
    """8 bytes big-endian so raw byte order equals numeric order (§6.1)."""
    return _to_bytes(mailbox_seq, "mailbox_seq")


def mailbox_seq_from_bytes(data: bytes) -> int:
    return _from_bytes(data, "mailbox_seq")


def compose_room_seq(room_epoch: int, counter: int) -> int:
    """Same layout as mailbox_seq; ``room_epoch`` bumps on room migration/rebuild (§6.6)."""
    return _compose(room_epoch, counter, "room_epoch", "counter")


def split_room_seq(room_seq: int) -> RoomSeqParts:
    return RoomSeqParts(*_split(room_seq, "room_seq"))


def room_seq_to_bytes(room_seq: int) -> bytes:
    return _to_bytes(room_seq, "room_seq")


def room_seq_from_bytes(data: bytes) -> int:
    return _from_bytes(data, "room_seq")


def seq_bucket(conversation_seq: int, width: int = DEFAULT_MESSAGE_SEQ_BUCKET_WIDTH) -> int:
    """``MessageRecord`` partition bucket: deterministic, hole-free paging unit (§7.1)."""
    _check(conversation_seq, _U64_MAX, "conversation_seq")
    if isinstance(width, bool) or not isinstance(width, int) or width <= 0:
        raise ValueError(f"seq bucket width must be a positive int, got {width!r}")
    return conversation_seq // width
