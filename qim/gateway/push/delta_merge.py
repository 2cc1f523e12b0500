"""The node's SESSION_DELTA / BADGE_UPDATE merge window: one buffer and one timer per node.

Why one timer for the node: at 20k mostly idle connections a task or timer per connection is
waste; the pure :class:`~qim.core.session_list.delta_merge.DeltaMergeBuffer` keeps every
connection's window in one heap, and a single ``loop.call_at`` handle is armed for the earliest
window end (none while nothing is held). A :class:`~qim.gateway.transport.connection.Connection`
built with a merge hands its SESSION_DELTA / BADGE_UPDATE ``Send`` actions to :meth:`hold` instead
of
its queue, and :meth:`discard` s them when it closes: nothing follows KICKED, as before.

Time is ``time.monotonic`` in milliseconds (the window is a duration, never materialized).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from qim.core.session_list.delta_merge import DeltaMergeBuffer, MergedFrame

__all__ = ["MergeTarget", "SessionFrameMerge", "monotonic_ms"]

log = logging.getLogger(__name__)


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class MergeTarget(Protocol):
    """A connection as the merge sees it (hashable by identity)."""

    def __hash__(self) -> int: ...

    def deliver_merged(self, frames: tuple[MergedFrame, ...]) -> None: ...


class SessionFrameMerge:
    """``session_delta_merge_window`` for every connection of a node (module doc)."""

    def __init__(
        self,
        window_ms: int,
        *,
        clock_ms: Callable[[], int] = monotonic_ms,
        on_offer: Callable[[int], None] | None = None,
    ) -> None:
        if window_ms < 1:
            raise ValueError("a merge window of 0 is no merge: build the connections without one")
        self.buffer: DeltaMergeBuffer[MergeTarget] = DeltaMergeBuffer(window_ms)
        self._clock_ms = clock_ms
        self._on_offer = on_offer  # merged-away count of each offered frame (the metric)
        self._timer: asyncio.TimerHandle | None = None
        self._armed_ms: int | None = None

    def hold(self, conn: MergeTarget, frame: MergedFrame) -> None:
        merged = self.buffer.offer(conn, frame, self._clock_ms())
        if self._on_offer is not None:
            self._on_offer(merged)
        self._arm()

    def discard(self, conn: MergeTarget) -> None:
        """The connection is closing: its held frames are dropped (the timer stays lazy)."""
        self.buffer.discard(conn)

    def flush_due(self) -> None:
        """Send every window that has ended (the timer's callback; callable directly)."""
        self._timer, self._armed_ms = None, None
        try:
            for conn, frames in self.buffer.due(self._clock_ms()):
                try:
                    conn.deliver_merged(frames)
                except Exception:  # one connection's failure must not stop the others
                    log.exception("merged session frames not delivered to %r", conn)
        finally:
            self._arm()

    def close(self) -> None:
        """The node stops: no callback after this."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._armed_ms = None, None

    def _arm(self) -> None:
        due = self.buffer.next_due_ms()
        if due is None or (self._armed_ms is not None and self._armed_ms <= due):
            return
        if self._timer is not None:
            self._timer.cancel()
        delay = max(0, due - self._clock_ms()) / 1000
        self._timer = asyncio.get_running_loop().call_later(delay, self.flush_due)
        self._armed_ms = due
