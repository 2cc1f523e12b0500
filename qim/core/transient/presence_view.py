"""The ConnectionNode's PresenceDirectory view (spec 5.4, 13.2): every user's live devices.

PRESENCE_SUB may watch any user of the tenant, not only the node's own, so a node folds the
whole compacted presence topic (every partition) into one :class:`ShardPresenceCache` per
partition, with the MailboxNode's rules (the larger session_epoch wins, tombstones, leases).
A subscription is answered from here with no remote call (13.2 "data source").

``last_active_at`` is when this view last saw a record of the user (a login, a lease renewal,
a logout): approximate UI state, as 13.2 says PRESENCE_SUB is, and never used for push
decisions. Time is an argument.
"""

from __future__ import annotations

from qim.core.push.presence_cache import ShardPresenceCache
from qim.core.transient.presence_sub import OFFLINE, ONLINE, PresenceState
from qim.schemas.records.presence import PresenceKey, decode_presence

__all__ = ["PresenceView"]

UserKey = tuple[str, str]


class PresenceView:
    """Presence of every user, from every partition of the presence topic."""

    def __init__(self) -> None:
        self._caches: dict[int, ShardPresenceCache] = {}
        self._seen: dict[UserKey, int] = {}
        self._where: dict[UserKey, int] = {}  # user -> partition (its mailbox shard)

    def apply_record(self, partition: int, key: bytes, value: bytes | None, now_ms: int) -> UserKey:
        """Fold one presence record; returns the user it is about."""
        cache = self._caches.get(partition)
        if cache is None:
            cache = self._caches[partition] = ShardPresenceCache(partition)
        parsed = PresenceKey.decode(key)
        cache.apply(parsed, decode_presence(value), now_ms)
        user = (parsed.tenant_id, parsed.user_id)
        self._seen[user] = now_ms
        self._where[user] = partition
        return user

    def state(self, tenant_id: str, user_id: str, now_ms: int) -> PresenceState:
        user = (tenant_id, user_id)
        partition = self._where.get(user)
        seen = self._seen.get(user, 0)
        if partition is None:
            return PresenceState(OFFLINE, 0)
        online = bool(self._caches[partition].devices(tenant_id, user_id, now_ms))
        return PresenceState(ONLINE if online else OFFLINE, seen)

    def online_devices(self, tenant_id: str, user_id: str, now_ms: int) -> tuple[str, ...]:
        """The user's devices whose lease holds, sorted (RTC rings every one, 13.5.1)."""
        partition = self._where.get((tenant_id, user_id))
        if partition is None:
            return ()
        devices = self._caches[partition].devices(tenant_id, user_id, now_ms)
        return tuple(d.device_id for d in devices)

    def expire(self, now_ms: int) -> None:
        for cache in self._caches.values():
            cache.expire(now_ms)
