"""The client's connection state as a transition table (h11 ``_state.py`` style, no I/O).

One table says which event moves which state where; :meth:`ClientStateMachine.fire` is the only
way to change state, an illegal pair raises :class:`IllegalTransition` and leaves the state as it
was. The redirect budget (§5.3.2 ``redirect_max_per_connection`` = 1) is counted here, so a
second REDIRECT is refused by the same mechanism. :func:`mermaid` renders the table for docs::

    IDLE -DIAL-> CONNECTING -OPENED-> CONNECTED -AUTH_OK-> AUTHENTICATED
                     ^                    | REDIRECT
                     +------DIAL------ REDIRECTED
    every state but CLOSED -CLOSE-> CLOSED
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from types import MappingProxyType
from typing import Final

from qim.client.errors import IllegalTransition, TooManyRedirects

__all__ = [
    "REDIRECT_MAX_PER_CONNECTION",
    "TRANSITIONS",
    "ClientEvent",
    "ClientState",
    "ClientStateMachine",
    "mermaid",
]

REDIRECT_MAX_PER_CONNECTION: Final = 1  # B.1 redirect_max_per_connection


class ClientState(Enum):
    IDLE = "idle"  # nothing opened yet
    CONNECTING = "connecting"  # dialing a transport
    CONNECTED = "connected"  # transport open, AUTH sent, no verdict yet
    REDIRECTED = "redirected"  # REDIRECT received, the old transport closed
    AUTHENTICATED = "authenticated"  # AUTH_OK received: requests, pushes, heartbeats
    CLOSED = "closed"  # terminal; a new connection needs a new client


class ClientEvent(Enum):
    DIAL = "dial"
    OPENED = "opened"
    AUTH_OK = "auth_ok"
    REDIRECT = "redirect"
    CLOSE = "close"  # local close, AUTH refused, transport lost, KICKED


_S, _E = ClientState, ClientEvent
TRANSITIONS: Final[Mapping[tuple[ClientState, ClientEvent], ClientState]] = MappingProxyType(
    {
        (_S.IDLE, _E.DIAL): _S.CONNECTING,
        (_S.CONNECTING, _E.OPENED): _S.CONNECTED,
        (_S.CONNECTED, _E.AUTH_OK): _S.AUTHENTICATED,
        (_S.CONNECTED, _E.REDIRECT): _S.REDIRECTED,
        (_S.REDIRECTED, _E.DIAL): _S.CONNECTING,
        **{(s, _E.CLOSE): _S.CLOSED for s in ClientState if s is not _S.CLOSED},
    }
)


class ClientStateMachine:
    """Current state plus the redirect count of this logical connection."""

    def __init__(self, *, max_redirects: int = REDIRECT_MAX_PER_CONNECTION) -> None:
        self.state = ClientState.IDLE
        self.redirects = 0
        self.max_redirects = max_redirects

    def fire(self, event: ClientEvent) -> ClientState:
        """Apply ``event``; raise and change nothing when the table has no such transition."""
        target = TRANSITIONS.get((self.state, event))
        if target is None:
            raise IllegalTransition(f"{event.name} is not allowed in state {self.state.name}")
        if event is ClientEvent.REDIRECT:
            if self.redirects >= self.max_redirects:
                raise TooManyRedirects(
                    f"REDIRECT number {self.redirects + 1} exceeds "
                    f"redirect_max_per_connection={self.max_redirects}"
                )
            self.redirects += 1
        self.state = target
        return target


def mermaid() -> str:
    """The table as a mermaid ``stateDiagram-v2``, for generated docs."""
    lines = ["stateDiagram-v2", "    [*] --> IDLE"]
    for (source, event), target in TRANSITIONS.items():
        lines.append(f"    {source.name} --> {target.name}: {event.name}")
    lines.append("    CLOSED --> [*]")
    return "\n".join(lines)
