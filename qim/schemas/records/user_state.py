"""A user's own conversation-state change on the shard log (spec 7.5, 12.9; direction.md 3).

Why a dispatch-log record and not a direct write: the MailboxNode's store is a pure function of
its dispatch partition, so MARK_READ, mark unread, clear history, delete, pin, mute and archive
are appended there by the owning MailboxNode (from a ``qim.user-requests`` request) and
materialized from the log like every dispatch: replay stays byte-identical and the change
becomes a CONTROL entry in the user's own mailbox (other devices sync it).

Values are tagged msgpack maps (``kind = "user_state"``), defaults omitted, unknown keys ignored.
``command_id`` (16 bytes) is the record's identity: the CONTROL entry's ``event_id`` is derived
from it exactly as from a ``dispatch_id``. ``committed_at`` is the appender's clock, recorded
in the log (the CONTROL entry's ``created_at``), never read again from a clock.
"""

from __future__ import annotations

import hashlib
from typing import Final, Literal, TypeAlias

import msgspec

from qim.schemas.frames.base import I32, U32, U64
from qim.schemas.hashing import hash_input

__all__ = ["USER_STATE_ACTIONS", "UserStateAction", "UserStateCommand", "command_id"]

UserStateAction: TypeAlias = Literal[
    "mark_read",
    "mark_unread",
    "clear_history",
    "delete",
    "pin",
    "mute",
    "archive",
    "notification_policy",
]
USER_STATE_ACTIONS: Final = frozenset(
    {
        "mark_read",
        "mark_unread",
        "clear_history",
        "delete",
        "pin",
        "mute",
        "archive",
        "notification_policy",
    }
)


class UserStateCommand(
    msgspec.Struct,
    kw_only=True,
    omit_defaults=True,
    frozen=True,
    forbid_unknown_fields=False,
    tag_field="kind",
    tag="user_state",
):
    """One user action on one conversation, at the user's MailboxShard partition.

    ``read_conversation_seq`` is MARK_READ's watermark; ``flag`` the new ``muted`` /
    ``archived``; ``pin_rank`` None = unpin; ``notification_policy`` its new value.
    ``origin_device_id`` is the device that asked: its own CONTROL entry is not echoed to it.
    """

    tenant_id: str
    user_id: str
    conversation_id: str
    action: str
    command_id: bytes
    target_mailbox_shard: U32
    committed_at: U64
    origin_device_id: str = ""
    read_conversation_seq: U64 = 0
    flag: bool = False
    pin_rank: I32 | None = None
    notification_policy: str = ""

    @property
    def key(self) -> bytes:
        """Kafka key ``(tenant, user_id)`` (direction.md 3: user-state commands)."""
        return hash_input(self.tenant_id, self.user_id)

    @property
    def partition(self) -> int:
        return self.target_mailbox_shard


def command_id(
    tenant_id: str, user_id: str, device_id: str, session_epoch: int, request_id: int, salt: str
) -> bytes:
    """A 16-byte identity from the request that caused the command (no random UUID)."""
    raw = msgspec.msgpack.encode((tenant_id, user_id, device_id, session_epoch, request_id, salt))
    return hashlib.blake2b(raw, digest_size=16, person=b"qim-user-state").digest()
