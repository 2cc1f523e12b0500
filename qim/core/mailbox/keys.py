"""MailboxStore key layout: one ordered keyspace per MailboxShard, user data under user prefixes.

Why this layout (spec 2.3 criterion 1, 7.0, 9.1; direction.md 4.2): RocksDB orders keys
byte-wise, so a user's entries sit under one prefix in ``(mailbox_seq, event_ordinal,
event_id)`` order and PULL_MAILBOX is one seek plus one read per returned entry -- it never
touches another user's keys. Every other kind of shard state lives under its own 1-byte tag,
so one WriteBatch can carry all of it (entries, DispatchProgress, W[], W_floor, dedup) and a
scan of one kind never walks another. Integers are big-endian so byte order is numeric order;
text ids are UTF-8 and NUL-terminated where a longer id could otherwise extend a shorter one
("u1" vs "u10"); identifiers never contain NUL (``validate_identifier``). Grammar::

    E tenant 00 user 00 mailbox_seq:u64 event_ordinal:u8 event_id:u64  -> StoredEntry
      UserMailboxEntry (7.3). ``E tenant 00 user 00`` is the user prefix PULL_MAILBOX scans.
    B tenant 00 message_id:16                                         -> StoredBody
      the body, once per shard for read-time join (direction 4.4); absent for inline bodies.
    D tenant 00 dispatch_id:16                                        -> DispatchProgress
      the dispatch_id dedup record IS the DispatchProgress row (10.1 step 7 dedups against it).
    F tenant 00 conversation_id                                       -> u64 max fencing_epoch
      the 19.2.1 check point 2 filter, monotone per (tenant, conversation).
    S tenant 00 group_id 00 version:u64                               -> SliceHeader
      written once, when every chunk of the version's slice for this shard is in (7.9).
    S tenant 00 group_id 00 version:u64 chunk_index:u32               -> MemberSliceRecord
      one chunk as it arrived on the dispatch log (direction 4.3), kept byte for byte.
    V tenant 00 group_id 00 user 00 joined_at:u64                     -> u64 left_at
      a closed membership interval some slice listed (seed 003 M-5); facts, first copy wins.
    P mailbox_seq:u64                                                 -> GroupDispatch
      a dispatch waiting for its slice; materialized at this seq once the slice completes.
    Z tenant 00 user 00 conversation_id 00 mailbox_seq:u64 event_ordinal:u8 event_id:u64
      -> StoredEntry: a trimmed entry the session fold still needs (``carry``; bounded per
      conversation, never trimmed itself).
    T tenant 00 user                                                  -> TrimState
      per-user trim lines; effective_trim(u) = max of them, monotone (6.5.2, 18.3.3).
    C tenant 00 user                                                  -> u64 entry count
      live entries of the user, for the max_mailbox_entries_per_user backstop (18.3.3).
    X expire_at:u64 target_key                                        -> empty
      expiry index: ``target_key`` (a B or D key) is deleted once log time reaches expire_at.
    W                                                                 -> u64 * lane_count
      materialized_watermark[lane] (6.5.1, 9.2.2).
    L                                                                 -> u64 * lane_count
      W_floor[lane], the published lower bound checked at takeover (10.4.2 (2)).
    M                                                                 -> ShardMeta
      applied mailbox_seq, shard_epoch and log time of the fold.

The session list's keyspaces (``U`` UserConversationState, ``J`` projection + badge, ``R``
message facts for the recount) are defined in ``qim.core.mailbox.sessions``.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

from qim.schemas.hashing import validate_identifier

__all__ = [
    "BODY",
    "COUNT",
    "DEPARTURE",
    "DISPATCH",
    "ENTRY",
    "EXPIRY",
    "FENCING",
    "FLOOR",
    "META",
    "PENDING",
    "SLICE",
    "TRIM",
    "WATERMARKS",
    "EntryKey",
    "body_key",
    "count_key",
    "departure_group_prefix",
    "departure_key",
    "dispatch_key",
    "entry_key",
    "entry_tail",
    "expiry_key",
    "expiry_target",
    "fencing_key",
    "parse_departure_key",
    "parse_entry_key",
    "parse_user_key",
    "pending_key",
    "pending_seq",
    "slice_chunk_key",
    "slice_version_prefix",
    "trim_key",
    "u64",
    "user_entry_prefix",
]

ENTRY: Final = b"E"
BODY: Final = b"B"
DISPATCH: Final = b"D"
FENCING: Final = b"F"
SLICE: Final = b"S"
DEPARTURE: Final = b"V"
PENDING: Final = b"P"
TRIM: Final = b"T"
COUNT: Final = b"C"
EXPIRY: Final = b"X"
WATERMARKS: Final = b"W"
FLOOR: Final = b"L"
META: Final = b"M"

_U64: Final = struct.Struct(">Q")
_ENTRY_TAIL: Final = struct.Struct(">QBQ")  # mailbox_seq, event_ordinal, event_id
_CHUNK: Final = struct.Struct(">I")


def u64(value: int) -> bytes:
    """8 bytes big-endian."""
    return _U64.pack(value)


def _text(value: str, name: str) -> bytes:
    validate_identifier(value, name)
    return value.encode("utf-8")


def user_entry_prefix(tenant_id: str, user_id: str) -> bytes:
    """Every entry key of one user starts with these bytes, and no other user's key does."""
    return ENTRY + _text(tenant_id, "tenant_id") + b"\x00" + _text(user_id, "user_id") + b"\x00"


def entry_key(
    tenant_id: str, user_id: str, mailbox_seq: int, event_ordinal: int, event_id: int
) -> bytes:
    """The key of one UserMailboxEntry (primary key order of spec 7.3)."""
    return user_entry_prefix(tenant_id, user_id) + entry_tail(mailbox_seq, event_ordinal, event_id)


def entry_tail(mailbox_seq: int, event_ordinal: int, event_id: int) -> bytes:
    """The fixed 17-byte clustering tail of an entry key (also the carry's, ``carry``)."""
    return _ENTRY_TAIL.pack(mailbox_seq, event_ordinal, event_id)


class EntryKey(NamedTuple):
    """The clustering part of an entry key; sorts as the key does."""

    mailbox_seq: int
    event_ordinal: int
    event_id: int


def parse_entry_key(key: bytes) -> EntryKey:
    """The clustering part of an entry key (the fixed 17-byte tail)."""
    return EntryKey(*_ENTRY_TAIL.unpack(key[-_ENTRY_TAIL.size :]))


def body_key(tenant_id: str, message_id: bytes) -> bytes:
    if len(message_id) != 16:
        raise ValueError("message_id is 16 bytes")
    return BODY + _text(tenant_id, "tenant_id") + b"\x00" + message_id


def dispatch_key(tenant_id: str, dispatch_id: bytes) -> bytes:
    if len(dispatch_id) != 16:
        raise ValueError("dispatch_id is 16 bytes")
    return DISPATCH + _text(tenant_id, "tenant_id") + b"\x00" + dispatch_id


def fencing_key(tenant_id: str, conversation_id: str) -> bytes:
    return FENCING + _text(tenant_id, "tenant_id") + b"\x00" + _text(conversation_id, "conv")


def slice_version_prefix(tenant_id: str, group_id: str, version: int) -> bytes:
    """The SliceHeader key of a version; its chunk keys extend it by 4 bytes."""
    return (
        SLICE
        + _text(tenant_id, "tenant_id")
        + b"\x00"
        + _text(group_id, "group_id")
        + b"\x00"
        + u64(version)
    )


def slice_chunk_key(tenant_id: str, group_id: str, version: int, chunk_index: int) -> bytes:
    return slice_version_prefix(tenant_id, group_id, version) + _CHUNK.pack(chunk_index)


def departure_group_prefix(tenant_id: str, group_id: str) -> bytes:
    """Every departure key of one group on this shard starts with these bytes."""
    return (
        DEPARTURE + _text(tenant_id, "tenant_id") + b"\x00" + _text(group_id, "group_id") + b"\x00"
    )


def departure_key(tenant_id: str, group_id: str, user_id: str, joined_at: int) -> bytes:
    return (
        departure_group_prefix(tenant_id, group_id)
        + _text(user_id, "user_id")
        + b"\x00"
        + u64(joined_at)
    )


def parse_departure_key(key: bytes, prefix: bytes) -> tuple[str, int]:
    """``(user_id, joined_at)`` of a departure key under ``prefix`` (its group's)."""
    user, joined = key[len(prefix) : -9], key[-8:]
    return user.decode("utf-8"), int(_U64.unpack(joined)[0])


def pending_key(mailbox_seq: int) -> bytes:
    return PENDING + u64(mailbox_seq)


def pending_seq(key: bytes) -> int:
    return int(_U64.unpack(key[1:9])[0])


def _user_key(tag: bytes, tenant_id: str, user_id: str) -> bytes:
    return tag + _text(tenant_id, "tenant_id") + b"\x00" + _text(user_id, "user_id")


def trim_key(tenant_id: str, user_id: str) -> bytes:
    return _user_key(TRIM, tenant_id, user_id)


def count_key(tenant_id: str, user_id: str) -> bytes:
    return _user_key(COUNT, tenant_id, user_id)


def parse_user_key(key: bytes) -> tuple[str, str]:
    """``(tenant_id, user_id)`` of a T or C key."""
    tenant, user = key[1:].split(b"\x00", 1)
    return tenant.decode("utf-8"), user.decode("utf-8")


def expiry_key(expire_at: int, target_key: bytes) -> bytes:
    return EXPIRY + u64(expire_at) + target_key


def expiry_target(key: bytes) -> tuple[int, bytes]:
    """``(expire_at, target_key)`` of an expiry index key."""
    return int(_U64.unpack(key[1:9])[0]), key[9:]
