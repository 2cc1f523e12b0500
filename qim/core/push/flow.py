"""Per-connection flow control NORMAL / DEGRADED / CLOSING (spec 11.3.1, 15.4.3) as a table.

Why two watermarks and a floor: one threshold would flap in and out of DEGRADED and send a
stream of MAILBOX_DIRTY (11.3.1). So:

* NORMAL -> DEGRADED when the level reaches ``conn_send_soft_watermark`` (1 MiB or 2000);
* DEGRADED -> NORMAL only at or below ``conn_send_low_watermark`` (256 KiB), not below soft;
* NORMAL or DEGRADED -> CLOSING at ``conn_send_hard_watermark`` (4 MiB or 8000) (I-24);
* any state -> CLOSING after ``idle_timeout`` without consumption;
* the node budget (11.3.3) may force NORMAL -> DEGRADED (OVER_BUDGET).

"Reaches" is ``>=`` on bytes OR items, "at or below" is ``<=`` -- the watermarks themselves
are the switching points (26 #30). B.5 gives the low watermark in bytes only; an item floor
is needed too or 2000 tiny frames would flap at soft, so ``low_items`` defaults to the same
quarter of soft (500) -- our choice, a constructor argument.

The level is the connection's *realtime* ledger: stream-1 frames handed to the send buffer
and not yet drained, plus the login barrier's queue (9.4.2: one ledger). Control frames are
not counted and never refused (I-25), and bulk pulls are not either: DEGRADED stops stream 1
only, so the pulls it asks for cannot feed the backlog that caused it (11.3.4 reason 2).
The actions (DEGRADE = drop the realtime queue + MAILBOX_DIRTY, CLOSE) are carried out by
:class:`~qim.core.push.connection.ConnectionPush`. ``FLOW_TABLE.render_mermaid()`` draws it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final

from qim.core.push.table import Machine, Transition, TransitionTable
from qim.params import Settings, lookup
from qim.params.values import Watermark

__all__ = [
    "DEFAULT_FLOW_LIMITS",
    "FLOW_TABLE",
    "FlowAction",
    "FlowControl",
    "FlowEvent",
    "FlowLimits",
    "FlowState",
]


class FlowState(Enum):
    NORMAL = "NORMAL"
    DEGRADED = "DEGRADED"
    CLOSING = "CLOSING"
    CLOSED = "CLOSED"  # the socket is gone: nothing may be fed any more


class FlowEvent(Enum):
    BELOW_LOW = "BELOW_LOW"  # level <= low (bytes and items)
    BETWEEN = "BETWEEN"  # low < level < soft
    AT_SOFT = "AT_SOFT"  # soft <= level < hard
    AT_HARD = "AT_HARD"  # level >= hard
    IDLE_TIMEOUT = "IDLE_TIMEOUT"  # idle_timeout passed with no consumption
    OVER_BUDGET = "OVER_BUDGET"  # the node budget picked this connection (11.3.3 steps 2-3)
    SOCKET_CLOSED = "SOCKET_CLOSED"


class FlowAction(Enum):
    NONE = "NONE"
    DEGRADE = "DEGRADE"  # drop the realtime queue, signal MAILBOX_DIRTY
    RECOVER = "RECOVER"  # realtime pushes flow again
    CLOSE = "CLOSE"  # close the connection: the mailbox holds everything (11.3.1)


_S, _E, _A = FlowState, FlowEvent, FlowAction


def _t(target: FlowState, action: FlowAction) -> Transition[FlowState, FlowAction]:
    return Transition(target, action)


_CLOSING_ROW: Final[dict[FlowEvent, Transition[FlowState, FlowAction]]] = {
    e: _t(_S.CLOSING, _A.NONE) for e in FlowEvent if e is not _E.SOCKET_CLOSED
}

FLOW_TABLE: Final = TransitionTable[FlowState, FlowEvent, FlowAction](
    "flow control",
    _S.NORMAL,
    {
        _S.NORMAL: {
            _E.BELOW_LOW: _t(_S.NORMAL, _A.NONE),
            _E.BETWEEN: _t(_S.NORMAL, _A.NONE),
            _E.AT_SOFT: _t(_S.DEGRADED, _A.DEGRADE),
            _E.AT_HARD: _t(_S.CLOSING, _A.CLOSE),
            _E.IDLE_TIMEOUT: _t(_S.CLOSING, _A.CLOSE),
            _E.OVER_BUDGET: _t(_S.DEGRADED, _A.DEGRADE),
            _E.SOCKET_CLOSED: _t(_S.CLOSED, _A.NONE),
        },
        _S.DEGRADED: {
            _E.BELOW_LOW: _t(_S.NORMAL, _A.RECOVER),
            _E.BETWEEN: _t(_S.DEGRADED, _A.NONE),  # hysteresis: below soft is not enough
            _E.AT_SOFT: _t(_S.DEGRADED, _A.NONE),
            _E.AT_HARD: _t(_S.CLOSING, _A.CLOSE),
            _E.IDLE_TIMEOUT: _t(_S.CLOSING, _A.CLOSE),
            _E.OVER_BUDGET: _t(_S.DEGRADED, _A.NONE),
            _E.SOCKET_CLOSED: _t(_S.CLOSED, _A.NONE),
        },
        _S.CLOSING: {**_CLOSING_ROW, _E.SOCKET_CLOSED: _t(_S.CLOSED, _A.NONE)},
        _S.CLOSED: {},
    },
)


@dataclass(frozen=True, slots=True)
class FlowLimits:
    """The three watermarks (B.5) and the item floor that pairs with the byte floor."""

    soft: Watermark
    hard: Watermark
    low_bytes: int
    low_items: int

    def __post_init__(self) -> None:
        if not 0 <= self.low_bytes < self.soft.bytes <= self.hard.bytes:
            raise ValueError("need low_bytes < soft.bytes <= hard.bytes (B.5, 11.3)")
        if not 0 <= self.low_items < self.soft.items <= self.hard.items:
            raise ValueError("need low_items < soft.items <= hard.items")

    @classmethod
    def of(cls, soft: Watermark, hard: Watermark, low_bytes: int) -> FlowLimits:
        """Limits with the item floor at the byte floor's share of soft (11.3.4: a quarter)."""
        return cls(soft, hard, low_bytes, soft.items * low_bytes // soft.bytes)

    @classmethod
    def from_settings(cls, settings: Settings) -> FlowLimits:
        return cls.of(
            settings.conn_send_soft_watermark,
            settings.conn_send_hard_watermark,
            settings.conn_send_low_watermark,
        )

    def classify(self, level_bytes: int, level_items: int) -> FlowEvent:
        """The level event of a ledger reading; the watermarks themselves switch (26 #30)."""
        if level_bytes >= self.hard.bytes or level_items >= self.hard.items:
            return FlowEvent.AT_HARD
        if level_bytes >= self.soft.bytes or level_items >= self.soft.items:
            return FlowEvent.AT_SOFT
        if level_bytes <= self.low_bytes and level_items <= self.low_items:
            return FlowEvent.BELOW_LOW
        return FlowEvent.BETWEEN


DEFAULT_FLOW_LIMITS: Final = FlowLimits.of(
    lookup("conn_send_soft_watermark").default,
    lookup("conn_send_hard_watermark").default,
    lookup("conn_send_low_watermark").default,
)


class FlowControl:
    """One connection's flow state; every input is an event of :data:`FLOW_TABLE`."""

    def __init__(self, limits: FlowLimits = DEFAULT_FLOW_LIMITS) -> None:
        self.limits = limits
        self._machine = Machine(FLOW_TABLE)

    @property
    def state(self) -> FlowState:
        return self._machine.state

    @property
    def accepts_realtime(self) -> bool:
        """Stream-1 pushes are written only in NORMAL (11.3.1)."""
        return self._machine.state is FlowState.NORMAL

    def level(self, level_bytes: int, level_items: int) -> FlowAction:
        """Feed the ledger after it changed."""
        return self._machine.fire(self.limits.classify(level_bytes, level_items))

    def idle_timeout(self) -> FlowAction:
        return self._machine.fire(FlowEvent.IDLE_TIMEOUT)

    def over_budget(self) -> FlowAction:
        return self._machine.fire(FlowEvent.OVER_BUDGET)

    def socket_closed(self) -> FlowAction:
        return self._machine.fire(FlowEvent.SOCKET_CLOSED)
