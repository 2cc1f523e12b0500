"""Exceptions of the SDK: one root, the server's ERROR frame, closed connections, timeouts.

``QimError`` is the ERROR frame of A.4 #21 as an exception: the A.6 ``code`` (an
:class:`~qim.schemas.frames.ErrorCode` when this build knows it, the raw int otherwise), the
code-specific extras that were present, and the client action A.6 prescribes. Everything else
is about the connection itself and never carries a server code.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

import msgspec

from qim.schemas.frames import ClientAction, Error, ErrorCode, ErrorCodeSpec, Kicked, for_code

__all__ = [
    "ConnectionClosedError",
    "IllegalTransition",
    "QimClientError",
    "QimError",
    "RequestTimeout",
    "TooManyRedirects",
    "TransportClosed",
    "TransportError",
    "UnexpectedFrame",
]

# ERROR fields that are not extras: the common header of every ERROR body.
_COMMON: Final = frozenset({"code", "detail", "request_id"})


class QimClientError(Exception):
    """Root of everything the SDK raises on purpose."""


class QimError(QimClientError):
    """An ``ERROR`` frame from the server (A.4 #21, codes in A.6).

    ``extras`` holds every optional field the frame carried (``retry_after_ms``,
    ``trim_watermark``, ``new_cursor``, ...), so a code that gains an extra in a newer build
    still surfaces it.
    """

    def __init__(
        self,
        code: int,
        extras: Mapping[str, object] | None = None,
        *,
        detail: str = "",
        request_id: int = 0,
    ) -> None:
        self.spec: ErrorCodeSpec = for_code(code)
        self.code: ErrorCode | int = ErrorCode(code) if self.spec.known else code
        self.extras: Mapping[str, object] = MappingProxyType(dict(extras or {}))
        self.detail = detail
        self.request_id = request_id
        text = f"{self.spec.name} ({code})"
        super().__init__(f"{text}: {detail}" if detail else text)

    @classmethod
    def from_frame(cls, error: Error, *, request_id: int = 0) -> QimError:
        """Build from an ERROR body; ``request_id`` is the header's (the body's echo wins)."""
        fields = msgspec.structs.asdict(error)
        extras = {k: v for k, v in fields.items() if k not in _COMMON and v is not None}
        return cls(
            error.code,
            extras,
            detail=error.detail,
            request_id=error.request_id or request_id,
        )

    @property
    def name(self) -> str:
        """The A.6 name, or ``UNKNOWN_<code>`` for a code this build does not know."""
        return self.spec.name

    @property
    def action(self) -> ClientAction:
        """What A.6 tells the client to do (unknown codes: back off, §27.1.2)."""
        return self.spec.action

    @property
    def retry_after_ms(self) -> int | None:
        """The server's back-off hint; None = fall back to reconnect_backoff."""
        value = self.extras.get("retry_after_ms")
        return value if isinstance(value, int) else None


class ConnectionClosedError(QimClientError):
    """The connection is gone: pending requests and later calls fail with this.

    ``kicked`` is the KICKED body when the server said why; ``error`` the last connection-level
    ERROR (request_id 0) it sent before closing, if any.
    """

    def __init__(
        self,
        reason: str,
        *,
        kicked: Kicked | None = None,
        error: QimError | None = None,
    ) -> None:
        if kicked is not None:
            reason = f"{reason} (kicked: {kicked.reason})"
        elif error is not None:
            reason = f"{reason} (after ERROR {error.name})"
        super().__init__(reason)
        self.reason = reason
        self.kicked = kicked
        self.error = error


class RequestTimeout(QimClientError, TimeoutError):
    """No reply to a request within its timeout; the request id is released."""

    def __init__(self, frame: str, request_id: int, timeout: float) -> None:
        super().__init__(f"no reply to {frame} (request_id {request_id}) within {timeout:g} s")
        self.frame = frame
        self.request_id = request_id
        self.timeout = timeout


class UnexpectedFrame(QimClientError):
    """The server sent a frame the protocol does not allow here (a server bug)."""


class IllegalTransition(QimClientError):
    """A client state transition the table does not allow; the state is unchanged."""


class TooManyRedirects(IllegalTransition):
    """A REDIRECT beyond ``redirect_max_per_connection`` (§5.3.2: the server owes SHARD_MOVED)."""


class TransportError(QimClientError):
    """The transport could not be opened or was refused (bad scheme, ALPN, handshake)."""


class TransportClosed(TransportError):
    """The peer closed the transport, or it was closed locally; raised by send and recv."""
