"""Unread counts: the 12.5.1 formula, the bounded recount (12.5.2) and the recall rule (12.5.5).

Why a separate reference :func:`unread_formula`: the projection's ``unread_count`` is only a
cache of it (INV-02, 12.6.5) and the property tests compare the two. The recount reads through
:class:`MessageSource`, at most ``unread_precise_limit`` rows per call (INV-13).

Deviation, written down: the 12.5.1 text bounds non-members by ``seq <= left_at`` while 7.5's
``visible(u,c)`` is open at ``left_at`` (the leave CONTROL itself sits at ``left_at``). The
formula here follows ``visible``: ``seq < left_at``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from qim.core.session_list.state import UserConversationState
from qim.schemas.frames.base import EntryFlags, MentionType
from qim.schemas.frames.mailbox import SyncEntry

__all__ = [
    "MessageFacts",
    "MessageSource",
    "UnreadCounts",
    "display_unread",
    "manual_unread_active",
    "rebase",
    "recall_decrement",
    "recount",
    "unread_formula",
    "upper_bound",
]


@dataclass(frozen=True, slots=True)
class MessageFacts:
    """What the formula needs of one MessageRecord, for one user.

    ``mention_type`` is this user's (``qim.core.fanout.recipients.mention_type_of``);
    ``removed`` = recalled or deleted (``recall_event_conversation_seq`` non-null).
    """

    conversation_seq: int
    sender_id: str
    counts_unread: bool
    mention_type: int = MentionType.NONE
    removed: bool = False

    def counts_for(self, user_id: str) -> bool:
        return self.counts_unread and self.sender_id != user_id and not self.removed

    def mentions(self, user_id: str) -> bool:
        return (
            self.mention_type != MentionType.NONE
            and self.sender_id != user_id
            and (not self.removed)
        )


class MessageSource(Protocol):
    """A range read of one conversation's messages, ascending, at most ``limit`` rows.

    It must be *log-consistent*: the rows as of ``as_of_mailbox_seq``, the mailbox record being
    folded (the shard's read-time-join body store is fed by the same log, direction 4.4), so a
    replay reads what the first run read and a recall whose CONTROL entry is not folded yet is
    not seen as removed (no double decrement).
    """

    def read_range(
        self,
        conversation_id: str,
        after_seq: int,
        upto_seq: int,
        limit: int,
        as_of_mailbox_seq: int,
    ) -> Sequence[MessageFacts]: ...


@dataclass(frozen=True, slots=True)
class UnreadCounts:
    """The unread part of a projection row."""

    unread_count: int = 0
    unread_exact: bool = True
    mention_count: int = 0
    mention_first_conversation_seq: int = 0


def upper_bound(state: UserConversationState, latest: int) -> int:
    """Inclusive upper end of the count: ``latest``, clipped below ``left_at`` for a leaver."""
    left = state.left_at_conversation_seq
    return latest if left is None else min(latest, left - 1)


def unread_formula(
    user_id: str,
    state: UserConversationState,
    messages: Iterable[MessageFacts],
    head_latest: int,
) -> UnreadCounts:
    """12.5.1 evaluated over every message (the reference; no row limit)."""
    base, upper = state.unread_base, upper_bound(state, head_latest)
    unread = mentions = 0
    first = 0
    for m in sorted(messages, key=lambda m: m.conversation_seq):
        if not base < m.conversation_seq <= upper:
            continue
        unread += m.counts_for(user_id)
        if m.mentions(user_id):
            mentions += 1
            first = first or m.conversation_seq
    return UnreadCounts(unread, True, mentions, first)


def recount(
    user_id: str,
    conversation_id: str,
    base: int,
    upper: int,
    source: MessageSource,
    limit: int,
    as_of: int,
) -> UnreadCounts:
    """12.5.2: exact when ``upper - base <= limit``, else ``unread_count = limit`` inexact.

    Either way one read of at most ``limit`` rows; in the truncated case the mention fields come
    from the first ``limit`` rows above ``base`` (the first mention is then still exact when it
    lies in them; the count is a lower bound, inexact like the unread count).
    """
    if upper <= base:
        return UnreadCounts()
    rows = source.read_range(conversation_id, base, upper, limit, as_of)
    if len(rows) > limit:
        raise ValueError(f"MessageSource returned {len(rows)} rows, limit {limit}")
    mentions = [m.conversation_seq for m in rows if m.mentions(user_id)]
    first = min(mentions, default=0)
    if upper - base > limit:
        return UnreadCounts(limit, False, len(mentions), first)
    unread = sum(1 for m in rows if m.counts_for(user_id))
    return UnreadCounts(unread, True, len(mentions), first)


def rebase(
    user_id: str,
    conversation_id: str,
    counts: UnreadCounts,
    old_base: int,
    new_base: int,
    upper: int,
    *,
    upper_changed: bool,
    source: MessageSource,
    limit: int,
    as_of: int,
) -> UnreadCounts | None:
    """12.5.4 on a base (or upper bound) change; None = no-op (no write, AT-23).

    ``new_base >= upper`` clears (AT-24); otherwise a bounded recount, exact or truncated. The
    incremental subtraction of case (a) is an optimisation of the same result and is not used:
    the recount reads at most ``limit`` rows and never zeroes (INV-15).
    """
    if new_base == old_base and not upper_changed:
        return None
    if new_base >= upper:
        return UnreadCounts()
    return recount(user_id, conversation_id, new_base, upper, source, limit, as_of)


def recall_decrement(
    user_id: str,
    counts: UnreadCounts,
    unread_base: int,
    upper: int,
    control: SyncEntry,
    source: MessageSource,
    limit: int,
) -> UnreadCounts:
    """12.5.5: decide from the CONTROL entry's ``target_*`` only (INV-17), clamp at 0 (INV-10).

    The mention count is decremented on its own condition (``target_mention_type != NONE``),
    which is the 12.5.1 mention formula; the text's "in addition" would let a mention on a
    ``counts_unread=false`` message drift. A recalled first mention moves to the next one in
    ``(target, upper]``, read through ``source`` (at most ``limit`` rows).
    """
    target = control.target_conversation_seq
    if target is None or not unread_base < target <= upper:
        return counts
    if control.target_sender_id == user_id:
        return counts  # own message: never counted (AT-25)
    unread, mentions, first = (
        counts.unread_count,
        counts.mention_count,
        counts.mention_first_conversation_seq,
    )
    if (control.target_flags or 0) & EntryFlags.COUNTS_UNREAD:
        unread = max(0, unread - 1)
    if (control.target_mention_type or MentionType.NONE) != MentionType.NONE:
        mentions = max(0, mentions - 1)
        if target == first:
            rows = source.read_range(
                control.conversation_id, target, upper, limit, control.mailbox_seq
            )
            first = min((m.conversation_seq for m in rows if m.mentions(user_id)), default=0)
    return UnreadCounts(unread, counts.unread_exact, mentions, first)


def manual_unread_active(state: UserConversationState) -> bool:
    """The manual mark shows while set (MARK_READ reaching it clears it, ``apply_change``)."""
    return state.manual_unread_conversation_seq is not None


def display_unread(counts: UnreadCounts, state: UserConversationState) -> tuple[int, bool]:
    """``(unread_count, unread_exact)`` as shown: a manual mark shows >= 1, inexact (12.5.1)."""
    if manual_unread_active(state):
        return max(1, counts.unread_count), False
    return counts.unread_count, counts.unread_exact
