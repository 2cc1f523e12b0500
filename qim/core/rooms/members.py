"""The ConnectionNode's ``room_id -> connections`` map, kept from ROOM_JOIN / ROOM_LEAVE only.

A subscription is soft state of one connection (14.5): never persisted, never per user, gone
when the connection closes. Per (room, ConnectionShard) the map counts members, so the node
knows when a shard gets its first member (register it with the RoomWriter) and loses its last
(deregister). Each membership keeps a *floor*: the ``latest_room_seq`` of the JOIN answer, so
a connection is never sent events older than the position it joined at. Pure.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["RoomMembers"]

R = TypeVar("R", bound=Hashable)


@dataclass(slots=True)
class RoomMembers(Generic[R]):
    _rooms: dict[R, dict[str, int]] = field(default_factory=dict)  # room -> conn -> floor
    _of_conn: dict[str, dict[R, int]] = field(default_factory=dict)  # conn -> room -> shard
    _per_shard: dict[tuple[R, int], int] = field(default_factory=dict)
    _users: dict[str, str] = field(default_factory=dict)  # conn -> user (for promotion, 14.4)

    def rooms_of(self, conn_id: str) -> int:
        return len(self._of_conn.get(conn_id, ()))

    def is_member(self, conn_id: str, room: R) -> bool:
        return room in self._of_conn.get(conn_id, ())

    def join(self, conn_id: str, room: R, shard: int, floor: int, user_id: str = "") -> bool:
        """Add (or refresh the floor of) a membership; True if ``shard`` just got its first."""
        if user_id:
            self._users[conn_id] = user_id
        members = self._rooms.setdefault(room, {})
        if conn_id in members:
            members[conn_id] = max(members[conn_id], floor)
            return False
        members[conn_id] = floor
        self._of_conn.setdefault(conn_id, {})[room] = shard
        key = (room, shard)
        self._per_shard[key] = self._per_shard.get(key, 0) + 1
        return self._per_shard[key] == 1

    def leave(self, conn_id: str, room: R) -> int | None:
        """Remove a membership; the shard if that was its last member in the room."""
        rooms = self._of_conn.get(conn_id)
        if rooms is None or room not in rooms:
            return None
        shard = rooms.pop(room)
        if not rooms:
            del self._of_conn[conn_id]
            self._users.pop(conn_id, None)
        members = self._rooms[room]
        del members[conn_id]
        if not members:
            del self._rooms[room]
        key = (room, shard)
        self._per_shard[key] -= 1
        if self._per_shard[key] == 0:
            del self._per_shard[key]
            return shard
        return None

    def close(self, conn_id: str) -> list[tuple[R, int]]:
        """The connection closed: it leaves every room (the implicit ROOM_LEAVE of 14.5);
        returns the (room, shard) pairs that lost their last member."""
        emptied = []
        for room in list(self._of_conn.get(conn_id, ())):
            shard = self.leave(conn_id, room)
            if shard is not None:
                emptied.append((room, shard))
        return emptied

    def members(self, room: R) -> Iterator[tuple[str, int]]:
        """(conn_id, floor) of every member of ``room``."""
        return iter(list(self._rooms.get(room, {}).items()))

    def has_members(self, room: R) -> bool:
        return room in self._rooms

    def shards(self) -> list[tuple[R, int]]:
        """Every (room, shard) with a member: what the node renews with the RoomWriters."""
        return sorted(self._per_shard, key=repr)

    def users(self, room: R, shard: int) -> tuple[str, ...]:
        """The users of the connections of ``shard`` in ``room`` (sorted, once each)."""
        conns = self._rooms.get(room, {})
        return tuple(sorted({self._users.get(c, "") for c in conns
                             if self._of_conn.get(c, {}).get(room) == shard} - {""}))  # fmt: skip

    def raise_floor(self, conn_id: str, room: R, floor: int) -> None:
        members = self._rooms.get(room)
        if members is not None and conn_id in members:
            members[conn_id] = max(members[conn_id], floor)
