"""Control and state frames, opcodes 0x0400-0x04FF.

MARK_READ, RECALL, EDIT, TYPING, PRESENCE_SUB, READ_SYNC and the [ext] CONVERSATION_STATE
(0x0407: mark unread, clear history, delete, pin, mute, archive, notification policy).
TYPING and PRESENCE_SUB are bidirectional on one opcode; their bodies differ by direction,
so each has an uplink model (``Typing``, ``PresenceSub``) and a downlink model
(``TypingDown``, ``PresenceSubDown``) and the decoder picks by which side it runs on.
"""

from __future__ import annotations

from typing import Final

from qim.schemas.frames.base import I32, U32, U64, Body

__all__ = [
    "CONVERSATION_STATE_ACTIONS",
    "NOTIFICATION_POLICIES",
    "ConversationState",
    "Edit",
    "MarkRead",
    "PresenceEntry",
    "PresenceSub",
    "PresenceSubDown",
    "ReadSync",
    "Recall",
    "Typing",
    "TypingDown",
]


class MarkRead(Body):
    """MARK_READ (A.3 #7): monotonic, only forward."""

    conversation_id: str = ""
    read_conversation_seq: U64 = 0


CONVERSATION_STATE_ACTIONS: Final = frozenset(
    {"mark_unread", "clear_history", "delete", "pin", "mute", "archive", "notification_policy"}
)
"""CONVERSATION_STATE ``action`` values: the ``UserStateAction`` strings except mark_read,
which keeps its own frame (MARK_READ)."""

NOTIFICATION_POLICIES: Final = ("ALL", "MENTION_ONLY", "NONE")
"""``UserConversationState.notification_policy`` values (16.2)."""


class ConversationState(Body):
    """CONVERSATION_STATE uplink [ext] (0x0407): one of the user's own 12.9 state changes.

    Why a frame: App. A has none for mark unread / clear history / delete / pin / mute /
    archive / notification policy, yet 12.9 puts each in the mailbox as a CONTROL entry. No
    reply (like MARK_READ): the other devices learn it from that entry and the session list.
    ``flag`` is the new ``muted`` / ``archived``; ``pin_rank`` None with action "pin" unpins;
    ``notification_policy`` is one of :data:`NOTIFICATION_POLICIES`.
    """

    conversation_id: str = ""
    action: str = ""
    flag: bool = False
    pin_rank: I32 | None = None
    notification_policy: str = ""


class Recall(Body):
    """RECALL (A.3 #8): carries the locating coordinate, so no MessageIndex lookup."""

    conversation_id: str = ""
    target_conversation_seq: U64 = 0


class Edit(Body):
    """EDIT (A.3 #9)."""

    conversation_id: str = ""
    target_conversation_seq: U64 = 0
    new_payload: bytes = b""


class Typing(Body):
    """TYPING uplink (A.3 #10): ephemeral, never in the mailbox."""

    conversation_id: str = ""


class TypingDown(Body):
    """TYPING downlink (A.4 #15): request_id 0; no stop frame, the indicator expires."""

    conversation_id: str = ""
    user_id: str = ""
    expires_in_ms: U32 = 0


class PresenceSub(Body):
    """PRESENCE_SUB uplink (A.3 #11): action subscribe|unsubscribe|replace.

    §13.2: the body names a ``conversation_id`` (all its members) OR ``user_ids[]``, never
    both. A.3 lists only ``targets[]``: they are the user ids here, and ``conversation_id``
    [ext] is the other form (omitted when empty, so a user-id request keeps A.3's shape).
    At most ``presence_sub_max_targets`` (200) targets, checked by the decoder (RATE_LIMITED,
    §13.2: the set is never silently truncated).
    """

    action: str = "subscribe"
    targets: tuple[str, ...] = ()
    conversation_id: str = ""


class PresenceEntry(Body):
    """One ``PRESENCE_SUB.entries[]`` item; ``state`` is free-form UI state (e.g. "online")."""

    user_id: str = ""
    state: str = ""
    last_active_at: U64 = 0


class PresenceSubDown(Body):
    """PRESENCE_SUB downlink (A.4 #16): full snapshot first, then changed entries only."""

    entries: tuple[PresenceEntry, ...] = ()


class ReadSync(Body):
    """READ_SYNC (A.4 #4): cross-device read watermark; deliberately no unread_count."""

    conversation_id: str = ""
    read_conversation_seq: U64 = 0
