"""Field-level limits of App. B.5 that the codec enforces on frames a server receives.

Limits are values passed to the codec, never globals: tenants may configure them (App. B), and
tests shrink them. Only uplink frames are checked - a client never refuses a server frame over
a size it would itself have been refused for (§27.1.2: never fail a sync).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from qim.schemas.frames.base import Body
from qim.schemas.frames.control import PresenceSub
from qim.schemas.frames.errors import ErrorCode
from qim.schemas.frames.exceptions import LimitExceeded
from qim.schemas.frames.header import DEFAULT_MAX_FRAME_BYTES
from qim.schemas.frames.messaging import SendMessage
from qim.schemas.frames.rtc import RtcSignal

__all__ = ["DEFAULT_LIMITS", "Limits", "check_limits"]


@dataclass(frozen=True, slots=True)
class Limits:
    """Codec limits; defaults are App. B.4/B.5."""

    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES  # body of one frame, and of one reassembly
    custom_type_max_bytes: int = 64
    rtc_signal_max_bytes: int = 8 * 1024
    presence_sub_max_targets: int = 200
    # Concurrent fragment reassemblies per connection (one per stream); A.5 defines 4 streams,
    # headroom for vendor streams. Bounds decoder memory at this many x max_frame_bytes.
    max_reassembly_streams: int = 8
    # Before AUTH_OK nothing beyond one AUTH frame is buffered (spec 20.1: limits are judged
    # before buffering): a frame body, or a reassembly of fragments, above this closes the
    # connection, and only one reassembly may be open. Not an App. B row: an AUTH carries a
    # token, a device id and a cursor, a few KiB (topology.md, decision on pre-AUTH memory).
    pre_auth_max_frame_bytes: int = 16 * 1024


DEFAULT_LIMITS: Final = Limits()


def check_limits(body: Body, limits: Limits, *, request_id: int = 0, opcode: int = 0) -> None:
    """Raise LimitExceeded (refuse the request, keep the connection) when a B.5 limit is hit."""
    if isinstance(body, SendMessage):
        size = len(body.custom_type.encode("utf-8"))
        if size > limits.custom_type_max_bytes:
            raise LimitExceeded(
                f"custom_type is {size} octets > custom_type_max_bytes "
                f"{limits.custom_type_max_bytes}",
                request_id=request_id,
                opcode=opcode,
            )
    elif isinstance(body, RtcSignal):
        size = len(body.signal_payload)
        if size > limits.rtc_signal_max_bytes:
            raise LimitExceeded(
                f"signal_payload is {size} octets > rtc_signal_max_bytes "
                f"{limits.rtc_signal_max_bytes}",
                request_id=request_id,
                opcode=opcode,
            )
    elif isinstance(body, PresenceSub):
        count = len(body.targets)
        if count > limits.presence_sub_max_targets:
            # §13.2: over the subscription limit answers RATE_LIMITED, never truncates.
            raise LimitExceeded(
                f"{count} targets > presence_sub_max_targets {limits.presence_sub_max_targets}",
                request_id=request_id,
                opcode=opcode,
                code=ErrorCode.RATE_LIMITED,
            )
