"""RTC signalling, opcodes 0x0600-0x06FF: RTC_SIGNAL (relay only, never in the mailbox).

A.3 lists RTC_SIGNAL uplink only and leaves the relayed downlink open (digest §5 item 5); as
for TYPING, the relay rides the same opcode with ``request_id`` 0 ([ext], docs/protocol.md).
13.5.3 has the server act on the call's lifecycle (``ACCEPT`` on one device cancels the
others, ``CANCEL{reason=timeout}`` after ``rtc_ring_timeout``) while ``signal_payload`` stays
opaque (media negotiation, SFU credentials), so the lifecycle travels beside it: [ext]
``call_id``, ``signal_type`` (:data:`SIGNAL_TYPES`) and ``reason``.
"""

from __future__ import annotations

from typing import Final

from qim.schemas.frames.base import Body

__all__ = ["SIGNAL_TYPES", "RtcSignal", "RtcSignalDown"]

SIGNAL_TYPES: Final = ("invite", "ringing", "accept", "reject", "busy", "cancel", "bye")
"""13.5.3's lifecycle signals, lower-case; anything else is refused."""


class RtcSignal(Body):
    """RTC_SIGNAL uplink (A.3 #16): ``signal_payload`` <= rtc_signal_max_bytes (8 KiB), checked
    on decode; ``call_id`` names the call (chosen by the caller), ``signal_type`` its step."""

    conversation_id: str = ""
    target_user_id: str = ""
    signal_payload: bytes = b""
    call_id: str = ""
    signal_type: str = ""
    reason: str = ""


class RtcSignalDown(Body):
    """RTC_SIGNAL downlink [ext]: the relayed signal, or the server's own ``cancel`` (reason
    ``timeout``, ``answered_elsewhere``, ``rejected_elsewhere``, ``offline``)."""

    conversation_id: str = ""
    from_user_id: str = ""
    from_device_id: str = ""
    call_id: str = ""
    signal_type: str = ""
    reason: str = ""
    signal_payload: bytes = b""
