"""The login barrier of one connection as a transition table (style.md item 6, h11's _state.py).

Every (state, event) pair is either in :data:`TRANSITIONS` or illegal. An illegal pair raises
:class:`IllegalTransition` and leaves the state unchanged: those are bugs of the caller (the
node feeding an auth result to a session that never asked), never the peer's fault. Whatever
the peer sends maps to a *legal* event; a peer breaking the rules just leads to CLOSED.

States::

    AWAITING_AUTH --AUTH--> AUTHENTICATING --AUTH_ACCEPTED--> ONLINE <--AUTH_ACCEPTED-- RENEWING
          |                       |                            |  --AUTH (same device)-->  |
          +-------- anything else, errors, timeouts, refusals -> CLOSED <------------------+

RENEWING is ONLINE with a re-AUTH in flight (§15.3.1 silent renewal): frames flow as in ONLINE,
but a further AUTH is refused. ``render_table()`` prints the table for docs.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Final

__all__ = [
    "TRANSITIONS",
    "ConnState",
    "ConnStateMachine",
    "Event",
    "IllegalTransition",
    "render_table",
]


class ConnState(Enum):
    AWAITING_AUTH = "AWAITING_AUTH"
    AUTHENTICATING = "AUTHENTICATING"
    ONLINE = "ONLINE"
    RENEWING = "RENEWING"
    CLOSED = "CLOSED"


class Event(Enum):
    """Inputs of the table: peer frames (upper group) and node decisions (lower group)."""

    AUTH = "AUTH"  # an AUTH frame (same device when already online)
    BAD_REAUTH = "BAD_REAUTH"  # a re-AUTH naming another device_id (§15.3.1)
    PING = "PING"
    FRAME = "FRAME"  # any other known uplink frame
    UNKNOWN = "UNKNOWN"  # an opcode this build does not know (§27.1.2)
    LIMIT_EXCEEDED = "LIMIT_EXCEEDED"  # a B.5 field limit: frame refused, link fine
    PROTOCOL_ERROR = "PROTOCOL_ERROR"  # framing/decoding error: the link is unusable
    PEER_CLOSED = "PEER_CLOSED"
    AUTH_ACCEPTED = "AUTH_ACCEPTED"
    AUTH_REJECTED = "AUTH_REJECTED"
    REFUSE = "REFUSE"  # REDIRECT / SHARD_MOVED / RATE_LIMITED (after a good token, or shard lost)
    KICK = "KICK"  # KICKED (replaced, revoked, stale epoch)
    TIMEOUT = "TIMEOUT"  # unauth_connection_timeout or idle_timeout passed
    SHUTDOWN = "SHUTDOWN"  # the node closes the connection


_A, _AU, _ON, _RE, _CL = (
    ConnState.AWAITING_AUTH,
    ConnState.AUTHENTICATING,
    ConnState.ONLINE,
    ConnState.RENEWING,
    ConnState.CLOSED,
)
_E = Event

TRANSITIONS: Final[Mapping[ConnState, Mapping[Event, ConnState]]] = {
    _A: {
        _E.AUTH: _AU,
        # First frame must be AUTH: everything else before it ends the connection.
        _E.PING: _CL,
        _E.FRAME: _CL,
        _E.UNKNOWN: _CL,
        _E.LIMIT_EXCEEDED: _CL,
        _E.PROTOCOL_ERROR: _CL,
        _E.PEER_CLOSED: _CL,
        _E.TIMEOUT: _CL,
        _E.SHUTDOWN: _CL,
    },
    _AU: {
        _E.AUTH: _CL,  # a second AUTH while the first is in flight
        _E.PING: _AU,  # liveness is answered even before AUTH_OK
        _E.FRAME: _CL,
        _E.UNKNOWN: _CL,
        _E.LIMIT_EXCEEDED: _CL,
        _E.PROTOCOL_ERROR: _CL,
        _E.PEER_CLOSED: _CL,
        _E.AUTH_ACCEPTED: _ON,
        _E.AUTH_REJECTED: _CL,
        _E.REFUSE: _CL,
        _E.KICK: _CL,  # a stale session_epoch loses to the live one (§15.2.2)
        _E.TIMEOUT: _CL,
        _E.SHUTDOWN: _CL,
    },
    _ON: {
        _E.AUTH: _RE,
        _E.BAD_REAUTH: _CL,
        _E.PING: _ON,
        _E.FRAME: _ON,
        _E.UNKNOWN: _ON,
        _E.LIMIT_EXCEEDED: _ON,
        _E.PROTOCOL_ERROR: _CL,
        _E.PEER_CLOSED: _CL,
        _E.REFUSE: _CL,  # SHARD_MOVED: this node lost the ConnectionShard
        _E.KICK: _CL,
        _E.TIMEOUT: _CL,
        _E.SHUTDOWN: _CL,
    },
    _RE: {
        _E.AUTH: _CL,  # a second re-AUTH while one is in flight
        _E.BAD_REAUTH: _CL,
        _E.PING: _RE,
        _E.FRAME: _RE,
        _E.UNKNOWN: _RE,
        _E.LIMIT_EXCEEDED: _RE,
        _E.PROTOCOL_ERROR: _CL,
        _E.PEER_CLOSED: _CL,
        _E.AUTH_ACCEPTED: _ON,
        _E.AUTH_REJECTED: _CL,
        _E.REFUSE: _CL,
        _E.KICK: _CL,
        _E.TIMEOUT: _CL,
        _E.SHUTDOWN: _CL,
    },
    # Once closed, everything is absorbed: late auth results, frames still in the buffer.
    _CL: dict.fromkeys(Event, _CL),
}


class IllegalTransition(RuntimeError):
    """A (state, event) pair outside the table: a bug of the caller, state left unchanged."""

    def __init__(self, state: ConnState, event: Event) -> None:
        super().__init__(f"event {event.name} is illegal in state {state.name}")
        self.state = state
        self.event = event


class ConnStateMachine:
    """Holds one connection's state and moves it only along :data:`TRANSITIONS`."""

    __slots__ = ("state",)

    def __init__(self, state: ConnState = ConnState.AWAITING_AUTH) -> None:
        self.state = state

    def fire(self, event: Event) -> ConnState:
        """Apply ``event``; return the previous state. Raises IllegalTransition."""
        previous = self.state
        try:
            self.state = TRANSITIONS[previous][event]
        except KeyError:
            raise IllegalTransition(previous, event) from None
        return previous


def render_table() -> str:
    """The table as Markdown (rows: states, columns: events; blank = illegal)."""
    events = list(Event)
    lines = [
        "| state | " + " | ".join(e.value for e in events) + " |",
        "|---|" + "---|" * len(events),
    ]
    for state in ConnState:
        row = TRANSITIONS[state]
        cells = [row[e].value if e in row else "" for e in events]
        lines.append(f"| {state.value} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
