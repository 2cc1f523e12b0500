"""Fault steps of ``qim chaos``: each ``await step.run(stack)`` injects one fault into the
stack and returns what it did (for the report). New faults (SIGKILL a process, SIGSTOP one
past its lease, fill a disk: issue 25) are more classes of the same shape."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Protocol

from qim.devstack import kafka
from qim.devstack.stack import Stack

__all__ = ["BrokerRestart", "Fault"]


class Fault(Protocol):
    name: str

    async def run(self, stack: Stack) -> dict[str, Any]: ...


@dataclass(frozen=True)
class BrokerRestart:
    """Stop the stack's Kafka (SIGTERM, as ``qim down`` does), keep it down ``down_s``, start
    it again on the same data dir and ports; returns once it answers metadata requests."""

    down_s: float = 12.0
    name: str = "broker-restart"

    async def run(self, stack: Stack) -> dict[str, Any]:
        cfg = stack.cfg.kafka
        started = time.monotonic()
        stopped = await asyncio.to_thread(kafka.stop, cfg)
        down_at = time.monotonic()
        await asyncio.sleep(self.down_s)
        await asyncio.to_thread(kafka.start, cfg)
        up_at = time.monotonic()
        return {
            "fault": self.name,
            "was_running": stopped,
            "stop_s": round(down_at - started, 2),
            "outage_s": round(up_at - down_at, 2),  # down_s plus the start
        }
