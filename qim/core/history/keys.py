"""MessageStore key layout: one ordered keyspace where a range scan walks a conversation by seq.

Why this layout (spec 6.1, 7.0, 7.1): RocksDB orders keys byte-wise, so the key is the
conversation prefix followed by ``conversation_seq`` as 8 bytes big-endian -- byte order equals
numeric order, and a forward scan is ascending seq, a reverse scan descending::

    key = b"m"                      1 byte  keyspace tag: MessageRecord (room for other kinds)
          tenant_id  UTF-8 + 0x00   text, NUL-terminated (identifiers never contain NUL)
          conversation_id UTF-8 + 0x00
          conversation_seq          8 bytes, unsigned big-endian

Both ids are NUL-terminated (unlike ``hash_input``'s last field), so one conversation's prefix
is never a prefix of another's ("g1" vs "g10"). The ScyllaDB ``seq_bucket`` partition of spec
7.1 is not needed for an ordered store: the bucket is kept as a column of the record
(:func:`qim.schemas.seq_bucket`), and the "scan empty buckets" bound
``history_max_empty_bucket_scan`` has nothing to bound here -- a reverse seek skips holes.
"""

from __future__ import annotations

from typing import Final

from qim.schemas.hashing import validate_identifier

__all__ = [
    "MAX_SEQ",
    "MESSAGE_KEYSPACE",
    "SEQ_KEY_SIZE",
    "conversation_prefix",
    "message_key",
    "seq_bytes",
    "seq_from_key",
]

MESSAGE_KEYSPACE: Final = b"m"
SEQ_KEY_SIZE: Final = 8
MAX_SEQ: Final = (1 << 64) - 1


def conversation_prefix(tenant_id: str, conversation_id: str) -> bytes:
    """Every MessageRecord key of one conversation starts with these bytes."""
    validate_identifier(tenant_id, "tenant_id")
    validate_identifier(conversation_id, "conversation_id")
    return (
        MESSAGE_KEYSPACE
        + tenant_id.encode("utf-8")
        + b"\x00"
        + conversation_id.encode("utf-8")
        + b"\x00"
    )


def message_key(tenant_id: str, conversation_id: str, conversation_seq: int) -> bytes:
    """The key of ``(tenant_id, conversation_id, conversation_seq)``."""
    return conversation_prefix(tenant_id, conversation_id) + seq_bytes(conversation_seq)


def seq_bytes(conversation_seq: int) -> bytes:
    """``conversation_seq`` as 8 bytes big-endian (u64)."""
    if not 0 <= conversation_seq <= MAX_SEQ:
        raise ValueError(f"conversation_seq must be a u64, got {conversation_seq}")
    return conversation_seq.to_bytes(SEQ_KEY_SIZE, "big")


def seq_from_key(key: bytes) -> int:
    """The ``conversation_seq`` at the end of a message key."""
    return int.from_bytes(key[-SEQ_KEY_SIZE:], "big")
