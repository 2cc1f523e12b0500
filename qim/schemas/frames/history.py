"""History and session-list frames, opcodes 0x0300-0x03FF.

PULL_HISTORY, HISTORY_BATCH, PULL_SESSION_LIST, SESSION_LIST_BATCH, SESSION_DELTA, BADGE_UPDATE.
SESSION_DELTA and BADGE_UPDATE are idempotent absolute-value frames: no deltas on the wire.
"""

from __future__ import annotations

from qim.schemas.frames.base import I32, U8, U32, U64, U128, U128_ZERO, Body
from qim.schemas.frames.mailbox import MediaMetadata
from qim.schemas.frames.reactions import MessageReactions

__all__ = [
    "BadgeUpdate",
    "HistoryBatch",
    "HistoryMessage",
    "PullHistory",
    "PullSessionList",
    "SessionDelta",
    "SessionEntry",
    "SessionListBatch",
]


class PullHistory(Body):
    """PULL_HISTORY (A.3 #5): ``direction`` is "older" or "newer" (§9.5.3)."""

    conversation_id: str = ""
    direction: str = "older"
    anchor_conversation_seq: U64 = 0
    limit: U32 = 0
    max_bytes: U32 = 0


class HistoryMessage(Body):
    """One ``HISTORY_BATCH.messages[]`` item: §7.1 MessageRecord minus server-only columns.

    A.4 names only ``messages[]``; the shape here (no tenant_id, seq_bucket, retention_class,
    dek_id) is this codec's choice. ``state`` is NORMAL|RECALLED|EDITED|DELETED.
    """

    conversation_seq: U64 = 0
    message_id: U128 = U128_ZERO
    last_activity_id: U128 = U128_ZERO
    sender_id: str = ""
    sender_device_id: str = ""
    client_message_id: str | None = None
    message_type: U8 = 0
    custom_type: str | None = None
    schema_version: U32 | None = None
    payload_or_ciphertext: bytes | None = None
    media_metadata: MediaMetadata | None = None
    reply_to_conversation_seq: U64 | None = None
    mention_targets: tuple[str, ...] = ()
    state: str = "NORMAL"
    recall_event_conversation_seq: U64 | None = None
    edited_at_activity_id: U128 | None = None
    created_at: U64 = 0
    reactions: MessageReactions | None = None
    """The message's reaction aggregate (13.6.4 read-time join); None when it has none."""


class HistoryBatch(Body):
    """HISTORY_BATCH (A.4 #7): the two boundary seqs give the client an O(1) self-check."""

    messages: tuple[HistoryMessage, ...] = ()
    latest_conversation_seq: U64 = 0
    earliest_available_conversation_seq: U64 = 0
    has_more: bool = False


class PullSessionList(Body):
    """PULL_SESSION_LIST (A.3 #6): ``page_cursor`` is the server-signed opaque cursor."""

    snapshot_revision: U64 = 0
    page_cursor: bytes = b""
    limit: U32 = 0


class SessionEntry(Body):
    """One ``SESSION_LIST_BATCH.sessions[]`` item (A.4 #8).

    ``write_policy`` is "always" or "mention_only"; mention_only always carries
    ``delivered_conversation_seq`` (None otherwise). ``pin_rank`` None = not pinned.
    """

    conversation_id: str = ""
    latest_conversation_seq: U64 = 0
    last_activity_id: U128 = U128_ZERO
    last_message_id: U128 = U128_ZERO
    preview_or_placeholder: bytes = b""
    unread_count: U32 = 0
    unread_exact: bool = False
    mention_count: U32 = 0
    mention_first_conversation_seq: U64 = 0
    pin_rank: I32 | None = None
    muted: bool = False
    archived: bool = False
    write_policy: str = "always"
    delivered_conversation_seq: U64 | None = None
    read_conversation_seq: U64 = 0


class SessionListBatch(Body):
    """SESSION_LIST_BATCH (A.4 #8)."""

    sessions: tuple[SessionEntry, ...] = ()
    snapshot_revision: U64 = 0
    next_page_cursor: bytes = b""
    has_more: bool = False
    projection_complete: bool = False


class SessionDelta(Body):
    """SESSION_DELTA (A.4 #9): absolute values, no unread_delta (§12.6.2)."""

    conversation_id: str = ""
    driving_event_id: U64 = 0
    driving_mailbox_seq: U64 = 0
    projection_mailbox_seq: U64 = 0
    latest_conversation_seq: U64 = 0
    last_activity_id: U128 = U128_ZERO
    last_message_id: U128 = U128_ZERO
    preview_or_placeholder: bytes = b""
    unread_count: U32 = 0
    unread_exact: bool = False
    mention_count: U32 = 0
    mention_first_conversation_seq: U64 = 0


class BadgeUpdate(Body):
    """BADGE_UPDATE (A.4 #10): same source as the offline aps.badge (UserBadgeState)."""

    total_unread: U32 = 0
    total_mention: U32 = 0
    muted_unread: U32 = 0
    badge_projection_mailbox_seq: U64 = 0
