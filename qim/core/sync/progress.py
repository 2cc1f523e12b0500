"""The server's side of the login barrier: what this session served, and SYNC_COMPLETE (9.3.4).

Why the barrier is server state: if the client alone decided when sync is over, a client that
sends SYNC_COMPLETE early would open the realtime queue while ranges below ``sync_to_seq`` are
still unpulled; higher pushes would arrive first and the client would render out of order or
advance its cursor past unapplied entries (9.3.4, 9.4.3). So ONLINE_READY is sent only when

1. ``SYNC_COMPLETE.sync_to_seq`` equals the ``sync_to_seq`` this session's AUTH_OK assigned, and
2. the ``(after_seq, covered_through_seq]`` ranges of the MAILBOX_BATCHes this session served
   contiguously cover ``(start_seq, sync_to_seq]``, per sub-range, in any arrival order
   (pipelined pulls, 9.3.2);

otherwise SYNC_INCOMPLETE and the barrier stays (I-21, T30, 26.2.3).

``start_seq`` is where the session's AUTH placed the device (its cursor; the trim line for a new
device). When AUTH_OK said ``has_offline=false`` the server already knows that range holds no
entry, so it counts as covered from the start and SYNC_COMPLETE may follow at once (9.3.1, T22;
the REBUILD re-handshake is the same case with an empty range, 9.6.3 step 0).

The barrier itself is one monotone bit (``released``): the connection's lifecycle is the
gateway's transition table (``qim.gateway.states``); this object only decides the one edge
SYNCING -> ONLINE and answers a repeated SYNC_COMPLETE the same way, so a retry is harmless.

Memory is bounded: a legitimate client has at most ``pull_mailbox_window`` (4) disjoint
sub-ranges in flight, so ranges not yet joined to the contiguous prefix are capped at
``max_pending_ranges``; beyond it the highest are forgotten, which only costs a misbehaving
client a re-pull (its SYNC_COMPLETE fails until the gap is served again).
"""

from __future__ import annotations

from typing import Final

from qim.core.sync.errors import sync_incomplete
from qim.schemas.frames import Error, OnlineReady, SyncComplete

__all__ = ["DEFAULT_MAX_PENDING_RANGES", "SyncProgress"]

DEFAULT_MAX_PENDING_RANGES: Final = 64


class SyncProgress:
    """Coverage of ``(start_seq, sync_to_seq]`` by this session's served batches."""

    __slots__ = ("_pending", "_reach", "max_pending_ranges", "released", "start_seq", "sync_to_seq")

    def __init__(
        self,
        start_seq: int,
        sync_to_seq: int,
        *,
        has_offline: bool = True,
        max_pending_ranges: int = DEFAULT_MAX_PENDING_RANGES,
    ) -> None:
        if max_pending_ranges < 1:
            raise ValueError("max_pending_ranges must be >= 1")
        self.start_seq = start_seq
        self.sync_to_seq = sync_to_seq
        self.max_pending_ranges = max_pending_ranges
        self.released = False
        self._reach = start_seq if has_offline else max(start_seq, sync_to_seq)
        self._pending: list[tuple[int, int]] = []  # disjoint (after, covered], ascending

    @property
    def covered_through(self) -> int:
        """The end of the contiguous prefix served so far (``start_seq`` when nothing was)."""
        return self._reach

    @property
    def pending_ranges(self) -> tuple[tuple[int, int], ...]:
        """Served ranges not yet joined to the prefix: the sub-ranges that finished early."""
        return tuple(self._pending)

    def acked_past_contiguity(self, acked_seq: int) -> bool:
        """A PULL_MAILBOX ``acked_seq`` beyond the contiguous prefix this session served: the
        client moved its cursor on PUSH_EVENTS or past a gap (6.8, I-22), which only a client
        bug does; the gateway counts it as ``cursor_advanced_by_push_total`` (24.1.5)."""
        return acked_seq > self._reach

    def is_covered(self) -> bool:
        return self._reach >= self.sync_to_seq

    def record(self, after_seq: int, covered_through_seq: int) -> None:
        """Note one served MAILBOX_BATCH: the range ``(after_seq, covered_through_seq]``."""
        if covered_through_seq <= max(after_seq, self._reach):
            return  # empty, or nothing beyond the prefix
        if after_seq > self._reach:
            self._insert(after_seq, covered_through_seq)
            return
        self._reach = covered_through_seq
        while self._pending and self._pending[0][0] <= self._reach:
            _, end = self._pending.pop(0)
            self._reach = max(self._reach, end)

    def _insert(self, after_seq: int, covered_through_seq: int) -> None:
        merged: list[tuple[int, int]] = []
        for start, end in sorted([*self._pending, (after_seq, covered_through_seq)]):
            if merged and start <= merged[-1][1]:  # (a, b] and (b, c] join into (a, c]
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        del merged[self.max_pending_ranges :]
        self._pending = merged

    def complete(self, request: SyncComplete) -> OnlineReady | Error:
        """SYNC_COMPLETE -> ONLINE_READY, or SYNC_INCOMPLETE with the barrier kept (9.3.4)."""
        if request.sync_to_seq != self.sync_to_seq:
            return sync_incomplete(
                f"sync_to_seq {request.sync_to_seq} is not this session's {self.sync_to_seq}"
            )
        if not self.is_covered():
            return sync_incomplete(
                f"served batches cover through {self._reach}, not {self.sync_to_seq}"
            )
        self.released = True
        return OnlineReady()
