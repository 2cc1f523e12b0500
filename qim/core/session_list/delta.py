"""SESSION_DELTA / BADGE_UPDATE: built from the fold, merged by replacement, applied by version.

Why absolute values only (12.6.1-12.6.3, INV-25): the channel may drop and replay frames, so a
frame carries the row's values plus ``projection_mailbox_seq`` and a receiver overwrites only
with a strictly newer version. Nothing here ever adds counts: the server's merge window keeps
the latest frame per conversation, and the client's apply is compare-and-overwrite (26.4.4).

The displayed unread (manual mark => >= 1, inexact; 12.5.1) is applied when a frame is built,
like the preview from ``ConversationHead``: the row itself stores neither (INV-03).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from qim.core.session_list.projection import FoldResult
from qim.core.session_list.rows import SessionRow
from qim.core.session_list.state import UserConversationState
from qim.core.session_list.unread import display_unread
from qim.schemas.frames.base import u128_to_bytes
from qim.schemas.frames.control import ReadSync
from qim.schemas.frames.history import BadgeUpdate, SessionDelta

__all__ = [
    "ClientSessionCache",
    "DeltaOutcome",
    "badge_update",
    "deltas_of",
    "read_sync",
    "session_delta",
]


def session_delta(
    row: SessionRow,
    state: UserConversationState,
    *,
    driving_event_id: int,
    driving_mailbox_seq: int,
    preview: bytes = b"",
) -> SessionDelta:
    """One SESSION_DELTA from a projection row (INV-22: the same values the flush writes)."""
    unread, exact = display_unread(row.counts, state)
    return SessionDelta(
        conversation_id=row.conversation_id,
        driving_event_id=driving_event_id,
        driving_mailbox_seq=driving_mailbox_seq,
        projection_mailbox_seq=row.projection_mailbox_seq,
        latest_conversation_seq=row.latest_conversation_seq,
        last_activity_id=u128_to_bytes(row.last_activity_id),
        last_message_id=u128_to_bytes(row.last_message_id),
        preview_or_placeholder=preview,
        unread_count=unread,
        unread_exact=exact,
        mention_count=row.mention_count,
        mention_first_conversation_seq=row.mention_first_conversation_seq,
    )


def deltas_of(result: FoldResult, previews: Mapping[str, bytes]) -> tuple[SessionDelta, ...]:
    """The deltas of one fold, in driving-entry order (deterministic)."""
    p = result.projection
    ordered = sorted(result.touched.items(), key=lambda kv: (kv[1], kv[0]))
    return tuple(
        session_delta(
            p.rows[conv],
            p.state(conv),
            driving_event_id=key[2],
            driving_mailbox_seq=key[0],
            preview=previews.get(conv, b""),
        )
        for conv, key in ordered
    )


def badge_update(
    total_unread: int, total_mention: int, muted_unread: int, badge_projection_mailbox_seq: int
) -> BadgeUpdate:
    return BadgeUpdate(
        total_unread=total_unread,
        total_mention=total_mention,
        muted_unread=muted_unread,
        badge_projection_mailbox_seq=badge_projection_mailbox_seq,
    )


def read_sync(old: UserConversationState, new: UserConversationState) -> ReadSync | None:
    """READ_SYNC for the user's other devices, only when the watermark really advanced (A.4
    #4); an absolute, forward-only value with no unread count (the receiver recomputes)."""
    if new.read_conversation_seq <= old.read_conversation_seq:
        return None
    return ReadSync(
        conversation_id=new.conversation_id, read_conversation_seq=new.read_conversation_seq
    )


class DeltaOutcome(Enum):
    APPLIED = "applied"
    DROPPED = "dropped"  # late or duplicate: no compensation (12.6.2)
    GAP = "gap"  # driving entry not applied yet: PULL_MAILBOX, never guess (12.6.4)


@dataclass
class ClientSessionCache:
    """The client side of 12.6: per-conversation last frame, badge, and resync pacing.

    ``last_applied_mailbox_seq`` is the device's mailbox position; ``now_ms`` is passed in
    (client clock; nothing server-side is materialized from it).
    """

    resync_min_interval_ms: int = 5000
    sessions: dict[str, SessionDelta] = field(default_factory=dict)
    badge: BadgeUpdate | None = None
    last_resync_ms: int | None = None
    dropped: int = 0

    def apply_delta(self, delta: SessionDelta, last_applied_mailbox_seq: int) -> DeltaOutcome:
        if delta.driving_mailbox_seq > last_applied_mailbox_seq:
            return DeltaOutcome.GAP
        held = self.sessions.get(delta.conversation_id)
        if held is not None and delta.projection_mailbox_seq <= held.projection_mailbox_seq:
            self.dropped += 1
            return DeltaOutcome.DROPPED
        self.sessions[delta.conversation_id] = delta
        return DeltaOutcome.APPLIED

    def may_resync(self, now_ms: int) -> bool:
        """PULL_MAILBOX at most once per ``client_resync_min_interval`` (12.6.4)."""
        if self.last_resync_ms is not None and now_ms - self.last_resync_ms < (
            self.resync_min_interval_ms
        ):
            return False
        self.last_resync_ms = now_ms
        return True

    def apply_badge(self, update: BadgeUpdate) -> bool:
        """Only a strictly larger ``badge_projection_mailbox_seq`` is applied (INV-54)."""
        if self.badge is not None and (
            update.badge_projection_mailbox_seq <= self.badge.badge_projection_mailbox_seq
        ):
            return False
        self.badge = update
        return True
