"""The broadcast targets of a RoomWriter: the ConnectionShards with a member, as leases.

A gateway registers its ConnectionShard for a room when the shard's first connection joins
(the JOIN itself registers it), renews every ``renew_ms`` while the shard has members, and
deregisters when the last one leaves (14.5). A registration not renewed within ``ttl_ms`` ends
by itself: a gateway that died, or a shard that moved to another gateway, stops costing
broadcasts without anyone having to say so, and a RoomWriter that took a partition over learns
every live target within one renewal period (the registrations are soft state, like the rooms'
member sets, 14.5). Time is an argument.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["RoomTargets"]

R = TypeVar("R", bound=Hashable)


@dataclass(slots=True)
class RoomTargets(Generic[R]):
    """room -> {connection_shard: lease expiry (ms)}."""

    ttl_ms: int
    _leases: dict[R, dict[int, int]] = field(default_factory=dict)

    def register(self, room: R, shard: int, now_ms: int) -> None:
        self._leases.setdefault(room, {})[shard] = now_ms + self.ttl_ms

    def deregister(self, room: R, shard: int) -> None:
        shards = self._leases.get(room)
        if shards is not None:
            shards.pop(shard, None)
            if not shards:
                del self._leases[room]

    def shards(self, room: R, now_ms: int) -> tuple[int, ...]:
        """The live targets of ``room`` in shard order (expired leases are dropped)."""
        shards = self._leases.get(room)
        if not shards:
            return ()
        for shard in [s for s, exp in shards.items() if exp <= now_ms]:
            del shards[shard]
        if not shards:
            del self._leases[room]
            return ()
        return tuple(sorted(shards))

    def rooms(self) -> list[R]:
        return list(self._leases)

    def drop(self, keep: set[R] | None = None) -> None:
        """Forget every room (or every room not in ``keep``): a partition was revoked."""
        if keep is None:
            self._leases.clear()
            return
        for room in [r for r in self._leases if r not in keep]:
            del self._leases[room]
