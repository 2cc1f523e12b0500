"""One group's membership: the MemberSlotMap, intervals, roles and the read indexes.

Why this shape (spec 7.9, 7.5, 12.10):

* ``rows`` is the MemberSlotMap keyed by user id, current AND former members: a leaver keeps
  ``(joined_at, left_at)`` so history stays readable below ``left_at`` (ADR-0021), and a rejoin
  overwrites the row with a new slot and a new ``joined_at`` (AT-48).
* ``next_slot`` only grows, so a slot id is never reused, even across leave/join cycles; leaving
  only sets ``released_at`` and clears the bit (spec 7.9). A banned row keeps its released slot
  so the ``banned`` member filter can list it in slot order too.
* Bitmaps of active slots (all, per MailboxShard, admins) and sorted id / display-hint indexes
  are derived data: rebuilt on decode, never serialized, so the serialized state is exactly
  the rows plus two counters.

Mutation is only through :meth:`join`, :meth:`release` and :meth:`set_role` (and ``dissolved``;
``e2ee`` is set once, by the create), called by ``GroupMembership.apply``.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pyroaring import BitMap

from qim.core.membership.errors import MembershipLogError
from qim.schemas.records.membership import MembershipState, Role

__all__ = ["GroupState", "MemberRow", "fold_hint"]

_ADMIN_ROLES = frozenset({Role.OWNER, Role.ADMIN})


def fold_hint(text: str) -> str:
    """Case-insensitive form used by the display-hint prefix index."""
    return text.casefold()


@dataclass(slots=True)
class MemberRow:
    """One MemberSlotMap row plus the member's interval and role (spec Part 2)."""

    user_id: str
    slot_id: int
    role: str
    state: str
    joined_at: int
    left_at: int | None
    assigned_at: int
    released_at: int | None
    display_hint: str
    shard: int

    @property
    def active(self) -> bool:
        return self.state == MembershipState.ACTIVE


class GroupState:
    """Membership of one ``(tenant_id, group_id)``; ``version`` is its membership_version."""

    __slots__ = (
        "_admins",
        "_banned",
        "_hints",
        "_ids",
        "_shard_of",
        "_shard_slots",
        "_slot_user",
        "active_slots",
        "dissolved",
        "e2ee",
        "group_id",
        "next_slot",
        "rows",
        "tenant_id",
        "updated_at",
        "version",
    )

    def __init__(self, tenant_id: str, group_id: str, shard_of: Callable[[str], int]) -> None:
        self.tenant_id = tenant_id
        self.group_id = group_id
        self.version = 0
        self.next_slot = 0
        self.updated_at = 0
        self.dissolved = False
        self.e2ee = False
        """End-to-end encrypted (spec 22.1): set by the create, never changed afterwards."""
        self.rows: dict[str, MemberRow] = {}
        self.active_slots = BitMap()
        self._shard_of = shard_of
        self._shard_slots: dict[int, BitMap] = {}
        self._admins = BitMap()
        self._banned = BitMap()
        self._slot_user: dict[int, str] = {}
        self._ids: list[str] = []
        self._hints: list[tuple[str, str]] = []

    # -- mutation (apply only) ----------------------------------------------------------------

    def join(
        self, user_id: str, slot_id: int, role: str, joined_at: int, at: int, hint: str
    ) -> int:
        """Make ``user_id`` an active member on a fresh slot; returns its MailboxShard."""
        old = self.rows.get(user_id)
        if old is not None and old.active:
            raise MembershipLogError(f"{user_id!r} is already a member of {self.group_id!r}")
        if slot_id < self.next_slot:
            raise MembershipLogError(f"slot {slot_id} of {self.group_id!r} would be reused")
        if old is not None and old.state == MembershipState.BANNED:
            self._banned.discard(old.slot_id)
            del self._slot_user[old.slot_id]
        row = MemberRow(
            user_id=user_id,
            slot_id=slot_id,
            role=role,
            state=MembershipState.ACTIVE,
            joined_at=joined_at,
            left_at=None,
            assigned_at=at,
            released_at=None,
            display_hint=hint,
            shard=old.shard if old is not None else self._shard_of(user_id),
        )
        self.rows[user_id] = row
        self.next_slot = slot_id + 1
        self._index(row)
        return row.shard

    def release(self, user_id: str, state: str, left_at: int, at: int) -> int:
        """End ``user_id``'s membership at ``left_at`` (LEFT/REMOVED/BANNED); returns its shard."""
        row = self.rows.get(user_id)
        if row is None or not row.active:
            raise MembershipLogError(f"{user_id!r} is not a member of {self.group_id!r}")
        self._unindex(row)
        row.state = state
        row.left_at = left_at
        row.released_at = at
        if state == MembershipState.BANNED:
            self._banned.add(row.slot_id)
            self._slot_user[row.slot_id] = user_id
        return row.shard

    def set_role(self, user_id: str, role: str) -> int:
        """Give an active member ``role`` (set_role, transfer); returns its MailboxShard."""
        row = self.rows.get(user_id)
        if row is None or not row.active:
            raise MembershipLogError(f"{user_id!r} is not a member of {self.group_id!r}")
        row.role = role
        if role in _ADMIN_ROLES:
            self._admins.add(row.slot_id)
        else:
            self._admins.discard(row.slot_id)
        return row.shard

    def owner(self) -> str | None:
        """The active OWNER's user id (there is at most one; None once dissolved)."""
        for slot in self._admins:
            row = self.user_at(slot)
            if row.role == Role.OWNER:
                return row.user_id
        return None

    def role_of(self, user_id: str) -> str | None:
        """An active member's role; None for a non-member."""
        row = self.rows.get(user_id)
        return row.role if row is not None and row.active else None

    def _index(self, row: MemberRow) -> None:
        if row.state == MembershipState.BANNED:
            self._banned.add(row.slot_id)
            self._slot_user[row.slot_id] = row.user_id
            return
        if not row.active:
            return
        self.active_slots.add(row.slot_id)
        self._shard_slots.setdefault(row.shard, BitMap()).add(row.slot_id)
        if row.role in _ADMIN_ROLES:
            self._admins.add(row.slot_id)
        self._slot_user[row.slot_id] = row.user_id
        bisect.insort(self._ids, row.user_id)
        if row.display_hint:
            bisect.insort(self._hints, (fold_hint(row.display_hint), row.user_id))

    def _unindex(self, row: MemberRow) -> None:
        self.active_slots.discard(row.slot_id)
        shard_slots = self._shard_slots[row.shard]
        shard_slots.discard(row.slot_id)
        if not shard_slots:
            del self._shard_slots[row.shard]
        self._admins.discard(row.slot_id)
        del self._slot_user[row.slot_id]
        del self._ids[bisect.bisect_left(self._ids, row.user_id)]
        if row.display_hint:
            entry = (fold_hint(row.display_hint), row.user_id)
            del self._hints[bisect.bisect_left(self._hints, entry)]

    def reindex(self) -> None:
        """Rebuild every derived index from ``rows`` (after decode)."""
        for row in sorted(self.rows.values(), key=lambda r: r.slot_id):
            self._index(row)

    # -- queries --------------------------------------------------------------------------------

    @property
    def member_count(self) -> int:
        return len(self.active_slots)

    def is_member(self, user_id: str) -> bool:
        row = self.rows.get(user_id)
        return row is not None and row.active

    def user_at(self, slot_id: int) -> MemberRow:
        """The active or banned member holding ``slot_id``."""
        return self.rows[self._slot_user[slot_id]]

    def shards(self) -> list[int]:
        """MailboxShards with at least one active member, ascending."""
        return sorted(self._shard_slots)

    def shard_slots(self, shard: int) -> BitMap:
        """Active slots of members routed to ``shard`` (empty if none)."""
        return self._shard_slots.get(shard, BitMap())

    def admin_slots(self) -> BitMap:
        return self._admins

    def banned_slots(self) -> BitMap:
        return self._banned

    def needs_slot_compaction(self, slot_compaction_ratio: int) -> bool:
        """Spec 7.9: renumbering is allowed only once ``max(slot_id) > member_count x ratio``.

        Renumbering itself (a write-freeze window and a forced version bump that voids every
        older bitmap) is not implemented; this is the trigger an operator or a metric reads.
        """
        if not self.active_slots:
            return False
        return self.active_slots.max() > self.member_count * slot_compaction_ratio

    def search(self, prefix: str) -> BitMap:
        """Active slots whose user id, or folded display hint, starts with ``prefix``.

        Two bisected ranges of sorted indexes: the cost follows the number of matches, never
        the group size (acceptance 26.3.9: server full-table scans == 0).
        """
        found = BitMap()
        for user_id in _prefix_range(self._ids, prefix):
            found.add(self.rows[user_id].slot_id)
        folded = fold_hint(prefix)
        start = bisect.bisect_left(self._hints, (folded, ""))
        for hint, user_id in self._hints[start:]:
            if not hint.startswith(folded):
                break
            found.add(self.rows[user_id].slot_id)
        return found


def _prefix_range(sorted_ids: list[str], prefix: str) -> Iterator[str]:
    for user_id in sorted_ids[bisect.bisect_left(sorted_ids, prefix) :]:
        if not user_id.startswith(prefix):
            return
        yield user_id
