"""Room ids: ``"r:" + name`` (ours; the spec leaves ``room_id`` opaque).

The prefix makes a room a property of the id, like ``d:`` / ``g:`` conversations
(``qim.core.conversation.ids``): a SEND_MESSAGE whose ``conversation_id`` is a room id goes to
the RoomWriter, never to the ConversationWriter, with no lookup. A room is never a
conversation: it has no ``conversation_seq``, no mailbox entries, no session row (14.1).
"""

from __future__ import annotations

from typing import Final

from qim.schemas.hashing import blake3_digest
from qim.schemas.records.rooms import room_key

__all__ = ["MAX_ROOM_ID_BYTES", "ROOM_PREFIX", "is_room_id", "room_key", "room_partition"]

ROOM_PREFIX: Final = "r:"
MAX_ROOM_ID_BYTES: Final = 128


def is_room_id(room_id: str) -> bool:
    """A well-formed room id: the prefix, a non-empty name, <= 128 UTF-8 bytes, no NUL."""
    if not room_id.startswith(ROOM_PREFIX) or len(room_id) == len(ROOM_PREFIX):
        return False
    if "\x00" in room_id:
        return False
    return len(room_id.encode("utf-8")) <= MAX_ROOM_ID_BYTES


def room_partition(tenant_id: str, room_id: str, partition_count: int) -> int:
    """``be_u64(blake3(room_key)[0:8]) mod partition_count``: every gateway and the admin
    tooling pick the same RoomWriter partition for a room, with no client partitioner."""
    if partition_count <= 0:
        raise ValueError("partition_count must be positive")
    digest = blake3_digest(room_key(tenant_id, room_id))
    return int.from_bytes(digest[:8], "big") % partition_count
