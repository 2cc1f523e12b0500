"""The login barrier of one connection (spec 9.4) as a transition table (style.md 6).

Why a barrier: AUTH_OK fixes ``sync_to_seq`` (= the lane watermark at AUTH, 9.3.1) and so cuts
this device's events in two halves that never need to know each other's progress (9.4.1):

* ``mailbox_seq <= sync_to_seq``: the client pulls it with PULL_MAILBOX -> never pushed
  (action SKIP). The rule also holds after ONLINE_READY: such an event is covered by the pull;
* ``mailbox_seq > sync_to_seq``: waits in this connection's realtime queue until the server
  has validated SYNC_COMPLETE (9.3.4), then drains in ascending ``mailbox_seq`` (RELEASE).
  Pushing it earlier would let the client render or apply past its unpulled range (9.4.3).

The queue is bounded. Its counters are the connection's send-buffer ledger (9.4.2: one set of
counters), so the default bound is ``conn_send_soft_watermark``. Reaching it drops the whole
queue -- new item included -- and the owner must signal MAILBOX_DIRTY (OVERFLOW); nothing is
ever dropped silently, and the durable entries stay in the mailbox (9.4.2). Flow control may
also empty the queue (DROP_QUEUE, 11.3.1 DEGRADED). Queue items hold the shared body fragment
by reference, never a copy per connection (9.4.2 "body pointer").
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final

from qim.core.push.table import Machine, Transition, TransitionTable
from qim.core.push.wire import PendingPush
from qim.params import lookup
from qim.params.values import Watermark

__all__ = [
    "BARRIER_TABLE",
    "DEFAULT_QUEUE_LIMIT",
    "BarrierAction",
    "BarrierEvent",
    "BarrierResult",
    "BarrierState",
    "LoginBarrier",
]


class BarrierState(Enum):
    SYNCING = "SYNCING"  # AUTH_OK sent, ONLINE_READY not yet
    ONLINE_READY = "ONLINE_READY"
    CLOSED = "CLOSED"


class BarrierEvent(Enum):
    PUSH_COVERED = "PUSH_COVERED"  # an event with mailbox_seq <= sync_to_seq
    PUSH_NEW = "PUSH_NEW"  # mailbox_seq > sync_to_seq, and the queue has room
    QUEUE_FULL = "QUEUE_FULL"  # mailbox_seq > sync_to_seq, and queueing it reaches the bound
    DROP_QUEUE = "DROP_QUEUE"  # flow control entered DEGRADED (11.3.1)
    SYNC_COMPLETE = "SYNC_COMPLETE"  # SYNC_COMPLETE passed the checks of 9.3.4
    SYNC_INCOMPLETE = "SYNC_INCOMPLETE"  # it failed them: ERROR{SYNC_INCOMPLETE}, barrier stays
    CLOSE = "CLOSE"


class BarrierAction(Enum):
    NONE = "NONE"
    SKIP = "SKIP"  # not pushed: the client pulls it
    QUEUE = "QUEUE"
    PASS = "PASS"  # hand it to flow control now
    OVERFLOW = "OVERFLOW"  # drop queue + this event, owner signals MAILBOX_DIRTY
    DISCARD = "DISCARD"  # drop the queue (flow control decided; or the connection closed)
    RELEASE = "RELEASE"  # drain the queue in ascending mailbox_seq


_S, _E, _A = BarrierState, BarrierEvent, BarrierAction


def _t(target: BarrierState, action: BarrierAction) -> Transition[BarrierState, BarrierAction]:
    return Transition(target, action)


BARRIER_TABLE: Final = TransitionTable[BarrierState, BarrierEvent, BarrierAction](
    "login barrier",
    _S.SYNCING,
    {
        _S.SYNCING: {
            _E.PUSH_COVERED: _t(_S.SYNCING, _A.SKIP),
            _E.PUSH_NEW: _t(_S.SYNCING, _A.QUEUE),
            _E.QUEUE_FULL: _t(_S.SYNCING, _A.OVERFLOW),
            _E.DROP_QUEUE: _t(_S.SYNCING, _A.DISCARD),
            _E.SYNC_COMPLETE: _t(_S.ONLINE_READY, _A.RELEASE),
            _E.SYNC_INCOMPLETE: _t(_S.SYNCING, _A.NONE),
            _E.CLOSE: _t(_S.CLOSED, _A.DISCARD),
        },
        _S.ONLINE_READY: {
            _E.PUSH_COVERED: _t(_S.ONLINE_READY, _A.SKIP),
            _E.PUSH_NEW: _t(_S.ONLINE_READY, _A.PASS),
            _E.DROP_QUEUE: _t(_S.ONLINE_READY, _A.NONE),  # nothing is held any more
            _E.CLOSE: _t(_S.CLOSED, _A.NONE),
        },
        # A second SYNC_COMPLETE, or a push to a closed connection, is the caller's bug.
        _S.CLOSED: {_E.CLOSE: _t(_S.CLOSED, _A.NONE)},
    },
)

_SOFT: Final[Watermark] = lookup("conn_send_soft_watermark").default
DEFAULT_QUEUE_LIMIT: Final = _SOFT
"""9.4.2: the realtime queue shares the send buffer's counters, so it overflows at soft."""


@dataclass(frozen=True, slots=True)
class BarrierResult:
    """What happened to one offered push; ``dropped`` lists what OVERFLOW threw away."""

    action: BarrierAction
    dropped: tuple[PendingPush, ...] = ()


class LoginBarrier:
    """One connection's barrier state, ``sync_to_seq`` and realtime queue."""

    def __init__(self, sync_to_seq: int, limit: Watermark = DEFAULT_QUEUE_LIMIT) -> None:
        self.sync_to_seq = sync_to_seq
        self.limit = limit
        self._machine = Machine(BARRIER_TABLE)
        self._queue: list[PendingPush] = []
        self.queued_bytes = 0

    @property
    def state(self) -> BarrierState:
        return self._machine.state

    @property
    def queued_items(self) -> int:
        return len(self._queue)

    @property
    def queued(self) -> tuple[PendingPush, ...]:
        """The realtime queue in arrival order (audits and tests)."""
        return tuple(self._queue)

    def offer(self, pending: PendingPush) -> BarrierResult:
        """Classify one push and apply the table's action to it."""
        action = self._machine.fire(self._classify(pending))
        if action is BarrierAction.QUEUE:
            self._queue.append(pending)
            self.queued_bytes += pending.ledger_bytes
        elif action is BarrierAction.OVERFLOW:
            return BarrierResult(action, (*self._take(), pending))
        return BarrierResult(action)

    def sync_complete(self) -> tuple[PendingPush, ...]:
        """ONLINE_READY: the queue, ascending by mailbox_seq (arrival order breaks ties)."""
        self._machine.fire(BarrierEvent.SYNC_COMPLETE)
        return tuple(sorted(self._take(), key=lambda p: p.mailbox_seq))

    def sync_incomplete(self) -> None:
        self._machine.fire(BarrierEvent.SYNC_INCOMPLETE)

    def drop_queue(self) -> tuple[PendingPush, ...]:
        """Flow control's DEGRADED: empty the queue; the owner signals MAILBOX_DIRTY."""
        self._machine.fire(BarrierEvent.DROP_QUEUE)
        return self._take()

    def close(self) -> tuple[PendingPush, ...]:
        self._machine.fire(BarrierEvent.CLOSE)
        return self._take()

    def _classify(self, pending: PendingPush) -> BarrierEvent:
        if pending.mailbox_seq <= self.sync_to_seq:
            return BarrierEvent.PUSH_COVERED
        if self.state is BarrierState.SYNCING and (
            len(self._queue) + 1 >= self.limit.items
            or self.queued_bytes + pending.ledger_bytes >= self.limit.bytes
        ):
            return BarrierEvent.QUEUE_FULL
        return BarrierEvent.PUSH_NEW

    def _take(self) -> tuple[PendingPush, ...]:
        taken = tuple(self._queue)
        self._queue.clear()
        self.queued_bytes = 0
        return taken
