"""``UserSessionProjection`` + ``UserBadgeState`` (spec 7.6, 7.7, 12.3-12.5): a pure fold.

Input is one user's ordered mailbox stream (the compactor consumes ``mailbox_seq <= W[lane]``
only, 12.3.1): A.4.1 entries (:class:`EntryIn`) and the user's ``UserConversationState``
records at their log position (:class:`StateIn`, the dispatch-log records of user actions and
membership, direction 3). The fold is a pure function of (checkpoint, ordered inputs), so replay
is byte-identical (INV-18) and the projection can be dropped and refolded at any time (INV-01).
``applied_through`` (the mailbox primary key of the last input) makes redelivery a no-op: the
idempotency key is the mailbox key itself (12.5.5), no dedup set.

Every entry passes the three independent gates of 12.4.2: visibility (common precondition),
sort key (``affects_session_order`` and a larger ``last_activity_id``) and content (a larger
``conversation_seq``, own_seq events only). Anchor-target CONTROL entries (recall, edit, delete)
never move latest/sort key; they re-emit when they hit the previewed message. A separate
MENTION entry duplicates its primary entry's ``mention_type`` (11.4.1) and is not counted twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import msgspec

from qim.core.session_list.config import SessionListConfig
from qim.core.session_list.rows import (
    InputKey,
    SessionRow,
    UserBadgeState,
    UserProjection,
    badge_of,
    badge_share,
)
from qim.core.session_list.state import UserConversationState, is_structural_change
from qim.core.session_list.unread import (
    MessageSource,
    display_unread,
    rebase,
    recall_decrement,
    recount,
    upper_bound,
)
from qim.schemas.frames.base import EntryFlags, EventType, MentionType, u128_from_bytes
from qim.schemas.frames.mailbox import SyncEntry

__all__ = [
    "EntryIn",
    "FoldResult",
    "HeadFacts",
    "StateIn",
    "fold",
    "rebuild_from_state",
]


@dataclass(frozen=True, slots=True)
class EntryIn:
    """A mailbox entry; ``removes_target`` marks a recall / moderation delete (vs an edit)."""

    entry: SyncEntry
    removes_target: bool = False

    @property
    def key(self) -> InputKey:
        e = self.entry
        return (e.mailbox_seq, e.event_ordinal, e.event_id)


@dataclass(frozen=True, slots=True)
class StateIn:
    """The conversation state after the user-state record at ``mailbox_seq`` was applied."""

    mailbox_seq: int
    event_id: int
    state: UserConversationState

    @property
    def key(self) -> InputKey:
        return (self.mailbox_seq, EventType.CONTROL, self.event_id)


@dataclass(frozen=True, slots=True)
class FoldResult:
    """The new projection; ``touched`` maps each changed row to the key of its last driver."""

    projection: UserProjection
    touched: Mapping[str, InputKey]
    structural_change: bool
    badge_changed: bool


class _Fold:
    """Mutable working copy for one batch; never escapes :func:`fold`."""

    def __init__(self, p: UserProjection, source: MessageSource, config: SessionListConfig):
        self.user = p.user_id
        self.rows = dict(p.rows)
        self.states = dict(p.states)
        self.source, self.config = source, config
        self.limit = config.unread_precise_limit
        self.touched: dict[str, InputKey] = {}
        self.structural = False

    def state(self, conversation_id: str) -> UserConversationState:
        found = self.states.get(conversation_id)
        return found or UserConversationState(conversation_id=conversation_id)

    def share(self, conversation_id: str) -> tuple[int, int, int]:
        return badge_share(
            self.rows.get(conversation_id),
            self.state(conversation_id),
            self.config.include_muted_in_badge,
        )

    def entry(self, item: EntryIn) -> None:
        e = item.entry
        if e.event_type == EventType.MENTION and not e.flags:
            return  # its primary entry carries the counts; a flagged one stands alone (10.2.3)
        conv, seq = e.conversation_id, e.conversation_seq
        state = self.state(conv)
        if not state.visible(seq) or seq <= e.visibility_floor_conversation_seq:
            return  # the visibility gate: no effect at all (INV-09, INV-30)
        old = self.rows.get(conv)
        row = old or SessionRow(conversation_id=conv, unread_base_seq=state.unread_base)
        if e.event_type == EventType.CONTROL and e.target_conversation_seq is not None:
            new = row
            if item.removes_target:
                upper = upper_bound(state, row.latest_conversation_seq)
                counts = recall_decrement(
                    self.user, row.counts, row.unread_base_seq, upper, e, self.source, self.limit
                )
                new = row.with_counts(counts)
            if new == row and e.target_conversation_seq != row.latest_conversation_seq:
                return
        elif e.event_type == EventType.CONTROL:
            return  # user-state CONTROL entries reach the fold as StateIn
        else:
            new = self.own_seq(row, e)
            if new == row and old is not None:
                return
        self.rows[conv] = msgspec.structs.replace(new, projection_mailbox_seq=e.mailbox_seq)
        self.touched[conv] = item.key

    def own_seq(self, row: SessionRow, e: SyncEntry) -> SessionRow:
        seq, updates = e.conversation_seq, {}
        activity = u128_from_bytes(e.last_activity_id)
        if e.flags & EntryFlags.AFFECTS_SESSION_ORDER and activity > row.last_activity_id:
            updates["last_activity_id"] = activity
        if seq > row.latest_conversation_seq:
            updates["latest_conversation_seq"] = seq
            updates["last_message_id"] = u128_from_bytes(e.message_id)
        if seq > row.unread_base_seq and e.sender_id != self.user:
            if e.flags & EntryFlags.COUNTS_UNREAD:
                if row.unread_exact and row.unread_count + 1 > self.limit:
                    updates["unread_exact"] = False
                updates["unread_count"] = min(self.limit, row.unread_count + 1)
            if e.mention_type != MentionType.NONE:
                updates["mention_count"] = row.mention_count + 1
                first = row.mention_first_conversation_seq
                updates["mention_first_conversation_seq"] = min(first, seq) if first else seq
        return msgspec.structs.replace(row, **updates) if updates else row

    def state_change(self, item: StateIn) -> None:
        new_state = item.state
        conv = new_state.conversation_id
        old_state = self.state(conv)
        self.structural |= is_structural_change(old_state, new_state)
        self.states[conv] = new_state
        row = self.rows.get(conv)
        if row is None:
            return
        latest = row.latest_conversation_seq
        if latest <= new_state.deleted_before_conversation_seq:
            # INV-32: no row at or below deleted_before (a rebuild never creates one); a
            # later message above it resurrects the conversation with a fresh row.
            del self.rows[conv]
            self.touched.pop(conv, None)  # no row, no SESSION_DELTA: the CONTROL entry says it
            return
        upper = upper_bound(new_state, latest)
        counts = rebase(
            self.user,
            conv,
            row.counts,
            row.unread_base_seq,
            new_state.unread_base,
            upper,
            upper_changed=upper != upper_bound(old_state, latest),
            source=self.source,
            limit=self.limit,
            as_of=item.mailbox_seq,
        )
        new = row if counts is None else row.with_counts(counts)
        new = msgspec.structs.replace(new, unread_base_seq=new_state.unread_base)
        shown_changed = display_unread(row.counts, old_state) != display_unread(
            new.counts, new_state
        )
        if new == row and not shown_changed:
            return
        self.rows[conv] = msgspec.structs.replace(new, projection_mailbox_seq=item.mailbox_seq)
        self.touched[conv] = item.key


def fold(
    projection: UserProjection,
    inputs: Iterable[EntryIn | StateIn],
    source: MessageSource,
    config: SessionListConfig,
    *,
    watermark: int | None = None,
) -> FoldResult:
    """Apply ``inputs`` in mailbox order. Inputs at or below ``applied_through`` are
    redeliveries and skipped; consumption stops before the first input above ``watermark``
    (``W[lane]``, INV-19), so a late lower entry is never skipped for good (AT-04)."""
    work = _Fold(projection, source, config)
    applied = projection.applied_through
    sums = list(projection.badge.sums)
    badge_seq = projection.badge.badge_projection_mailbox_seq
    for item in inputs:
        if item.key <= applied:
            continue
        if watermark is not None and item.key[0] > watermark:
            break
        if isinstance(item, EntryIn):
            conv = item.entry.conversation_id
            before = work.share(conv)
            work.entry(item)
        else:
            conv = item.state.conversation_id
            before = work.share(conv)
            work.state_change(item)
        after = work.share(conv)
        if after != before:  # the badge version is the input that last changed a sum
            sums = [total + a - b for total, a, b in zip(sums, after, before, strict=True)]
            badge_seq = item.key[0]
        applied = item.key
    changed = tuple(sums) != projection.badge.sums
    badge = UserBadgeState(
        total_unread=sums[0],
        total_mention=sums[1],
        muted_unread=sums[2],
        badge_projection_mailbox_seq=badge_seq,
    )
    result = UserProjection(
        user_id=projection.user_id,
        rows=work.rows,
        states=work.states,
        badge=badge,
        applied_through=applied,
    )
    return FoldResult(result, dict(work.touched), work.structural, changed)


@dataclass(frozen=True, slots=True)
class HeadFacts:
    """What the §12.7 REBUILD reads per conversation: the head *as visible to the user*
    (a leaver's is the last message before ``left_at``)."""

    latest_conversation_seq: int
    last_activity_id: int
    last_message_id: int


def rebuild_from_state(
    user_id: str,
    states: Mapping[str, UserConversationState],
    heads: Mapping[str, HeadFacts],
    source: MessageSource,
    config: SessionListConfig,
    *,
    at_mailbox_seq: int,
) -> UserProjection:
    """The outside-the-window REBUILD (12.2, 12.7, case 26.4.3 B): rows from 7.5 + the heads,
    unread by bounded recount; no row where ``deleted_before >= latest`` (INV-32)."""
    rows: dict[str, SessionRow] = {}
    for conv in sorted(states):
        state, head = states[conv], heads.get(conv)
        if head is None or head.latest_conversation_seq <= state.deleted_before_conversation_seq:
            continue
        upper = upper_bound(state, head.latest_conversation_seq)
        counts = recount(
            user_id,
            conv,
            state.unread_base,
            upper,
            source,
            config.unread_precise_limit,
            at_mailbox_seq,
        )
        rows[conv] = SessionRow(
            conversation_id=conv,
            latest_conversation_seq=head.latest_conversation_seq,
            last_activity_id=head.last_activity_id,
            last_message_id=head.last_message_id,
            unread_base_seq=state.unread_base,
            projection_mailbox_seq=at_mailbox_seq,
        ).with_counts(counts)
    partial = UserProjection(user_id=user_id, rows=rows, states=dict(states))
    total, mention, muted = badge_of(partial, config)
    badge = UserBadgeState(
        total_unread=total,
        total_mention=mention,
        muted_unread=muted,
        badge_projection_mailbox_seq=at_mailbox_seq,
    )
    return msgspec.structs.replace(
        partial, badge=badge, applied_through=(at_mailbox_seq, 0xFF, 2**64 - 1)
    )
