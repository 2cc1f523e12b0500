"""Mailbox sync frames, opcodes 0x0100-0x01FF, and the A.4.1 sync entry they share.

PULL_MAILBOX, MAILBOX_BATCH, SYNC_COMPLETE, ONLINE_READY. :class:`SyncEntry` is the one struct
behind both ``MAILBOX_BATCH.entries[]`` and ``PUSH_EVENTS.events[]`` so the client parses,
dedups and orders pulled and pushed events on one code path (A.4.1).
"""

from __future__ import annotations

import msgspec

from qim.schemas.frames.base import U8, U32, U64, U128, U128_ZERO, Body
from qim.schemas.frames.reactions import MessageReactions

__all__ = [
    "MailboxBatch",
    "MediaMetadata",
    "OnlineReady",
    "PullMailbox",
    "SyncComplete",
    "SyncEntry",
]


class MediaMetadata(Body):
    """§7.1 media reference: the original never travels in a frame, only this (§13.1)."""

    object_id: str = ""
    mime: str = ""
    byte_size: U64 = msgspec.field(default=0, name="bytes")
    width: U32 = 0
    height: U32 = 0
    duration_ms: U32 = 0
    thumbnail: bytes = b""  # <= media_thumbnail_max_bytes (32 KiB)
    blurhash: str = ""
    checksum: bytes = b""


class SyncEntry(Body):
    """A.4.1 entry: the mailbox reference (= §7.3 UserMailboxEntry) plus the optional body.

    ``event_type`` / ``mention_type`` / ``flags`` are plain ints: an entry with an unknown
    ``event_type`` must still decode and still count toward covered_through_seq (§27.1.2).
    ``body_included=False`` means governance removal, retention, or the batch byte budget -
    never a lost message; the client fetches it with PULL_HISTORY.
    """

    # -- mailbox reference --
    mailbox_seq: U64 = 0
    event_ordinal: U8 = 0
    event_id: U64 = 0
    event_type: U8 = 0  # EventType
    message_id: U128 = U128_ZERO
    conversation_id: str = ""
    conversation_seq: U64 = 0
    last_activity_id: U128 = U128_ZERO
    sender_id: str = ""
    visibility_floor_conversation_seq: U64 = 0
    flags: U8 = 0  # EntryFlags
    mention_type: U8 = 0  # MentionType
    created_at: U64 = 0  # GroupDispatch.committed_at, epoch ms
    # -- optional reference fields, omitted when absent --
    client_message_id: str | None = None
    origin_device_id: str | None = None
    target_message_id: U128 | None = None
    target_conversation_seq: U64 | None = None
    target_sender_id: str | None = None
    target_flags: U8 | None = None
    target_mention_type: U8 | None = None
    # -- body part --
    body_included: bool = False
    message_type: U8 | None = None
    custom_type: str | None = None
    schema_version: U32 | None = None
    payload_or_ciphertext: bytes | None = None
    media_metadata: MediaMetadata | None = None
    # -- read-time join beyond A.4.1 --
    reactions: MessageReactions | None = None
    """The message's reaction aggregate as the shard's copy holds it (13.6: mailbox pulls
    return it with the message, like ``HistoryMessage.reactions``); None when it has none.
    ``self_reaction_keys`` stay empty here: the shard keeps no per-user detail, PULL_HISTORY
    fills them. Applied like a REACTION_UPDATE: only if ``summary_version`` is newer."""


class PullMailbox(Body):
    """PULL_MAILBOX (A.3 #2): ``up_to_seq=0`` = up to the lane's current watermark."""

    after_seq: U64 = 0
    up_to_seq: U64 = 0
    max_items: U32 = 0
    max_bytes: U32 = 0
    acked_seq: U64 = 0  # replaces v1 MAILBOX_ACK


class MailboxBatch(Body):
    """MAILBOX_BATCH (A.4 #2): cut only at mailbox_seq boundaries; continue while has_more."""

    entries: tuple[SyncEntry, ...] = ()
    covered_through_seq: U64 = 0
    lane_watermark: U64 = 0
    has_more: bool = False


class SyncComplete(Body):
    """SYNC_COMPLETE (A.3 #3): must equal the sync_to_seq of AUTH_OK, else SYNC_INCOMPLETE."""

    sync_to_seq: U64 = 0


class OnlineReady(Body):
    """ONLINE_READY (A.4 #3): no fields; releases the login barrier."""
