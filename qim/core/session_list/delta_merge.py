"""The ConnectionNode's ``session_delta_merge_window`` (12.6.3, 17.x write path, I20), pure.

Why here and not in the MailboxNode: a fold is already one merge unit there, but two folds a
few milliseconds apart still send two SESSION_DELTA for a busy conversation. The spec puts the
window on the connection: per connection, frames are held for up to the window from the first
held one, and within it a later frame for the same ``conversation_id`` **replaces** the held
one whole (never summed). Versions only move forward: a frame whose ``projection_mailbox_seq``
is below the held one's (a late or reordered record) is dropped, never written over a newer
one; BADGE_UPDATE likewise by ``badge_projection_mailbox_seq``. An equal version replaces (the
later record is the one the MailboxNode produced last; both carry the same absolute values).

A flush emits the held deltas in first-arrival order, then the badge. READ_SYNC is not merged
here (9.7.2 merges MARK_READ in the MailboxNode; the gateway sends it as it comes).

Deterministic: no clock inside. The shell passes ``now_ms`` (monotonic) to :meth:`offer` and
asks :meth:`due` for what to send; :meth:`next_due_ms` is when to ask next.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from dataclasses import dataclass, field
from itertools import count
from typing import Generic, TypeVar

from qim.schemas.frames.history import BadgeUpdate, SessionDelta

__all__ = ["DeltaMergeBuffer", "MergedFrame"]

K = TypeVar("K", bound=Hashable)
MergedFrame = SessionDelta | BadgeUpdate


@dataclass(slots=True)
class _Held:
    """One connection's frames of the current window."""

    due_ms: int
    deltas: dict[str, SessionDelta] = field(default_factory=dict)  # insertion = first arrival
    badge: BadgeUpdate | None = None

    def frames(self) -> tuple[MergedFrame, ...]:
        badge: tuple[MergedFrame, ...] = () if self.badge is None else (self.badge,)
        return (*self.deltas.values(), *badge)


class DeltaMergeBuffer(Generic[K]):
    """Held SESSION_DELTA / BADGE_UPDATE frames per connection key (module doc)."""

    def __init__(self, window_ms: int) -> None:
        if window_ms < 0:
            raise ValueError("window_ms must be >= 0")
        self.window_ms = window_ms
        self._held: dict[K, _Held] = {}
        self._due: list[tuple[int, int, K]] = []  # (due_ms, arrival, key); stale entries lazy
        self._arrival = count()
        self.offered = 0
        self.merged_away = 0  # frames replaced or dropped as older: never sent

    def __len__(self) -> int:
        """Connections with held frames."""
        return len(self._held)

    def offer(self, key: K, frame: MergedFrame, now_ms: int) -> int:
        """Hold ``frame`` for ``key``; returns how many frames this merged away (0 or 1)."""
        self.offered += 1
        held = self._held.get(key)
        if held is None:
            held = self._held[key] = _Held(now_ms + self.window_ms)
            heapq.heappush(self._due, (held.due_ms, next(self._arrival), key))
        merged = _merge(held, frame)
        self.merged_away += merged
        return merged

    def held(self, key: K) -> tuple[MergedFrame, ...]:
        """What a flush of ``key`` would send now (for inspection)."""
        held = self._held.get(key)
        return () if held is None else held.frames()

    def next_due_ms(self) -> int | None:
        """The earliest end of a window still held, or None when nothing is held."""
        self._skip_stale()
        return self._due[0][0] if self._due else None

    def due(self, now_ms: int) -> list[tuple[K, tuple[MergedFrame, ...]]]:
        """Every connection whose window ended by ``now_ms``, with its frames, in due order;
        they are no longer held."""
        out: list[tuple[K, tuple[MergedFrame, ...]]] = []
        while True:
            self._skip_stale()
            if not self._due or self._due[0][0] > now_ms:
                return out
            _, _, key = heapq.heappop(self._due)
            out.append((key, self._held.pop(key).frames()))

    def discard(self, key: K) -> int:
        """The connection closed (or was KICKED): its held frames are never sent; returns
        how many were dropped."""
        held = self._held.pop(key, None)
        return 0 if held is None else len(held.frames())

    def _skip_stale(self) -> None:
        """Drop heap heads whose key was discarded (or re-held with a later window)."""
        heap = self._due
        while heap:
            due_ms, _, key = heap[0]
            held = self._held.get(key)
            if held is not None and held.due_ms == due_ms:
                return
            heapq.heappop(heap)


def _merge(held: _Held, frame: MergedFrame) -> int:
    """Replace-not-add, forward-only; 1 when a frame (the old or the new one) is dropped."""
    if isinstance(frame, SessionDelta):
        old = held.deltas.get(frame.conversation_id)
        if old is None:
            held.deltas[frame.conversation_id] = frame
            return 0
        if frame.projection_mailbox_seq >= old.projection_mailbox_seq:
            held.deltas[frame.conversation_id] = frame  # keeps its first-arrival position
        return 1
    badge = held.badge
    if badge is None:
        held.badge = frame
        return 0
    if frame.badge_projection_mailbox_seq >= badge.badge_projection_mailbox_seq:
        held.badge = frame
    return 1
