"""Stored values of the MailboxStore: what each key of ``keys.py`` maps to, byte-exact.

Why msgpack arrays (``array_like``) for the per-user rows: a 100k-member group message writes
100k entries, so ``entry_ondisk_bytes`` (spec 7.3, 25) is a capacity factor; positional fields
drop the field names a map would repeat in every row. Fields are only ever appended, trailing
defaults are omitted, and unknown trailing fields are ignored, so an older build reads a newer
row. Encoding is deterministic (struct field order), which the byte-identical replay needs.
Scalars that a hot path reads alone (counts, fencing max, watermark vectors) are plain
big-endian integers instead.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final, TypeVar

import msgspec

from qim.schemas.frames.base import U8, U32, U64, U128

__all__ = [
    "DispatchProgress",
    "ProgressState",
    "ShardMeta",
    "SliceHeader",
    "StoredBody",
    "StoredEntry",
    "TrimState",
    "decode_u64",
    "decode_value",
    "decode_vector",
    "encode_u64",
    "encode_value",
    "encode_vector",
]


class _Row(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True, kw_only=True):
    """Positional msgpack array; append-only field list (see the module docstring)."""


class StoredEntry(_Row, frozen=True, kw_only=True):
    """A UserMailboxEntry without its key fields (spec 7.3, Part 2).

    The key holds ``mailbox_seq``, ``event_ordinal`` and ``event_id``. ``inline_*`` are set only
    when the dispatch had ``inline_body`` (ADR-0005); otherwise the body is joined at read time
    from the shard's one copy (``StoredBody``). ``target_*`` and ``amend_action`` are set only
    on a recall / edit / delete CONTROL entry (13.4.1 step 5): ``target_mention_type`` is this
    recipient's; ``amend_action`` is not on the wire (A.4.1) but the projection rebuild needs
    it to tell a recall from an edit (``sessions``).
    """

    event_type: U8
    message_id: U128
    conversation_id: str
    conversation_seq: U64
    last_activity_id: U128
    sender_id: str
    visibility_floor_conversation_seq: U64 = 0
    flags: U8 = 0
    mention_type: U8 = 0
    created_at: U64 = 0
    client_message_id: str | None = None
    origin_device_id: str | None = None
    inline: bool = False
    inline_message_type: U8 = 0
    inline_custom_type: str = ""
    inline_schema_version: U32 = 0
    inline_payload: bytes = b""
    target_message_id: U128 | None = None
    target_conversation_seq: U64 | None = None
    target_sender_id: str | None = None
    target_flags: U8 | None = None
    target_mention_type: U8 | None = None
    amend_action: str = ""


class StoredBody(_Row, frozen=True, kw_only=True):
    """The body of one message, stored once per shard for the read-time join (direction 4.4)."""

    conversation_id: str
    conversation_seq: U64
    message_type: U8 = 0
    custom_type: str = ""
    schema_version: U32 = 0
    payload: bytes = b""


class ProgressState:
    """``DispatchProgress.state``; plain ints so a newer state still decodes."""

    DONE: Final = 0
    PENDING: Final = 1


class DispatchProgress(_Row, frozen=True, kw_only=True):
    """The dedup record and progress of one dispatch on this shard (spec 7.8, 10.1 step 7).

    One row instead of the spec's ``(dispatch, lane)`` rows: a batch's entries and this row
    commit in one WriteBatch (10.4.1 phase 2), so there are no per-lane chunks to track.
    ``mailbox_seq`` is the seq of the first offset the dispatch was seen at; ``lane_mask`` has
    bit ``j`` set iff lane ``j`` got entries; ``expire_at`` is when dedup by this row ends.
    """

    mailbox_seq: U64
    state: U8 = ProgressState.DONE
    entries_written: U32 = 0
    lane_mask: bytes = b""
    expire_at: U64 = 0


class TrimState(_Row, frozen=True, kw_only=True):
    """Per-user trim lines (spec 6.5.2, 18.3.3): every entry at or below them may be gone.

    ``ttl_trim_seq`` is raised by time-window trim, ``user_trim_seq`` by the entry-cap backstop;
    ``effective_trim(u)`` is their max. Both only ever grow.
    """

    ttl_trim_seq: U64 = 0
    user_trim_seq: U64 = 0

    @property
    def effective(self) -> int:
        return max(self.ttl_trim_seq, self.user_trim_seq)


class SliceHeader(_Row, frozen=True, kw_only=True):
    """Completion marker of one version's slice for this shard, written by the completing chunk."""

    chunk_count: U32
    shard_member_count: U32 = 0
    member_count: U32 = 0
    completed_at: U64 = 0  # log time (max committed_at folded so far), never a wall clock


class ShardMeta(_Row, frozen=True, kw_only=True):
    """Where the fold stands: the last mailbox_seq applied, its epoch and the log time."""

    applied_seq: U64 = 0
    shard_epoch: U64 = 0
    log_now_ms: U64 = 0


_ENCODER: Final = msgspec.msgpack.Encoder()
_T = TypeVar("_T", bound=_Row)
_U64: Final = struct.Struct(">Q")


def encode_value(value: _Row) -> bytes:
    return _ENCODER.encode(value)


_DECODERS: dict[type[_Row], msgspec.msgpack.Decoder[_Row]] = {}


def decode_value(data: bytes, kind: type[_T]) -> _T:
    """Decode a stored row; one cached decoder per row type (entries decode in bulk)."""
    decoder = _DECODERS.get(kind)
    if decoder is None:
        decoder = _DECODERS[kind] = msgspec.msgpack.Decoder(kind)
    value = decoder.decode(data)
    assert isinstance(value, kind)
    return value


def encode_u64(value: int) -> bytes:
    return _U64.pack(value)


def decode_u64(data: bytes | None) -> int:
    """A stored u64; an absent key reads as 0."""
    return 0 if data is None else int(_U64.unpack(data)[0])


def encode_vector(values: Sequence[int]) -> bytes:
    """``lane_count`` u64 big-endian values back to back (W and W_floor)."""
    return b"".join(_U64.pack(v) for v in values)


def decode_vector(data: bytes | None, lane_count: int) -> tuple[int, ...]:
    """An absent vector is all zeros ("nothing materialized"); a wrong length is corruption."""
    if data is None:
        return (0,) * lane_count
    if len(data) != 8 * lane_count:
        raise ValueError(f"watermark vector has {len(data) // 8} lanes, expected {lane_count}")
    return tuple(v for (v,) in _U64.iter_unpack(data))
