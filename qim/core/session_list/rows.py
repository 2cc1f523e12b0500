"""The stored shapes of the session projection (spec 7.6, 7.7) and the 7.7 badge sums.

``SessionRow`` is one UserSessionProjection row and ``UserBadgeState`` the per-user badge;
both live in ``UserProjection`` with the fold's copy of 7.5 state and its position, which is
what a checkpoint stores (:func:`encode_projection`: sorted map keys, so equal projections
encode to equal bytes, INV-18).
"""

from __future__ import annotations

from typing import Final, TypeAlias

import msgspec

from qim.core.session_list.config import SessionListConfig
from qim.core.session_list.state import UserConversationState
from qim.core.session_list.unread import UnreadCounts, display_unread

__all__ = [
    "PROJECTION_VERSION",
    "InputKey",
    "SessionRow",
    "UserBadgeState",
    "UserProjection",
    "badge_of",
    "badge_share",
    "decode_projection",
    "encode_projection",
    "listed",
]

PROJECTION_VERSION: Final = 1
InputKey: TypeAlias = tuple[int, int, int]
"""``(mailbox_seq, event_ordinal, event_id)``: the mailbox clustering order."""


class SessionRow(msgspec.Struct, frozen=True, kw_only=True):
    """One UserSessionProjection row (7.6). No preview, no manual-unread (INV-03)."""

    conversation_id: str
    latest_conversation_seq: int = 0
    last_activity_id: int = 0
    last_message_id: int = 0
    unread_count: int = 0
    unread_base_seq: int = 0
    unread_exact: bool = True
    mention_count: int = 0
    mention_first_conversation_seq: int = 0
    projection_mailbox_seq: int = 0
    projection_version: int = PROJECTION_VERSION

    @property
    def counts(self) -> UnreadCounts:
        return UnreadCounts(
            self.unread_count,
            self.unread_exact,
            self.mention_count,
            self.mention_first_conversation_seq,
        )

    def with_counts(self, counts: UnreadCounts) -> SessionRow:
        return msgspec.structs.replace(
            self,
            unread_count=counts.unread_count,
            unread_exact=counts.unread_exact,
            mention_count=counts.mention_count,
            mention_first_conversation_seq=counts.mention_first_conversation_seq,
        )


class UserBadgeState(msgspec.Struct, frozen=True, kw_only=True):
    """UserBadgeState (7.7): written with the rows, versioned by the same mailbox position."""

    total_unread: int = 0
    total_mention: int = 0
    muted_unread: int = 0
    badge_projection_mailbox_seq: int = 0

    @property
    def sums(self) -> tuple[int, int, int]:
        return (self.total_unread, self.total_mention, self.muted_unread)


class UserProjection(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the fold keeps for one user; ``states`` is its copy of 7.5 at the position."""

    user_id: str
    rows: dict[str, SessionRow] = msgspec.field(default_factory=dict)
    states: dict[str, UserConversationState] = msgspec.field(default_factory=dict)
    badge: UserBadgeState = UserBadgeState()
    applied_through: InputKey = (0, 0, 0)

    @property
    def projection_mailbox_seq(self) -> int:
        """The per-user high-water mark (C-7: per user for skipping, per row for deltas)."""
        return self.applied_through[0]

    def state(self, conversation_id: str) -> UserConversationState:
        found = self.states.get(conversation_id)
        return found or UserConversationState(conversation_id=conversation_id)


def listed(row: SessionRow, state: UserConversationState, *, include_left: bool = False) -> bool:
    """A row is in the list unless locally deleted past its latest (INV-32) or, by policy,
    the user is no longer a member (AT-02: omitted here, or shown read-only)."""
    if row.latest_conversation_seq <= state.deleted_before_conversation_seq:
        return False
    return state.active or include_left


def badge_share(
    row: SessionRow | None, state: UserConversationState, include_muted: bool
) -> tuple[int, int, int]:
    """This conversation's share of (total_unread, total_mention, muted_unread), 7.7."""
    if row is None or not state.active or not listed(row, state):
        return (0, 0, 0)
    unread, _ = display_unread(row.counts, state)
    counted = not state.archived and (not state.muted or include_muted)
    muted = not state.archived and state.muted
    return (unread if counted else 0, row.mention_count, unread if muted else 0)


def badge_of(projection: UserProjection, config: SessionListConfig) -> tuple[int, int, int]:
    """The 7.7 sums recomputed over every row (the reference for the incremental badge)."""
    sums = [0, 0, 0]
    for conversation_id in sorted(projection.rows):
        share = badge_share(
            projection.rows[conversation_id],
            projection.state(conversation_id),
            config.include_muted_in_badge,
        )
        for i in range(3):
            sums[i] += share[i]
    return (sums[0], sums[1], sums[2])


# JSON, not msgpack: ``last_activity_id`` / ``last_message_id`` are u128 ints, which msgpack
# cannot carry as integers (it stops at 64 bits).
_ENCODER: Final = msgspec.json.Encoder(order="deterministic")
_DECODER: Final = msgspec.json.Decoder(UserProjection)


def encode_projection(projection: UserProjection) -> bytes:
    """Checkpoint bytes; sorted map keys, so equal projections encode identically."""
    return _ENCODER.encode(projection)


def decode_projection(data: bytes) -> UserProjection:
    return _DECODER.decode(data)
