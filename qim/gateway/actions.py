"""What a sans-I/O :class:`~qim.gateway.session.Session` asks its driver to do.

The session never touches a socket, a clock or a service: it returns a list of these and the
driver (``connection.py``) performs them in order. Tests read the list directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from qim.gateway.ports import AuthRequest
from qim.schemas.frames import PROTOCOL_VERSION, Body, Frame, MailboxCursor
from qim.schemas.records.push import FramePriority

__all__ = [
    "Action",
    "Authenticate",
    "Close",
    "CloseReason",
    "Count",
    "Forward",
    "Send",
    "SendPush",
]


class CloseReason(Enum):
    """Why a connection ended; the label of ``connections_closed_total{reason}``."""

    PROTOCOL_ERROR = "protocol_error"  # framing, decoding, direction (§20.1)
    FRAME_TOO_LARGE = "frame_too_large"  # a body or reassembly over the current limit (§20.1)
    NOT_AUTHENTICATED = "not_authenticated"  # a frame other than AUTH before AUTH_OK
    DUPLICATE_AUTH = "duplicate_auth"  # AUTH while one is in flight / for another device
    AUTH_FAILED = "auth_failed"  # AuthService refused the token or client
    CURSOR_REJECTED = "cursor_rejected"  # CURSOR_INVALID / _EXPIRED / _REBASED at AUTH (§9.3.1)
    UNAUTH_TIMEOUT = "unauth_timeout"  # unauth_connection_timeout (B.4)
    IDLE_TIMEOUT = "idle_timeout"  # idle_timeout (B.4, §15.1.3)
    KICKED = "kicked"  # KICKED sent (replaced, revoked ...)
    REDIRECTED = "redirected"  # REDIRECT sent (§5.3.2)
    REFUSED = "refused"  # SHARD_MOVED / RATE_LIMITED after a good token
    SLOW_CONSUMER = "slow_consumer"  # send buffer over conn_send_hard_watermark (§11.3)
    TOKEN_EXPIRED = "token_expired"  # token_expiry_grace over without renewal (§15.3.1)
    PEER_CLOSED = "peer_closed"
    SHUTDOWN = "shutdown"


# RFC 6455 section 7.4.1 (and IANA's 1013) for a WebSocket close with this reason: a client
# library tells a protocol violation (1002) from a policy refusal (1008), an oversized message
# (1009) and a "try again later" (1013) without parsing a reason string (issue 15.3).
WS_CLOSE_CODES: dict[CloseReason, int] = {
    CloseReason.PROTOCOL_ERROR: 1002,
    CloseReason.FRAME_TOO_LARGE: 1009,
    CloseReason.NOT_AUTHENTICATED: 1008,
    CloseReason.DUPLICATE_AUTH: 1008,
    CloseReason.AUTH_FAILED: 1008,
    CloseReason.CURSOR_REJECTED: 1008,
    CloseReason.UNAUTH_TIMEOUT: 1008,
    CloseReason.KICKED: 1008,
    CloseReason.SLOW_CONSUMER: 1008,
    CloseReason.TOKEN_EXPIRED: 1008,
    CloseReason.REFUSED: 1013,
    CloseReason.SHUTDOWN: 1001,
    CloseReason.IDLE_TIMEOUT: 1000,
    CloseReason.REDIRECTED: 1000,
    CloseReason.PEER_CLOSED: 1000,
}


def ws_close_code(reason: CloseReason | None) -> int:
    """The WebSocket close code for ``reason``; 1011 (server error) when none was decided."""
    return 1011 if reason is None else WS_CLOSE_CODES[reason]


@dataclass(frozen=True, slots=True)
class Send:
    """Encode ``body`` and queue it; ``stream`` None = the frame's A.5 default stream."""

    body: Body
    request_id: int = 0
    stream: int | None = None
    version: int = PROTOCOL_VERSION


@dataclass(frozen=True, slots=True)
class SendPush:
    """A PUSH_EVENTS body already in wire form: spliced from the PushBatch's once-encoded
    bytes (10.3, 11.1.1 "zero copy"), so only the frame header is built for this socket.
    Written on stream 1; the connection reports ``ledger_bytes`` back once the frame has
    left the socket buffer (11.3: the level is what is really pending)."""

    body: bytes
    ledger_bytes: int
    priority: FramePriority
    mailbox_seq: int
    version: int = PROTOCOL_VERSION


@dataclass(frozen=True, slots=True)
class Close:
    """Flush what is queued (the ERROR/KICKED just sent) and close the transport."""

    reason: CloseReason
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Authenticate:
    """Call the authenticator; feed the result back (auth_accepted / auth_rejected).

    ``cursor`` is the AUTH frame's ``mailbox_cursor`` (None: a new device, §9.6.1), for the
    login sync that follows a first AUTH; a renewal never syncs (§15.3.1).
    """

    request: AuthRequest
    renewal: bool = False
    cursor: MailboxCursor | None = None


@dataclass(frozen=True, slots=True)
class Forward:
    """An authenticated business frame for the node's routing (later issues)."""

    frame: Frame


@dataclass(frozen=True, slots=True)
class Count:
    """A counter to bump: ``unknown_opcode_dropped``, ``ping``, ``ping_probe`` ..."""

    name: str
    label: str = ""


Action = Send | SendPush | Close | Authenticate | Forward | Count
