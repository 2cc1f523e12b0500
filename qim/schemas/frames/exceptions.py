"""Protocol errors raised by the codec: one root, each carrying the gateway's verdict.

Like h11's status hint, every :class:`ProtocolError` says what the receiving side should do:
``error_code`` is the A.6 code a *server* answers with in an ERROR frame (None = no ERROR, just
act), and ``close`` says whether the connection must be closed. A client receiving a bad frame
cannot answer with ERROR (a downlink-only frame); it closes and reconnects with backoff.

The codec raises only these for bad input. Encoding a frame we cannot send (too large, field
out of range) is our bug, not the peer's, and raises :class:`EncodeError` - never a
ProtocolError, so it can never be reported as the client's fault.

Verdicts and where they come from:

==================  ===================  =====  ====================================================
error               error_code           close  spec
==================  ===================  =====  ====================================================
BadMagic            -                    yes    §20.1: magic mismatch -> disconnect
BadHeaderCrc        -                    yes    A.1: header CRC32C; stream framing is lost
FrameTooLarge       PAYLOAD_TOO_LARGE    yes    §20.1: judged on body_len before decoding; close
TruncatedFrame      -                    yes    a WebSocket message shorter than its header says
TrailingData        -                    yes    a WebSocket message carries exactly one frame
FragmentError       -                    yes    fragments interleaved wrongly on a stream
UnsupportedFlags    -                    yes    COMPRESSED not negotiated, or with ENCRYPTED
WrongDirection      -                    yes    a known opcode sent by the side that may not send it
MalformedBody       UPGRADE_REQUIRED     yes    body of a known opcode is not its msgpack schema
LimitExceeded       per limit            no     B.5 field limits; frame consumed, connection fine
==================  ===================  =====  ====================================================
"""

from __future__ import annotations

from typing import ClassVar

from qim.schemas.frames.connection import Error
from qim.schemas.frames.errors import RETRY_AFTER_NEVER_MS, ErrorCode

__all__ = [
    "BadHeaderCrc",
    "BadMagic",
    "EncodeError",
    "FragmentError",
    "FrameTooLarge",
    "HeaderError",
    "LimitExceeded",
    "MalformedBody",
    "ProtocolError",
    "TrailingData",
    "TruncatedFrame",
    "UnsupportedFlags",
    "WrongDirection",
]


class ProtocolError(Exception):
    """The peer sent something this protocol does not allow."""

    error_code: ClassVar[ErrorCode | None] = None
    close: ClassVar[bool] = True

    def __init__(
        self,
        detail: str,
        *,
        request_id: int = 0,
        opcode: int | None = None,
        code: ErrorCode | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.request_id = request_id
        self.opcode = opcode
        self._code = code

    @property
    def code(self) -> ErrorCode | None:
        """The A.6 code to answer with; an instance may override its class default."""
        return self._code if self._code is not None else self.error_code

    def to_error_frame(self) -> Error | None:
        """The ERROR body a server sends back, echoing request_id; None when none is due."""
        code = self.code
        if code is None:
            return None
        # a refusal by size answered RATE_LIMITED (PRESENCE_SUB over presence_sub_max_targets)
        # carries the "do not retry" hint: waiting never makes the same request fit
        retry = RETRY_AFTER_NEVER_MS if code is ErrorCode.RATE_LIMITED else None
        return Error(
            code=int(code), retry_after_ms=retry, detail=self.detail, request_id=self.request_id
        )


class HeaderError(ProtocolError):
    """The header is unusable; the byte stream is out of sync, so the decoder stays failed."""


class BadMagic(HeaderError):
    pass


class BadHeaderCrc(HeaderError):
    pass


class FrameTooLarge(HeaderError):
    error_code = ErrorCode.PAYLOAD_TOO_LARGE


class TruncatedFrame(ProtocolError):
    pass


class TrailingData(ProtocolError):
    pass


class FragmentError(ProtocolError):
    pass


class UnsupportedFlags(ProtocolError):
    pass


class WrongDirection(ProtocolError):
    pass


class MalformedBody(ProtocolError):
    """A known opcode whose body is not valid msgpack or violates its schema.

    The frame is consumed (body_len kept framing intact) but the peer disagrees with us about
    a frame we both know, so the verdict is ERROR{UPGRADE_REQUIRED} then close: §27.1.2 uses
    UPGRADE_REQUIRED for "the server cannot understand this frame", and §20.1 closes on
    protocol violations. A.6 has no dedicated "malformed" code.
    """

    error_code = ErrorCode.UPGRADE_REQUIRED


class LimitExceeded(ProtocolError):
    """A field over a B.5 limit; the request is refused, the connection lives on."""

    error_code = ErrorCode.PAYLOAD_TOO_LARGE
    close = False


class EncodeError(ValueError):
    """We were asked to send a frame the protocol cannot carry: a bug or a cutting error of ours."""
