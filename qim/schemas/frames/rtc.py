"""RTC signalling, opcodes 0x0600-0x06FF: RTC_SIGNAL (relay only, never in the mailbox)."""

from __future__ import annotations

from qim.schemas.frames.base import Body

__all__ = ["RtcSignal"]


class RtcSignal(Body):
    """RTC_SIGNAL (A.3 #16): ``signal_payload`` <= rtc_signal_max_bytes (8 KiB), checked on decode.

    A.3 lists it uplink only; how the relayed signal reaches the target is open in the spec
    (digest §5 item 5), so this codec does not invent a downlink body.
    """

    conversation_id: str = ""
    target_user_id: str = ""
    signal_payload: bytes = b""
