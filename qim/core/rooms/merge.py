"""The ConnectionNode's room merge window (spec 14.2): a room's messages -> one ROOM_BATCH.

Every broadcast of a room that reaches the node within ``window_ms`` of the first one is held
and flushed as one batch: with ``window_ms = period / count`` of ``room_outbound_frame_rate``
(100 ms for 10 frames/s) a connection gets at most one live ROOM_BATCH per room per window,
whatever the room's message rate. Broadcasts of a newer ``room_epoch`` replace what is held (the
room restarted: the older epoch's events are moot, 14.3); an older epoch's broadcast is dropped
(a writer that lost the room). The node also remembers each room's last epoch and watermark,
which answer ROOM_LEAVE (14.5). Time is an argument.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from qim.schemas.frames.room import RoomEvent

__all__ = ["Held", "RoomMerge", "RoomView"]

R = TypeVar("R", bound=Hashable)


@dataclass(frozen=True, slots=True)
class RoomView:
    """What the node last learnt of a room: its epoch and positions."""

    room_epoch: int
    latest_room_seq: int
    earliest_replay_room_seq: int


@dataclass(slots=True)
class Held:
    """One room's events waiting for the window to end."""

    view: RoomView
    events: list[RoomEvent]
    due_ms: int


@dataclass(slots=True)
class RoomMerge(Generic[R]):
    window_ms: int
    _held: dict[R, Held] = field(default_factory=dict)
    _views: dict[R, RoomView] = field(default_factory=dict)

    def view(self, room: R) -> RoomView | None:
        return self._views.get(room)

    def learn(self, room: R, view: RoomView) -> bool:
        """Record a position (a JOIN answer or a broadcast); False if it is of an older epoch."""
        known = self._views.get(room)
        if known is not None and view.room_epoch < known.room_epoch:
            return False
        if (
            known is None
            or view.room_epoch > known.room_epoch
            or view.latest_room_seq >= known.latest_room_seq
        ):
            self._views[room] = view
        return True

    def offer(self, room: R, view: RoomView, events: tuple[RoomEvent, ...], now_ms: int) -> bool:
        """Hold a broadcast's events; False when it was dropped (an older epoch)."""
        if not self.learn(room, view):
            return False
        held = self._held.get(room)
        current = self._views[room]
        if held is None or held.view.room_epoch < view.room_epoch:
            self._held[room] = Held(current, list(events), now_ms + self.window_ms)
            return True
        last = held.events[-1].room_seq if held.events else 0
        held.events.extend(e for e in events if e.room_seq > last)
        held.view = current
        return True

    def next_due_ms(self) -> int | None:
        return min((h.due_ms for h in self._held.values()), default=None)

    def due(self, now_ms: int) -> list[tuple[R, Held]]:
        """The rooms whose window ended, in the order their windows opened."""
        ready = [(room, held) for room, held in self._held.items() if held.due_ms <= now_ms]
        for room, _ in ready:
            del self._held[room]
        return ready

    def forget(self, room: R) -> None:
        """The node has no member of ``room`` any more."""
        self._held.pop(room, None)
        self._views.pop(room, None)
