"""The gateway's heartbeat wheel is the pure :class:`qim.core.wheel.TimingWheel` (15.1.5); the
MailboxNode's second check (16.1.2) reuses the same structure, so it lives in core."""

from __future__ import annotations

from qim.core.wheel import TimingWheel

__all__ = ["TimingWheel"]
