"""One connection's online delivery: login barrier + flow control on one ledger (9.4, 11.3).

Why one object: the barrier's realtime queue and the send buffer share ONE set of counters
(9.4.2), because two ledgers produce the unobservable state "enqueued but never sent, neither
a push nor a MAILBOX_DIRTY". The ConnectionNode feeds each :class:`~qim.core.push.expand.Delivery`
to the connection's :class:`ConnectionPush` and performs the returned actions; the driver
reports consumption with :meth:`ConnectionPush.drained`. Pure: no clock, no socket.

Invariant (checked by :meth:`ConnectionPush.audit` and a property test): an event above
``sync_to_seq`` is written, or its drop is reported to the client -- ERROR{MAILBOX_DIRTY} at
once when a degradation or overflow starts, ``PONG.mailbox_dirty`` for drops after that -- or
the connection is closing, and the next session's sync covers it (11.3.1 CLOSING).

``last_pushed_user_seq`` starts at ``sync_to_seq`` (15.1.1) and is the max ``mailbox_seq``
handed to the send buffer (I-21): the value in each PUSH_EVENTS and in PONG. Stream-0 frames
go through :meth:`ConnectionPush.control` in every state but CLOSED (I-25).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, TypeAlias

from qim.core.push.barrier import BarrierAction, BarrierState, LoginBarrier
from qim.core.push.flow import DEFAULT_FLOW_LIMITS, FlowAction, FlowControl, FlowLimits, FlowState
from qim.core.push.table import IllegalTransition
from qim.core.push.wire import PendingPush
from qim.params.values import Watermark
from qim.schemas.frames.connection import Error
from qim.schemas.frames.errors import ErrorCode
from qim.schemas.records.push import FramePriority

__all__ = [
    "CLOSE_IDLE",
    "CLOSE_SEND_BUFFER_HARD",
    "CloseConnection",
    "ConnectionPush",
    "DroppedWhileDegraded",
    "PushAction",
    "SendControl",
    "SignalDirty",
    "WritePush",
]

CLOSE_SEND_BUFFER_HARD: Final = "send_buffer_hard"  # conn_send_hard_watermark reached
CLOSE_IDLE: Final = "idle_timeout"  # idle_timeout without consumption


@dataclass(frozen=True, slots=True)
class WritePush:
    """Write a PUSH_EVENTS with this body on stream 1; report ``ledger_bytes`` via drained()."""

    body: bytes
    mailbox_seq: int
    last_pushed_user_seq: int
    ledger_bytes: int
    priority: FramePriority


@dataclass(frozen=True, slots=True)
class SignalDirty:
    """Send one ERROR{code=MAILBOX_DIRTY} on stream 0 now (11.3.1, 9.4.2)."""

    @property
    def error(self) -> Error:
        return Error(code=ErrorCode.MAILBOX_DIRTY, detail="pushes dropped: pull your mailbox")


@dataclass(frozen=True, slots=True)
class DroppedWhileDegraded:
    """A push offered while DEGRADED was not written (11.3.1): only counted, PONG says dirty."""

    mailbox_seq: int


@dataclass(frozen=True, slots=True)
class SendControl:
    """A stream-0 frame that goes out whatever the flow state (I-25)."""

    frame: bytes


@dataclass(frozen=True, slots=True)
class CloseConnection:
    reason: str


PushAction: TypeAlias = WritePush | SignalDirty | CloseConnection | DroppedWhileDegraded


class ConnectionPush:
    """Barrier, flow state, ledger, ``last_pushed_user_seq`` and ``mailbox_dirty``."""

    def __init__(
        self,
        sync_to_seq: int,
        *,
        limits: FlowLimits = DEFAULT_FLOW_LIMITS,
        queue_limit: Watermark | None = None,
    ) -> None:
        self.barrier = LoginBarrier(
            sync_to_seq, limits.soft if queue_limit is None else queue_limit
        )
        self.flow = FlowControl(limits)
        self.last_pushed_user_seq = sync_to_seq
        # the highest mailbox_seq offered: written, queued or dropped -- decided on either way
        self.decided_seq = sync_to_seq
        self.mailbox_dirty = False
        self.sent_bytes = 0  # stream-1 frames handed to the send buffer, not yet drained
        self.sent_items = 0
        self._unreported_drops = 0

    @property
    def level(self) -> tuple[int, int]:
        """The one ledger (9.4.2): send buffer + realtime queue, in bytes and items."""
        return (
            self.sent_bytes + self.barrier.queued_bytes,
            self.sent_items + self.barrier.queued_items,
        )

    # -- inputs -------------------------------------------------------------------------------

    def offer(self, pending: PendingPush) -> list[PushAction]:
        """One message's events for this connection, from expansion."""
        state = self.flow.state  # CLOSED: the closed barrier below raises IllegalTransition
        self.decided_seq = max(self.decided_seq, pending.mailbox_seq)
        if state is FlowState.CLOSING:
            return []  # closing anyway: the next session's sync covers it
        if state is FlowState.DEGRADED and pending.mailbox_seq > self.barrier.sync_to_seq:
            self._drop(1)  # DEGRADED sends nothing on stream 1; PONG will say dirty
            return [DroppedWhileDegraded(pending.mailbox_seq)]
        result = self.barrier.offer(pending)
        if result.action is BarrierAction.PASS:
            return [self._write(pending), *self._level()]
        if result.action is BarrierAction.QUEUE:
            return self._level()
        if result.action is BarrierAction.OVERFLOW:
            self._drop(len(result.dropped))
            return [self._signal(), *self._level()]
        return []  # SKIP: the client pulls it (9.4.1)

    def sync_complete(self) -> list[PushAction]:
        """SYNC_COMPLETE passed 9.3.4: ONLINE_READY goes out, then the queue in order."""
        released = self.barrier.sync_complete()
        actions: list[PushAction] = [self._write(p) for p in released]
        return actions + self._level()

    def sync_incomplete(self) -> None:
        self.barrier.sync_incomplete()

    def drained(self, ledger_bytes: int, items: int) -> list[PushAction]:
        """The socket consumed these WritePush frames (their ``ledger_bytes``, summed)."""
        if ledger_bytes > self.sent_bytes or items > self.sent_items:
            raise ValueError("drained more than was handed to the send buffer")
        self.sent_bytes -= ledger_bytes
        self.sent_items -= items
        return self._level()

    def purged(self, ledger_bytes: int, items: int, *, reported: bool = False) -> None:
        """A degradation dropped these WritePush frames before any byte reached the socket
        (11.3.1: DEGRADED drops the pending real-time queue). They leave the ledger as drops:
        ``reported`` when the ERROR{MAILBOX_DIRTY} of that same degradation covers them,
        else PONG will say dirty. The level is not re-read: leaving DEGRADED waits for a real
        :meth:`drained` at or below low, so a purge alone never flips back to NORMAL."""
        if ledger_bytes > self.sent_bytes or items > self.sent_items:
            raise ValueError("purged more than was handed to the send buffer")
        self.sent_bytes -= ledger_bytes
        self.sent_items -= items
        if items and not reported:
            self._drop(items)

    def dropped(self, items: int) -> None:
        """Real-time frames that are not pushes (SESSION_DELTA, BADGE_UPDATE, READ_SYNC) were
        dropped while DEGRADED: the next PONG says dirty, as for a dropped push."""
        if items:
            self._drop(items)

    def idle_timeout(self) -> list[PushAction]:
        return self._act(self.flow.idle_timeout(), CLOSE_IDLE)

    def over_budget(self, purged_bytes: int = 0, purged_items: int = 0) -> list[PushAction]:
        """The node budget chose this connection (11.3.3 steps 2-3); the driver purged these
        WritePush frames from its send buffer. The level is not re-read here: leaving
        DEGRADED waits for the next :meth:`drained` at or below low, like any degradation."""
        if purged_bytes > self.sent_bytes or purged_items > self.sent_items:
            raise ValueError("purged more than was handed to the send buffer")
        self.sent_bytes -= purged_bytes
        self.sent_items -= purged_items
        if purged_items:
            self._drop(purged_items)
        return self._act(self.flow.over_budget(), CLOSE_SEND_BUFFER_HARD)

    def socket_closed(self) -> None:
        self.flow.socket_closed()
        if self.barrier.state is not BarrierState.CLOSED:
            self.barrier.close()

    def control(self, frame: bytes) -> SendControl:
        """Stream 0 is never blocked by backlog or degradation (I-25); not on the ledger."""
        if self.flow.state is FlowState.CLOSED:
            raise IllegalTransition("connection push", FlowState.CLOSED, "CONTROL")
        return SendControl(frame)

    def pong(self) -> tuple[int, bool]:
        """``(last_pushed_user_seq, mailbox_dirty)`` for the next PONG; reporting clears dirty."""
        dirty, self.mailbox_dirty = self.mailbox_dirty, False
        if dirty:
            self._unreported_drops = 0
        return self.last_pushed_user_seq, dirty

    def audit(self) -> list[str]:
        """No silent loss: dropped events are reported, pending a report, or we are closing."""
        closing = self.flow.state in (FlowState.CLOSING, FlowState.CLOSED)
        if self._unreported_drops and not self.mailbox_dirty and not closing:
            return [f"{self._unreported_drops} dropped pushes with no MAILBOX_DIRTY pending"]
        return []

    # -- internals ------------------------------------------------------------------------------

    def _write(self, pending: PendingPush) -> WritePush:
        self.sent_bytes += pending.ledger_bytes
        self.sent_items += 1
        self.last_pushed_user_seq = max(self.last_pushed_user_seq, pending.mailbox_seq)
        return WritePush(
            body=pending.body(self.last_pushed_user_seq),
            mailbox_seq=pending.mailbox_seq,
            last_pushed_user_seq=self.last_pushed_user_seq,
            ledger_bytes=pending.ledger_bytes,
            priority=pending.priority,
        )

    def _drop(self, count: int) -> None:
        self._unreported_drops += count
        self.mailbox_dirty = True

    def _signal(self) -> SignalDirty:
        self.mailbox_dirty = False  # the ERROR reports every drop so far
        self._unreported_drops = 0
        return SignalDirty()

    def _level(self) -> list[PushAction]:
        return self._act(self.flow.level(*self.level), CLOSE_SEND_BUFFER_HARD)

    def _act(self, action: FlowAction, close_reason: str) -> list[PushAction]:
        if action is FlowAction.DEGRADE:
            dropped = self.barrier.drop_queue()
            self._drop(len(dropped))
            return [self._signal()]
        if action is FlowAction.CLOSE:
            self.barrier.drop_queue()
            return [CloseConnection(close_reason)]
        return []
