"""A hashed timing wheel with lazy checks (§15.1.5), pure, time as an argument.

Why: per-connection timers rescheduled on every frame cost tens of thousands of heap
operations per second at 200k connections; the spec forbids them. Instead each connection
sits in one slot; a valid frame only moves ``last_active_at`` (no reschedule). When a slot
comes due, ``advance`` hands its keys back and the caller re-checks the real deadline: close
if passed, else ``schedule`` again for the remaining time. A deadline beyond one rotation
just comes back early and is re-inserted. Defaults: ``heartbeat_wheel_tick`` 1 s,
``heartbeat_wheel_slots`` 512 (B.4).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["TimingWheel"]

K = TypeVar("K", bound=Hashable)


class TimingWheel(Generic[K]):
    """Keys bucketed by deadline tick; each key is in at most one slot."""

    def __init__(self, tick_ms: int = 1000, slots: int = 512, *, now_ms: int = 0) -> None:
        if tick_ms < 1 or slots < 2:
            raise ValueError("tick_ms must be >= 1 and slots >= 2")
        self.tick_ms = tick_ms
        self._slots: list[set[K]] = [set() for _ in range(slots)]
        self._where: dict[K, int] = {}
        self._tick = now_ms // tick_ms  # the last tick already processed

    def schedule(self, key: K, deadline_ms: int) -> None:
        """(Re)place ``key`` in the slot of ``deadline_ms``; past deadlines go to the next tick."""
        target = max(-(-deadline_ms // self.tick_ms), self._tick + 1)  # ceil, never the past
        span = len(self._slots)
        target = min(target, self._tick + span)  # a far deadline comes back early, lazily
        slot = target % span
        old = self._where.get(key)
        if old is not None:
            self._slots[old].discard(key)
        self._slots[slot].add(key)
        self._where[key] = slot

    def cancel(self, key: K) -> None:
        slot = self._where.pop(key, None)
        if slot is not None:
            self._slots[slot].discard(key)

    def advance(self, now_ms: int) -> list[K]:
        """Keys of every slot that came due up to ``now_ms``; they leave the wheel."""
        due: list[K] = []
        last = now_ms // self.tick_ms
        span = len(self._slots)
        for tick in range(self._tick + 1, min(last, self._tick + span) + 1):
            slot = self._slots[tick % span]
            if slot:
                due.extend(slot)
                for key in slot:
                    del self._where[key]
                slot.clear()
        self._tick = max(self._tick, last)
        return due

    def __contains__(self, key: object) -> bool:
        return key in self._where

    def __len__(self) -> int:
        return len(self._where)
