"""RTC signalling (spec 13.5, AT-63/65): the only call state the server keeps, ring timers.

Clients drive every transition and the server holds no authoritative call state (13.5.3);
what it does enforce lives on the **callee's** ConnectionNode, which sees both halves of the
ringing: the relayed ``invite`` arriving for the callee's devices and the callee devices'
own answers leaving. Per ``(tenant, call_id, callee)``:

* an ``invite`` delivered to at least one device starts ringing until ``now + rtc_ring_timeout``;
* ``accept`` from one callee device stops it; the callee's other devices get
  ``cancel{reason=answered_elsewhere}`` (13.5.3);
* ``reject`` / ``busy`` from one callee device stops it too; its other devices get
  ``cancel{reason=rejected_elsewhere}`` ([ext]: otherwise they would ring on);
* ``cancel`` / ``bye`` from the caller stops it (the relay itself tells the devices);
* past the deadline: ``cancel{reason=timeout}`` to the callee's devices and to the caller.

Time is an argument; nothing here does I/O.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

__all__ = ["RingTimers", "Ringing", "answer_reason"]

CallKey = tuple[str, str, str]  # tenant, call_id, callee


@dataclass(frozen=True, slots=True)
class Ringing:
    """One ringing call, as the callee's node knows it."""

    tenant_id: str
    call_id: str
    callee: str
    caller: str
    caller_device: str
    conversation_id: str
    deadline_ms: int

    @property
    def key(self) -> CallKey:
        return (self.tenant_id, self.call_id, self.callee)


def answer_reason(signal_type: str) -> str | None:
    """What a callee device's signal tells its other devices, None if nothing."""
    if signal_type == "accept":
        return "answered_elsewhere"
    if signal_type in ("reject", "busy"):
        return "rejected_elsewhere"
    return None


class RingTimers:
    """The ringing calls of one node, by key, with a lazy deadline heap."""

    def __init__(self, ring_timeout_ms: int) -> None:
        self.ring_timeout_ms = ring_timeout_ms
        self._calls: dict[CallKey, Ringing] = {}
        self._heap: list[tuple[int, CallKey]] = []

    def invite(
        self,
        tenant_id: str,
        call_id: str,
        callee: str,
        *,
        caller: str,
        caller_device: str,
        conversation_id: str,
        now_ms: int,
    ) -> Ringing:
        """Start (or restart, for a repeated invite) ringing."""
        ringing = Ringing(
            tenant_id, call_id, callee, caller, caller_device, conversation_id,
            now_ms + self.ring_timeout_ms,
        )  # fmt: skip
        self._calls[ringing.key] = ringing
        heapq.heappush(self._heap, (ringing.deadline_ms, ringing.key))
        return ringing

    def stop(self, tenant_id: str, call_id: str, callee: str) -> Ringing | None:
        """The call stopped ringing (answered, refused, cancelled); the ringing it was."""
        return self._calls.pop((tenant_id, call_id, callee), None)

    def due(self, now_ms: int) -> list[Ringing]:
        """Every call whose ringing timed out by ``now_ms`` (removed), by deadline."""
        out: list[Ringing] = []
        while self._heap and self._heap[0][0] <= now_ms:
            deadline, key = heapq.heappop(self._heap)
            ringing = self._calls.get(key)
            if ringing is not None and ringing.deadline_ms == deadline:
                del self._calls[key]
                out.append(ringing)
        return out

    def __len__(self) -> int:
        return len(self._calls)
