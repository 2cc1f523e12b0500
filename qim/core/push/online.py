"""The online-user filter of one MailboxShard: "at least one device online" (spec 5.4.3).

Why it exists: intersecting a member slice with the online set drops every fully offline
member with bitmap operations before any per-device work (10.1 step 10, 16.1.1 step 1). Why
it is keyed by member slots: 5.4.3 requires the online bitmap to use the slot mapping of
7.9's MemberSlotMap, so one bitmap per registered slice ``(tenant, group, version, shard)``
holds the online members' slot ids and ``slice & online`` is a Roaring AND.

The one rule that matters: **false positives are allowed, false negatives are forbidden**. A
bit is cleared only by an explicit offline event -- the cache's tombstone, lease expiry,
PRESENCE_STALE invalidation or reconcile removal, each named by :class:`OfflineCause` -- and
never because something "looks" offline. Only the presence cache calls :meth:`mark_online` /
:meth:`mark_offline`; per-device detail always comes from the cache, never from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from pyroaring import BitMap

from qim.core.membership.slices import ShardSlice

__all__ = ["OfflineCause", "OnlineFilter", "SliceKey", "UserRef"]

UserRef = tuple[str, str]
"""(tenant_id, user_id)."""
SliceKey = tuple[str, str, int, int]
"""(tenant_id, group_id, membership_version, mailbox_shard), as in membership.slices."""


class OfflineCause(Enum):
    """The only events allowed to clear an online bit (5.4.3)."""

    TOMBSTONE = "tombstone"  # the ConnectionNode wrote a null value (logout / disconnect)
    LEASE_EXPIRED = "lease_expired"  # lease_expire_at passed without renewal (5.4.3 (3))
    PRESENCE_STALE = "presence_stale"  # the ConnectionNode reported the device gone (5.4.3 (1))
    RECONCILE = "reconcile"  # the compacted topic does not hold the device (5.4.3 (2))


@dataclass(slots=True)
class _Indexed:
    slot_of: dict[str, int]
    members: BitMap
    online: BitMap = field(default_factory=BitMap)


class OnlineFilter:
    """Online users of one shard, and per registered slice the bitmap of their slots."""

    def __init__(self) -> None:
        self._online: set[UserRef] = set()
        self._slices: dict[SliceKey, _Indexed] = {}
        self._member_of: dict[UserRef, set[SliceKey]] = {}

    # -- fed by the presence cache -----------------------------------------------------------

    def mark_online(self, tenant_id: str, user_id: str) -> None:
        """The user's first live device appeared: set its bit in every slice it belongs to."""
        user = (tenant_id, user_id)
        self._online.add(user)
        for key in self._member_of.get(user, ()):
            indexed = self._slices[key]
            indexed.online.add(indexed.slot_of[user_id])

    def mark_offline(self, tenant_id: str, user_id: str, cause: OfflineCause) -> None:
        """The user's last live device went away through ``cause`` (never by guessing)."""
        if not isinstance(cause, OfflineCause):
            raise TypeError("an online bit is cleared only by an explicit OfflineCause")
        user = (tenant_id, user_id)
        self._online.discard(user)
        for key in self._member_of.get(user, ()):
            indexed = self._slices[key]
            indexed.online.discard(indexed.slot_of[user_id])

    # -- slices -------------------------------------------------------------------------------

    def register(self, piece: ShardSlice) -> SliceKey:
        """Index a member slice (idempotent); its online bitmap starts from the current set."""
        key: SliceKey = (
            piece.tenant_id,
            piece.group_id,
            piece.membership_version,
            piece.mailbox_shard,
        )
        if key in self._slices:
            return key
        slot_of = dict(zip(piece.user_ids, piece.slots, strict=True))
        indexed = _Indexed(slot_of=slot_of, members=BitMap(piece.slots))
        for user_id, slot in slot_of.items():
            user = (piece.tenant_id, user_id)
            self._member_of.setdefault(user, set()).add(key)
            if user in self._online:
                indexed.online.add(slot)
        self._slices[key] = indexed
        return key

    def retire(self, key: SliceKey) -> None:
        """Forget a slice no dispatch will pin again (version GC)."""
        indexed = self._slices.pop(key, None)
        if indexed is None:
            return
        for user_id in indexed.slot_of:
            keys = self._member_of.get((key[0], user_id))
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._member_of[(key[0], user_id)]

    # -- reads --------------------------------------------------------------------------------

    def is_online(self, tenant_id: str, user_id: str) -> bool:
        return (tenant_id, user_id) in self._online

    def online_slots(self, key: SliceKey) -> BitMap:
        """``members & online`` of the slice: a copy the caller may keep."""
        indexed = self._slices[key]
        return indexed.members & indexed.online

    def online_members(self, key: SliceKey) -> tuple[str, ...]:
        """User ids of the slice's online slots, ascending by slot id (deterministic)."""
        indexed = self._slices[key]
        user_at = {slot: user for user, slot in indexed.slot_of.items()}
        return tuple(user_at[slot] for slot in self.online_slots(key))

    def online_users(self) -> list[UserRef]:
        """Every user with a set bit, sorted (audits and reconcile)."""
        return sorted(self._online)

    def audit(self, live_users: set[UserRef]) -> list[str]:
        """Invariant of 5.4.3: no false negative. Every user with a live device in the cache
        must be online here and set in every slice it belongs to. Returns the violations."""
        problems: list[str] = []
        for user in sorted(live_users):
            if user not in self._online:
                problems.append(f"{user!r} has a live device but is offline in the filter")
            for key in sorted(self._member_of.get(user, ())):
                indexed = self._slices[key]
                if indexed.slot_of[user[1]] not in indexed.online:
                    problems.append(f"{user!r} has a live device but its bit in {key} is clear")
        return problems
