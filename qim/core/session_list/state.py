"""``UserConversationState`` (spec 7.5): the durable, authoritative per-user conversation state.

Why per-field stamps: 7.5 merges multi-device writes *per field* ("``pin_rank`` / ``muted`` /
``archived`` / ``notification_policy`` each pick their own winner" by the larger
``(state_version, updated_activity_id)``), so each of those four fields carries the stamp of the
write that set it. The membership fields are stamped with the ``conversation_seq`` of the
MEMBERSHIP event that set them: membership is decided by the conversation's own order, never by a
device. Watermarks take ``max``; ``manual_unread_conversation_seq`` is "null wins, else max".

:func:`merge` is a semilattice join (commutative, associative, idempotent; property-tested).
:func:`apply_change` applies one user action or membership event, the only way state changes
(7.5: never on ordinary message arrival).

Decision on the manual-unread mark: 26.4.7 marks a *fully read* conversation (``read ==
latest == U``), so "cleared once ``read >= manual``" cannot be a standing invariant (INV-16's
wording) or the mark would vanish as it is set. The mark is cleared by the MARK_READ that
reaches it, or by a clear history / delete that covers it (12.9: both clear the unread;
``apply_change``); ``merge`` applies 7.5's "null wins, else max" literally, which is a join
only because it does not re-check ``read`` (that re-check is not associative).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, TypeAlias

import msgspec

from qim.schemas.frames import Error, ErrorCode

__all__ = [
    "ACTIVE",
    "BANNED",
    "LEFT",
    "REMOVED",
    "ClearHistory",
    "DeleteLocal",
    "Join",
    "Leave",
    "MarkRead",
    "MarkUnread",
    "SetArchived",
    "SetMuted",
    "SetNotificationPolicy",
    "SetPin",
    "SetRole",
    "Stamp",
    "UserChange",
    "UserConversationState",
    "admit_conversation",
    "apply_change",
    "is_structural_change",
    "merge",
]

ACTIVE: Final = "ACTIVE"
LEFT: Final = "LEFT"
REMOVED: Final = "REMOVED"
BANNED: Final = "BANNED"
_ENDED: Final = frozenset({LEFT, REMOVED, BANNED})

Stamp: TypeAlias = tuple[int, int]
"""``(state_version, updated_activity_id)`` of the write that set a field; larger wins."""


class UserConversationState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One ``(tenant, user, conversation)`` row of 7.5 (0.1 of the ch. 12-16 digest).

    ``membership_seq`` is the stamp of the four membership fields (the seq of the MEMBERSHIP
    event that set them); ``*_stamp`` are the per-field stamps. ``left_at_conversation_seq``
    None = still a member (upper bound +inf).
    """

    conversation_id: str
    membership_state: str = ACTIVE
    role: str = "MEMBER"
    joined_at_conversation_seq: int = 0
    left_at_conversation_seq: int | None = None
    membership_seq: int = 0
    hidden_before_conversation_seq: int = 0
    deleted_before_conversation_seq: int = 0
    read_conversation_seq: int = 0
    manual_unread_conversation_seq: int | None = None
    delivered_conversation_seq: int = 0
    pin_rank: int | None = None
    pin_stamp: Stamp = (0, 0)
    muted: bool = False
    muted_stamp: Stamp = (0, 0)
    archived: bool = False
    archived_stamp: Stamp = (0, 0)
    notification_policy: str = "ALL"
    policy_stamp: Stamp = (0, 0)
    updated_activity_id: int = 0
    state_version: int = 0

    @property
    def active(self) -> bool:
        return self.membership_state == ACTIVE

    @property
    def visible_lower(self) -> int:
        """Open lower end of ``visible(u,c)``: max of joined_at, hidden_before, deleted_before."""
        return max(
            self.joined_at_conversation_seq,
            self.hidden_before_conversation_seq,
            self.deleted_before_conversation_seq,
        )

    @property
    def unread_base(self) -> int:
        """``base(u,c)`` of 12.5.1: the lower bound raised by the read watermark."""
        return max(self.visible_lower, self.read_conversation_seq)

    def visible(self, conversation_seq: int) -> bool:
        """``seq ∈ (lower, left_at)``: both ends open (7.5)."""
        left = self.left_at_conversation_seq
        return conversation_seq > self.visible_lower and (left is None or conversation_seq < left)


# -- user actions and membership events ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MarkRead:
    """MARK_READ: forward only; clears a manual-unread mark it reaches (7.5, 12.9)."""

    read_conversation_seq: int


@dataclass(frozen=True, slots=True)
class MarkUnread:
    """ "Mark unread": ``manual_unread = head.latest_conversation_seq`` at marking time."""

    head_latest_conversation_seq: int


@dataclass(frozen=True, slots=True)
class ClearHistory:
    """Clear history / hide: ``hidden_before = head.latest``; the row stays (12.9)."""

    head_latest_conversation_seq: int


@dataclass(frozen=True, slots=True)
class DeleteLocal:
    """Local delete: ``deleted_before = head.latest``; a newer message resurrects (12.10)."""

    head_latest_conversation_seq: int


@dataclass(frozen=True, slots=True)
class SetPin:
    pin_rank: int | None


@dataclass(frozen=True, slots=True)
class SetMuted:
    muted: bool


@dataclass(frozen=True, slots=True)
class SetArchived:
    archived: bool


@dataclass(frozen=True, slots=True)
class SetNotificationPolicy:
    notification_policy: str


@dataclass(frozen=True, slots=True)
class Join:
    """MEMBERSHIP join at seq J: ``joined_at = J - 1``, ``left_at`` cleared (7.5)."""

    join_conversation_seq: int
    role: str = "MEMBER"


@dataclass(frozen=True, slots=True)
class Leave:
    """MEMBERSHIP leave/kick at seq J: ``left_at = J`` (history < J stays readable)."""

    leave_conversation_seq: int
    membership_state: str = LEFT


@dataclass(frozen=True, slots=True)
class SetRole:
    """MEMBERSHIP set_role / transfer at seq J: an active member's new role (20.2.2)."""

    role_conversation_seq: int
    role: str


UserChange: TypeAlias = (
    MarkRead
    | MarkUnread
    | ClearHistory
    | DeleteLocal
    | SetPin
    | SetMuted
    | SetArchived
    | SetNotificationPolicy
    | Join
    | Leave
    | SetRole
)


def apply_change(
    state: UserConversationState, change: UserChange, *, activity_id: int
) -> UserConversationState:
    """The state after one change; a stale or no-op change returns ``state`` itself.

    ``activity_id`` is the change's ``last_activity_id`` (the log record's), so replay stamps
    identically. The writer increments ``state_version`` (7.5).
    """
    stamp = (state.state_version + 1, activity_id)
    updates: dict[str, object]
    match change:
        case MarkRead(seq):
            manual = state.manual_unread_conversation_seq
            cleared = manual is not None and seq >= manual
            if seq <= state.read_conversation_seq and not cleared:
                return state
            updates = {"read_conversation_seq": max(seq, state.read_conversation_seq)}
            if cleared:
                updates["manual_unread_conversation_seq"] = None
        case MarkUnread(head):
            updates = {"manual_unread_conversation_seq": head}
        case ClearHistory(head) | DeleteLocal(head):
            # 12.9: both clear the unread, so a manual mark they cover goes with it.
            field = (
                "hidden_before_conversation_seq"
                if isinstance(change, ClearHistory)
                else "deleted_before_conversation_seq"
            )
            manual = state.manual_unread_conversation_seq
            unmark = manual is not None and manual <= head
            if head <= getattr(state, field) and not unmark:
                return state
            updates = {field: max(head, getattr(state, field))}
            if unmark:
                updates["manual_unread_conversation_seq"] = None
        case SetPin(rank):
            updates = {"pin_rank": rank, "pin_stamp": stamp}
        case SetMuted(muted):
            updates = {"muted": muted, "muted_stamp": stamp}
        case SetArchived(archived):
            updates = {"archived": archived, "archived_stamp": stamp}
        case SetNotificationPolicy(policy):
            updates = {"notification_policy": policy, "policy_stamp": stamp}
        case Join(seq, role):
            if seq <= state.membership_seq:
                return state
            updates = {
                "membership_state": ACTIVE,
                "role": role,
                "joined_at_conversation_seq": seq - 1,
                "left_at_conversation_seq": None,
                "membership_seq": seq,
            }
        case SetRole(seq, role):
            if seq <= state.membership_seq or state.membership_state != ACTIVE:
                return state
            updates = {"role": role, "membership_seq": seq}
        case Leave(seq, ended):
            if ended not in _ENDED:
                raise ValueError(f"not a leave state: {ended!r}")
            if seq <= state.membership_seq:
                return state
            updates = {
                "membership_state": ended,
                "left_at_conversation_seq": seq,
                "membership_seq": seq,
            }
    return msgspec.structs.replace(
        state,
        state_version=stamp[0],
        updated_activity_id=max(state.updated_activity_id, activity_id),
        **updates,
    )


def _members(s: UserConversationState) -> tuple[object, ...]:
    return (s.membership_state, s.role, s.joined_at_conversation_seq, s.left_at_conversation_seq)


def merge(a: UserConversationState, b: UserConversationState) -> UserConversationState:
    """Join two replicas of one row per 7.5's per-field rules.

    Each stamped group takes the side with the larger stamp; equal stamps holding different
    values (impossible under the LWT writer, but a join must be total) tie-break on ``repr``.
    """
    if a.conversation_id != b.conversation_id:
        raise ValueError("merging states of different conversations")
    member = max(a, b, key=lambda s: (s.membership_seq, repr(_members(s))))
    pin = max(a, b, key=lambda s: (s.pin_stamp, repr(s.pin_rank)))
    muted = max(a, b, key=lambda s: (s.muted_stamp, s.muted))
    archived = max(a, b, key=lambda s: (s.archived_stamp, s.archived))
    policy = max(a, b, key=lambda s: (s.policy_stamp, s.notification_policy))
    manual_a, manual_b = a.manual_unread_conversation_seq, b.manual_unread_conversation_seq
    return UserConversationState(
        conversation_id=a.conversation_id,
        membership_state=member.membership_state,
        role=member.role,
        joined_at_conversation_seq=member.joined_at_conversation_seq,
        left_at_conversation_seq=member.left_at_conversation_seq,
        membership_seq=member.membership_seq,
        hidden_before_conversation_seq=max(
            a.hidden_before_conversation_seq, b.hidden_before_conversation_seq
        ),
        deleted_before_conversation_seq=max(
            a.deleted_before_conversation_seq, b.deleted_before_conversation_seq
        ),
        read_conversation_seq=max(a.read_conversation_seq, b.read_conversation_seq),
        manual_unread_conversation_seq=(
            None if manual_a is None or manual_b is None else max(manual_a, manual_b)
        ),
        delivered_conversation_seq=max(a.delivered_conversation_seq, b.delivered_conversation_seq),
        pin_rank=pin.pin_rank,
        pin_stamp=pin.pin_stamp,
        muted=muted.muted,
        muted_stamp=muted.muted_stamp,
        archived=archived.archived,
        archived_stamp=archived.archived_stamp,
        notification_policy=policy.notification_policy,
        policy_stamp=policy.policy_stamp,
        updated_activity_id=max(a.updated_activity_id, b.updated_activity_id),
        state_version=max(a.state_version, b.state_version),
    )


def is_structural_change(old: UserConversationState | None, new: UserConversationState) -> bool:
    """A change of sort partition (``pin_rank``, ``archived``, ``membership_state``) bumps the
    session-list ``snapshot_revision`` (12.8.2); unread, preview and activity never do."""
    if old is None:
        return True
    return (old.pin_rank, old.archived, old.membership_state) != (
        new.pin_rank,
        new.archived,
        new.membership_state,
    )


def admit_conversation(conversation_count: int, limit: int) -> Error | None:
    """Entering one more conversation past ``max_conversations_per_user`` is refused (12.8.1)."""
    if conversation_count < limit:
        return None
    return Error(
        code=int(ErrorCode.PERMISSION_DENIED),
        detail="conversation_quota_exhausted",
    )
