"""Deterministic idempotency keys: ``dispatch_id`` (§7.8) and ``event_id`` (§6.7).

Primary and standby MailboxNodes must materialize byte-identical indexes, so both ids are pure
BLAKE3 functions of committed data -- never random, never wall-clock. The input tuples, the
hash and the ``event_ordinal`` map are immutable contract items (§27.2.4).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final

from qim.schemas.hashing import (
    blake3_digest,
    digest_u64,
    fixed_uint,
    hash_input,
    validate_identifier,
)
from qim.schemas.ids import message_id_to_bytes

__all__ = [
    "DISPATCH_ID_DOMAIN",
    "DISPATCH_ID_SIZE",
    "EVENT_ID_SIZE",
    "EventType",
    "dispatch_id",
    "dispatch_id_input",
    "event_id",
    "event_id_input",
    "event_id_to_bytes",
    "event_ordinal",
]

DISPATCH_ID_DOMAIN: Final = "qim.group-dispatch.v1"
"""Domain tag; as a non-last text field it is followed by one 0x00 (22 bytes, §7.8)."""
DISPATCH_ID_SIZE: Final = 16
EVENT_ID_SIZE: Final = 8
_SHARD_FIELD_SIZE: Final = 4


class EventType(IntEnum):
    """Event kinds in an event group; the value IS the frozen ``event_ordinal`` (§6.7)."""

    MESSAGE = 0
    MENTION = 1
    MEMBERSHIP = 2
    CONTROL = 3


def event_ordinal(event_type: EventType) -> int:
    """The u8 priority used in ordering keys and in the event_id input."""
    return int(EventType(event_type))


def dispatch_id_input(message_id: int, target_mailbox_shard: int) -> bytes:
    """``"qim.group-dispatch.v1" 0x00 || message_id_be16 || shard_be4`` (42 bytes)."""
    return hash_input(
        DISPATCH_ID_DOMAIN,
        message_id_to_bytes(message_id),
        fixed_uint(target_mailbox_shard, _SHARD_FIELD_SIZE),
    )


def dispatch_id(message_id: int, target_mailbox_shard: int) -> bytes:
    """One id per (message, target MailboxShard): the MailboxNode dedup key across replays."""
    return blake3_digest(dispatch_id_input(message_id, target_mailbox_shard))[:DISPATCH_ID_SIZE]


def event_id_input(
    tenant_id: str, dispatch_id: bytes, user_id: str, event_type: EventType
) -> bytes:
    """``tenant || 0x00 || dispatch_id(16) || user || 0x00 || u8(event_ordinal)``."""
    validate_identifier(tenant_id, "tenant_id")
    validate_identifier(user_id, "user_id")
    if not isinstance(dispatch_id, bytes) or len(dispatch_id) != DISPATCH_ID_SIZE:
        raise ValueError(f"dispatch_id must be {DISPATCH_ID_SIZE} raw bytes")
    return hash_input(tenant_id, dispatch_id, user_id, fixed_uint(event_ordinal(event_type), 1))


def event_id(tenant_id: str, dispatch_id: bytes, user_id: str, event_type: EventType) -> int:
    """u64 = first 8 digest bytes big-endian; unique per (user, dispatch, event_type)."""
    return digest_u64(event_id_input(tenant_id, dispatch_id, user_id, event_type))


def event_id_to_bytes(value: int) -> bytes:
    """8 bytes big-endian, the form stored in clustering keys."""
    return fixed_uint(value, EVENT_ID_SIZE)
