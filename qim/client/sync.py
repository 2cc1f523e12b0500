"""The SDK's device cursor and login-sync state: a transition table, no I/O (6.8, 9.3-9.6).

The application feeds frames in, sends what comes out, and persists ``cursor`` after storing the
entries a call returned. Why each rule:

* The cursor is the highest position below which everything is parsed and stored (6.8). Only
  MAILBOX_BATCHes move it, contiguously: a batch counts only when it starts at the cursor, and a
  pipelined sub-range that finishes early waits for every sub-range below it (9.3.2, T28). PUSH
  never moves it (9.4.3, I-24): a push past an unpulled range would skip that range forever.
* Pushes before ONLINE_READY or while MAILBOX_DIRTY is recovered are staged (9.4.3, 9.4.4); all
  delivery is deduplicated by ``(message_id, event_id)`` (11.1.1), keeping ``max(2000 keys, 10
  minutes)`` and evicting the lowest mailbox_seq first (9.4.4).
* Pull only when ``last_applied_mailbox_seq < last_pushed_user_seq``, on ``mailbox_dirty``, or on
  the user's request - never by comparing a watermark or a timestamp (6.10.1, 15.1.1) - as
  ``(cursor, 0]``, at most once per ``client_resync_min_interval`` (B.3).
* AUTH_OK{has_offline=false} + ONLINE_READY states that nothing lies in ``(cursor, sync_to_seq]``
  (checked against the trim line), so the cursor moves to ``sync_to_seq`` like an empty batch;
  else every quiet login would leave it below ``last_pushed_user_seq`` (which starts at
  ``sync_to_seq``, 15.1.1) and cost a pull.
* CURSOR_EXPIRED -> REBUILD (9.6.3, seed 003 M-7): keep the token, empty the seq, re-AUTH with
  ``(token, 0)``; the server answers an empty range and the cursor starts at ``sync_to_seq``, so
  ``(trim, sync_to_seq]`` is never pulled again. ``rebuild_pending`` stays persisted until the
  application's back-fill calls :meth:`MailboxSync.rebuild_done`. CURSOR_REBASED adopts
  ``new_cursor`` and resumes after ``replay_from_seq``; CURSOR_INVALID drops the cursor (the next
  AUTH is a new device's; dedup absorbs the re-pull).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from itertools import pairwise
from types import MappingProxyType
from typing import Final

from qim.client.errors import IllegalTransition, QimClientError
from qim.schemas.frames import (
    AuthOk,
    Error,
    ErrorCode,
    MailboxBatch,
    MailboxCursor,
    Pong,
    PullMailbox,
    PushEvents,
    SyncComplete,
    SyncEntry,
)

__all__ = [
    "TRANSITIONS",
    "DeviceCursor",
    "MailboxSync",
    "SyncEvent",
    "SyncPhase",
    "SyncProtocolError",
]


class SyncPhase(Enum):
    OFFLINE = "offline"  # no session; the next step is AUTH
    AUTHENTICATING = "authenticating"  # AUTH sent
    SYNCING = "syncing"  # AUTH_OK seen: pulling up to sync_to_seq, pushes staged
    ONLINE = "online"  # ONLINE_READY seen: pushes delivered
    RESYNCING = "resyncing"  # MAILBOX_DIRTY: re-pulling up to now, pushes staged


class SyncEvent(Enum):
    AUTH_SENT = "auth_sent"
    AUTH_OK = "auth_ok"
    BATCH = "batch"
    PUSH = "push"
    DIRTY = "dirty"
    SYNC_INCOMPLETE = "sync_incomplete"
    ONLINE_READY = "online_ready"
    RESYNCED = "resynced"
    CURSOR_LOST = "cursor_lost"  # CURSOR_EXPIRED / CURSOR_REBASED / CURSOR_INVALID: re-AUTH
    DISCONNECT = "disconnect"


_P, _E = SyncPhase, SyncEvent
_CONNECTED = (_P.AUTHENTICATING, _P.SYNCING, _P.ONLINE, _P.RESYNCING)
TRANSITIONS: Final[Mapping[tuple[SyncPhase, SyncEvent], SyncPhase]] = MappingProxyType(
    {
        (_P.OFFLINE, _E.AUTH_SENT): _P.AUTHENTICATING,
        (_P.OFFLINE, _E.DISCONNECT): _P.OFFLINE,
        (_P.AUTHENTICATING, _E.AUTH_OK): _P.SYNCING,
        (_P.AUTHENTICATING, _E.PUSH): _P.AUTHENTICATING,
        (_P.AUTHENTICATING, _E.DIRTY): _P.AUTHENTICATING,  # the login pulls cover it anyway
        **{(p, e): p for p in (_P.SYNCING, _P.RESYNCING) for e in (_E.BATCH, _E.PUSH, _E.DIRTY)},
        (_P.SYNCING, _E.SYNC_INCOMPLETE): _P.SYNCING,
        (_P.SYNCING, _E.ONLINE_READY): _P.ONLINE,
        (_P.ONLINE, _E.BATCH): _P.ONLINE,
        (_P.ONLINE, _E.PUSH): _P.ONLINE,
        (_P.ONLINE, _E.DIRTY): _P.RESYNCING,
        (_P.RESYNCING, _E.RESYNCED): _P.ONLINE,
        **{(p, e): _P.OFFLINE for p in _CONNECTED for e in (_E.CURSOR_LOST, _E.DISCONNECT)},
    }
)

DEDUP_MIN_KEYS: Final = 2000  # pull_mailbox_max_items x 4 (9.4.4)
DEDUP_WINDOW_MS: Final = 10 * 60 * 1000
RESYNC_MIN_INTERVAL_MS: Final = 5000  # B.3 client_resync_min_interval


class SyncProtocolError(QimClientError):
    """A MAILBOX_BATCH that breaks 9.3.3 or answers no pull of ours; the cursor did not move."""


@dataclass(frozen=True, slots=True)
class DeviceCursor:
    """The one row the application persists per device (A's ``local_cursor``)."""

    token: bytes = b""
    last_applied_mailbox_seq: int = 0
    rebuild_pending: bool = False  # CURSOR_EXPIRED seen, REBUILD back-fill not finished


@dataclass(slots=True)
class _Range:
    after: int  # fixed exclusive start of this sub-range
    up_to: int  # request bound; 0 = "up to W", fixed by the first batch's lane_watermark
    done: int  # covered through so far
    complete: bool = False

    def request(self, max_items: int, max_bytes: int) -> PullMailbox:
        return PullMailbox(
            after_seq=self.done, up_to_seq=self.up_to, max_items=max_items, max_bytes=max_bytes
        )


@dataclass(slots=True)
class _Seen:
    """(message_id, event_id) keys; evicts the lowest mailbox_seq once full and out of window."""

    capacity: int
    window_ms: int
    keys: dict[tuple[bytes, int], int] = field(default_factory=dict)  # key -> seen_at
    heap: list[tuple[int, bytes, int]] = field(default_factory=list)

    def fresh(self, entry: SyncEntry, now_ms: int) -> bool:
        key = (entry.message_id, entry.event_id)
        if key in self.keys:
            return False
        self.keys[key] = now_ms
        heapq.heappush(self.heap, (entry.mailbox_seq, *key))
        while len(self.keys) > self.capacity:
            _, message_id, event_id = self.heap[0]
            if now_ms - self.keys[message_id, event_id] < self.window_ms:
                break
            heapq.heappop(self.heap)
            del self.keys[message_id, event_id]
        return True


class MailboxSync:
    """One device's sync state; every method is a transition of :data:`TRANSITIONS`."""

    def __init__(
        self,
        cursor: DeviceCursor | None = None,
        *,
        window: int = 4,  # B.3 pull_mailbox_window
        max_items: int = 500,  # B.3 pull_mailbox_max_items
        max_bytes: int = 0,  # 0 = the server's pull_mailbox_max_bytes
        resync_min_interval_ms: int = RESYNC_MIN_INTERVAL_MS,
    ) -> None:
        self.cursor = cursor or DeviceCursor()
        self.phase = SyncPhase.OFFLINE
        self.window, self.max_items, self.max_bytes = max(window, 1), max_items, max_bytes
        self.resync_min_interval_ms = resync_min_interval_ms
        self.sync_to_seq = self.last_pushed_user_seq = self._presented = 0
        self.dirty = self._offline_empty = False
        self._last_fallback_ms: int | None = None
        self._ranges: list[_Range] = []
        self._staged: list[SyncEntry] = []
        self._seen = _Seen(DEDUP_MIN_KEYS, DEDUP_WINDOW_MS)

    def _fire(self, event: SyncEvent) -> None:
        target = TRANSITIONS.get((self.phase, event))
        if target is None:
            raise IllegalTransition(f"{event.name} is not allowed in sync phase {self.phase.name}")
        self.phase = target

    def _deliver(self, entries: Iterable[SyncEntry], now_ms: int) -> list[SyncEntry]:
        return [entry for entry in entries if self._seen.fresh(entry, now_ms)]

    def _set_seq(self, seq: int) -> None:
        if seq > self.cursor.last_applied_mailbox_seq:
            self.cursor = replace(self.cursor, last_applied_mailbox_seq=seq)

    # -- login --
    def auth_cursor(self) -> MailboxCursor | None:
        """The ``AUTH.mailbox_cursor`` to send: (token, 0) is the REBUILD re-handshake."""
        self._fire(SyncEvent.AUTH_SENT)
        token, seq = self.cursor.token, self.cursor.last_applied_mailbox_seq
        if token and (seq > 0 or self.cursor.rebuild_pending):
            self._presented = seq
            return MailboxCursor(token=token, last_applied_mailbox_seq=seq)
        self._presented = 0  # a new device (9.6.1): the server starts it at the trim line
        return None

    def on_auth_ok(self, ok: AuthOk) -> list[PullMailbox]:
        """The login pulls: ``(cursor, sync_to_seq]`` cut by seq value into <= window ranges."""
        self._fire(SyncEvent.AUTH_OK)
        seq = self._presented  # the server covers from what AUTH showed it, not a token-less seq
        self.sync_to_seq = self.last_pushed_user_seq = ok.sync_to_seq
        self._offline_empty = not ok.has_offline
        self._ranges = []
        if not ok.has_offline or seq >= ok.sync_to_seq:
            return []
        low = max(seq, ok.trim_watermark)  # a new device's range starts at the trim line
        parts = self.window if ok.pending_entry_count_hint > self.max_items else 1  # 9.3.5
        parts = max(1, min(parts, ok.sync_to_seq - low))
        bounds = [low + (ok.sync_to_seq - low) * i // parts for i in range(parts + 1)]
        bounds[0] = seq
        self._ranges = [_Range(a, b, a) for a, b in pairwise(bounds)]
        return [r.request(self.max_items, self.max_bytes) for r in self._ranges]

    def sync_complete(self) -> SyncComplete | None:
        """SYNC_COMPLETE once every login range is pulled and applied, else None."""
        if self.phase is SyncPhase.SYNCING and not self._ranges:
            return SyncComplete(sync_to_seq=self.sync_to_seq)
        return None

    def on_online_ready(self, now_ms: int) -> list[SyncEntry]:
        """Barrier released: staged pushes are delivered (deduplicated against the pulls)."""
        self._fire(SyncEvent.ONLINE_READY)
        if self._offline_empty:
            self._set_seq(self.sync_to_seq)  # the implicit empty batch (see module docstring)
        staged, self._staged = self._staged, []
        return self._deliver(staged, now_ms)

    # -- pulls --
    def on_batch(self, request: PullMailbox, batch: MailboxBatch, now_ms: int) -> list[SyncEntry]:
        """Apply one MAILBOX_BATCH; returns the entries to store. Persist ``cursor`` after them."""
        asked = (request.after_seq, request.up_to_seq)
        rng = next((r for r in self._ranges if (r.done, r.up_to) == asked), None)
        if rng is None or rng.complete:
            raise SyncProtocolError(f"no outstanding pull ({asked[0]}, {asked[1]}]")
        bound = rng.up_to or batch.lane_watermark
        covered = batch.covered_through_seq
        if not rng.done <= covered <= bound or batch.has_more != (covered != bound):
            raise SyncProtocolError(f"covered_through_seq {covered} breaks ({rng.done}, {bound}]")
        if batch.has_more and covered == rng.done:
            raise SyncProtocolError("empty batch that did not reach up_to_seq (9.3.3 rule 2)")
        if any(not rng.done < e.mailbox_seq <= covered for e in batch.entries):
            raise SyncProtocolError("entry outside (after_seq, covered_through_seq]")
        self._fire(SyncEvent.BATCH)
        rng.up_to, rng.done, rng.complete = bound, covered, not batch.has_more
        fresh = self._deliver(batch.entries, now_ms)
        self._ranges.sort(key=lambda r: r.after)
        while self._ranges and self._ranges[0].after <= self.cursor.last_applied_mailbox_seq:
            self._set_seq(self._ranges[0].done)
            if not self._ranges[0].complete:
                break
            self._ranges.pop(0)
        if self.phase is SyncPhase.RESYNCING and not self._ranges and not self.dirty:
            self._fire(SyncEvent.RESYNCED)
            fresh += self._deliver(self._staged, now_ms)
            self._staged = []
        return fresh

    def next_requests(self) -> list[PullMailbox]:
        """The continuation of every unfinished range (after the batch that left it has_more)."""
        return [r.request(self.max_items, self.max_bytes) for r in self._ranges if not r.complete]

    def fallback_pull(self, now_ms: int, *, user_refresh: bool = False) -> PullMailbox | None:
        """PULL_MAILBOX(cursor, 0) if 6.10.1 calls for one and the rate limit allows, else None."""
        if self.phase not in (SyncPhase.ONLINE, SyncPhase.RESYNCING) or self._ranges:
            return None
        seq = self.cursor.last_applied_mailbox_seq
        if not (self.dirty or user_refresh or seq < self.last_pushed_user_seq):
            return None
        last = self._last_fallback_ms
        if last is not None and now_ms - last < self.resync_min_interval_ms:
            return None
        self._last_fallback_ms, self.dirty = now_ms, False  # a later DIRTY needs another pull
        self._ranges = [_Range(seq, 0, seq)]
        return self._ranges[0].request(self.max_items, self.max_bytes)

    # -- realtime --
    def on_push(self, push: PushEvents, now_ms: int) -> list[SyncEntry]:
        """Deliver (ONLINE) or stage a push; the cursor never moves here (9.4.3)."""
        self._fire(SyncEvent.PUSH)
        self.last_pushed_user_seq = max(self.last_pushed_user_seq, push.last_pushed_user_seq)
        if self.phase is SyncPhase.ONLINE:
            return self._deliver(push.events, now_ms)
        self._staged.extend(push.events)
        return []

    def on_pong(self, pong: Pong) -> None:
        self.last_pushed_user_seq = max(self.last_pushed_user_seq, pong.last_pushed_user_seq)
        if pong.mailbox_dirty:
            self._dirty()

    def _dirty(self) -> None:
        self._fire(SyncEvent.DIRTY)
        if self.phase is SyncPhase.RESYNCING:  # during login the login pulls cover it
            self.dirty = True

    # -- errors and endings --
    def on_error(self, error: Error) -> list[PullMailbox]:
        """Sync's share of A.6; returns pulls to send (SYNC_INCOMPLETE: pull the session again)."""
        code = error.code
        if code == ErrorCode.MAILBOX_DIRTY:
            self._dirty()
        elif code == ErrorCode.SYNC_INCOMPLETE:
            self._fire(SyncEvent.SYNC_INCOMPLETE)
            self._ranges = [_Range(self._presented, self.sync_to_seq, self._presented)]
            return self.next_requests()
        elif code == ErrorCode.CURSOR_EXPIRED:
            self._lose(replace(self.cursor, last_applied_mailbox_seq=0, rebuild_pending=True))
        elif code == ErrorCode.CURSOR_REBASED:
            token, seq = error.new_cursor or b"", error.replay_from_seq or 0
            self._lose(replace(self.cursor, token=token, last_applied_mailbox_seq=seq))
        elif code == ErrorCode.CURSOR_INVALID:
            self._lose(DeviceCursor(rebuild_pending=self.cursor.rebuild_pending))
        return []

    def _lose(self, cursor: DeviceCursor) -> None:
        self._fire(SyncEvent.CURSOR_LOST)
        self.cursor = cursor
        self._reset()

    def rebuild_done(self) -> None:
        """The application finished the 9.6.3 back-fill (steps 1-5); REBUILD is over."""
        self.cursor = replace(self.cursor, rebuild_pending=False)

    def disconnect(self) -> None:
        self._fire(SyncEvent.DISCONNECT)
        self._reset()

    def _reset(self) -> None:
        self._ranges, self._staged, self.dirty = [], [], False
