"""The MailboxNode's presence cache for one MailboxShard (spec 5.4, 7.10).

Why a local cache: a PushBatch needs each device's ``connection_id`` and ``session_epoch``
(11.1), and the push path makes zero synchronous remote calls (5.4.2). The cache is fed
**only** by presence-topic records of the partition the node owns (explicit partition = the
user's mailbox shard, direction.md 3), so it holds exactly the users of its shard.

Rules, each with its source:

* upsert: the larger ``session_epoch`` wins (15.2.2, 5.4.4 "never decreases"), so a late
  record of a replaced connection cannot take the device back; a record whose lease has
  already run out removes the device (5.4.3 (3));
* tombstone (null value): the device is gone (5.4.2);
* lease expiry: :meth:`expire` drops entries with ``not is_online(now)``; until the sweep runs
  :meth:`devices` already hides them, so an expired device never enters a PushBatch
  (5.4.3 (3)); the online bit stays set until the sweep -- a false positive, allowed;
* PRESENCE_STALE: drop the device if its cached epoch <= ``observed_epoch`` (a newer epoch
  is a reconnect the report knows nothing about) and remember that floor until the dropped
  lease would have run out, so reconcile or a late duplicate record does not bring the dead
  connection back (5.4.3 (1));
* reconcile: fold a full read of the compacted partition with the same rules, count the keys
  on which it and the cache disagree (``presence_reconcile_diff``, 5.4.3 (2), 24), adopt it.

Time is always an argument (epoch ms), nothing here reads a clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

from qim.core.push.online import OfflineCause, OnlineFilter
from qim.schemas.records.presence import PresenceEntry, PresenceKey, decode_presence
from qim.schemas.records.push import PresenceStale

__all__ = ["ForeignPartition", "ReconcileReport", "ShardPresenceCache"]

_Devices = dict[str, PresenceEntry]


class ForeignPartition(ValueError):
    """A presence record of a partition this cache does not own: a wiring bug."""


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    """What one reconcile found; ``presence_reconcile_diff`` is the 24.x metric's value."""

    missing: tuple[PresenceKey, ...]  # live in the topic, absent from the cache
    unexpected: tuple[PresenceKey, ...]  # in the cache, not live in the topic
    mismatched: tuple[PresenceKey, ...]  # both, but a different entry

    @property
    def presence_reconcile_diff(self) -> int:
        return len(self.missing) + len(self.unexpected) + len(self.mismatched)


class ShardPresenceCache:
    """Live devices of one MailboxShard's users, plus the shard's :class:`OnlineFilter`."""

    def __init__(self, mailbox_shard: int) -> None:
        self.mailbox_shard = mailbox_shard
        self.online = OnlineFilter()
        self._users: dict[tuple[str, str], _Devices] = {}
        self._expiry: list[tuple[int, str, str, str]] = []  # lazy min-heap by lease_expire_at
        self._floors: dict[PresenceKey, tuple[int, int]] = {}  # key -> (stale epoch, until ms)

    # -- input: the presence topic -------------------------------------------------------------

    def apply_record(self, partition: int, key: bytes, value: bytes | None, now_ms: int) -> None:
        """One presence-topic record as consumed; raises ForeignPartition for another shard."""
        if partition != self.mailbox_shard:
            raise ForeignPartition(f"partition {partition} is not shard {self.mailbox_shard}")
        self.apply(PresenceKey.decode(key), decode_presence(value), now_ms)

    def apply(self, key: PresenceKey, entry: PresenceEntry | None, now_ms: int) -> None:
        """Upsert (``entry``) or tombstone (None) one device, by the rules of the module doc."""
        if entry is None:
            self._floors.pop(key, None)
            self._remove(key, OfflineCause.TOMBSTONE)
            return
        if entry.key != key:
            raise ValueError(f"record key {key} does not match its value's {entry.key}")
        floor = self._floors.get(key)
        if floor is not None:
            if entry.session_epoch <= floor[0]:
                return  # the ConnectionNode said this connection is gone
            del self._floors[key]
        current = self._get(key)
        if current is not None and current.session_epoch > entry.session_epoch:
            return  # the larger epoch wins (15.2.2)
        if not entry.is_online(now_ms):
            self._remove(key, OfflineCause.LEASE_EXPIRED)
            return
        self._put(entry)

    # -- input: the ConnectionNode's feedback and the clock -------------------------------------

    def invalidate(self, stale: PresenceStale, now_ms: int) -> bool:
        """PRESENCE_STALE: drop the device if its epoch <= ``observed_epoch``; True if dropped."""
        key = PresenceKey(stale.tenant_id, stale.user_id, stale.device_id)
        current = self._get(key)
        if current is None or current.session_epoch > stale.observed_epoch:
            return False
        self._floors[key] = (stale.observed_epoch, max(current.lease_expire_at, now_ms))
        self._remove(key, OfflineCause.PRESENCE_STALE)
        return True

    def expire(self, now_ms: int) -> int:
        """Evict every device whose lease ran out by ``now_ms``; returns how many."""
        evicted = 0
        while self._expiry and self._expiry[0][0] <= now_ms:
            lease, tenant, user, device = heapq.heappop(self._expiry)
            key = PresenceKey(tenant, user, device)
            current = self._get(key)
            if current is not None and current.lease_expire_at == lease:
                self._remove(key, OfflineCause.LEASE_EXPIRED)
                evicted += 1
        for key in [k for k, (_, until) in self._floors.items() if until <= now_ms]:
            del self._floors[key]
        return evicted

    def reconcile(
        self, snapshot: Iterable[tuple[PresenceKey, PresenceEntry | None]], now_ms: int
    ) -> ReconcileReport:
        """Diff against a full read of the compacted partition (read up to the offset this
        cache has applied), then adopt it. Records are folded in order with the live rules."""
        self.expire(now_ms)
        expected = ShardPresenceCache(self.mailbox_shard)
        expected._floors = dict(self._floors)
        for key, entry in snapshot:
            expected.apply(key, entry, now_ms)
        ours, theirs = self._live_map(now_ms), expected._live_map(now_ms)
        report = ReconcileReport(
            missing=tuple(sorted(theirs.keys() - ours.keys())),
            unexpected=tuple(sorted(ours.keys() - theirs.keys())),
            mismatched=tuple(
                sorted(k for k in ours.keys() & theirs.keys() if ours[k] != theirs[k])
            ),
        )
        for key in report.unexpected:
            self._remove(key, OfflineCause.RECONCILE)
        for key in report.missing + report.mismatched:
            self._put(theirs[key])
        return report

    # -- reads -------------------------------------------------------------------------------

    def devices(self, tenant_id: str, user_id: str, now_ms: int) -> tuple[PresenceEntry, ...]:
        """The user's devices with a holding lease, sorted by device_id (the push targets)."""
        devices = self._users.get((tenant_id, user_id))
        if not devices:
            return ()
        return tuple(devices[d] for d in sorted(devices) if devices[d].is_online(now_ms))

    def live_users(self, now_ms: int) -> set[tuple[str, str]]:
        """Users with at least one device whose lease holds (for OnlineFilter.audit)."""
        return {user for user in self._users if self.devices(*user, now_ms)}

    def __len__(self) -> int:
        return sum(len(devices) for devices in self._users.values())

    # -- internals ---------------------------------------------------------------------------

    def _live_map(self, now_ms: int) -> dict[PresenceKey, PresenceEntry]:
        return {
            entry.key: entry
            for devices in self._users.values()
            for entry in devices.values()
            if entry.is_online(now_ms)
        }

    def _get(self, key: PresenceKey) -> PresenceEntry | None:
        devices = self._users.get((key.tenant_id, key.user_id))
        return None if devices is None else devices.get(key.device_id)

    def _put(self, entry: PresenceEntry) -> None:
        user = (entry.tenant_id, entry.user_id)
        devices = self._users.setdefault(user, {})
        first = not devices
        devices[entry.device_id] = entry
        heapq.heappush(
            self._expiry, (entry.lease_expire_at, entry.tenant_id, entry.user_id, entry.device_id)
        )
        if first:
            self.online.mark_online(*user)

    def _remove(self, key: PresenceKey, cause: OfflineCause) -> None:
        user = (key.tenant_id, key.user_id)
        devices = self._users.get(user)
        if devices is None or devices.pop(key.device_id, None) is None:
            return
        if not devices:
            del self._users[user]
            self.online.mark_offline(*user, cause)
