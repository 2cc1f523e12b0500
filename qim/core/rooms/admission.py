"""``room_msg_rate`` admission at the RoomWriter (spec 14.2): refused up front, never queued.

A sliding window of the accepted messages' times: a message is admitted when fewer than
``count`` were accepted in the last ``period_ms``; otherwise it is refused with
``retry_after_ms`` = when the oldest of them leaves the window, so a client that waits that
long is admitted (barring others). Exactly "the 21st message within one second is refused",
with no burst allowance the spec does not give. Time is an argument.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["RoomAdmission"]


@dataclass(slots=True)
class RoomAdmission:
    """One room's window of accepted message times (ms, non-decreasing)."""

    count: int
    period_ms: int
    accepted: deque[int] = field(default_factory=deque)

    def __post_init__(self) -> None:
        if self.count < 1 or self.period_ms < 1:
            raise ValueError("room_msg_rate needs a positive count and period")

    def admit(self, now_ms: int) -> int | None:
        """None: admitted (and counted). Otherwise the ``retry_after_ms`` of the refusal."""
        window = self.accepted
        while window and window[0] <= now_ms - self.period_ms:
            window.popleft()
        if len(window) >= self.count:
            return max(1, window[0] + self.period_ms - now_ms)
        window.append(max(now_ms, window[-1]) if window else now_ms)
        return None

    def idle(self, now_ms: int) -> bool:
        """Nothing accepted within the window: the room's state may be dropped."""
        return not self.accepted or self.accepted[-1] <= now_ms - self.period_ms
