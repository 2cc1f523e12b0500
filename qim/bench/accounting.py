"""The send ledger: every SEND_MESSAGE, its SEND_ACK or ERROR, and every PUSH_EVENTS entry.

Pure bookkeeping, so the integration test can assert it exactly: each message is identified by
its ``client_message_id``, which the bench also writes at the start of the payload, so the
recipient's entry (which carries no client_message_id, 7.3) is matched as well as the sender's
echo. Times are seconds on one monotonic clock (all devices live in one process).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from qim.bench.histogram import Samples

__all__ = ["Deliveries", "Ledger", "Sent", "cmid_of_payload", "payload_for"]

_SEP = b"|"


def payload_for(cmid: str, size: int) -> bytes:
    """``cmid|`` padded with ``x`` up to ``size`` bytes (never shorter than the id)."""
    head = cmid.encode() + _SEP
    return head + b"x" * max(0, size - len(head))


def cmid_of_payload(payload: bytes) -> str | None:
    head, sep, _ = payload.partition(_SEP)
    return head.decode("ascii", "replace") if sep else None


@dataclass(slots=True)
class Sent:
    """One message of the run: who sent it to whom, when it was meant to leave, what came back."""

    sender: str
    recipient: str
    intended: float
    ack_at: float | None = None
    error: str | None = None
    pushed_at: float | None = None  # first PUSH_EVENTS entry at the recipient
    echoed_at: float | None = None  # first echo at the sender's device
    pushes: int = 0
    echoes: int = 0


@dataclass
class Ledger:
    """Counts what happened to each message; :meth:`summary` is the report's accounting block."""

    messages: dict[str, Sent] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    unexpected: int = 0  # entries naming no message of this run, or the wrong device
    unmatched_acks: int = 0  # SEND_ACK for a client_message_id never sent

    def on_send(self, cmid: str, sender: str, recipient: str, intended: float) -> None:
        if cmid in self.messages:
            raise ValueError(f"client_message_id {cmid!r} sent twice")
        self.messages[cmid] = Sent(sender, recipient, intended)

    def on_ack(self, cmid: str, at: float) -> None:
        sent = self.messages.get(cmid)
        if sent is None or sent.ack_at is not None:
            self.unmatched_acks += 1
            return
        sent.ack_at = at

    def on_error(self, cmid: str, code: str) -> None:
        self.errors[code] += 1
        sent = self.messages.get(cmid)
        if sent is not None:
            sent.error = code

    def on_entry(self, user: str, payload: bytes, at: float) -> None:
        """One PUSH_EVENTS entry received by ``user``'s device (raw, before any dedup)."""
        cmid = cmid_of_payload(payload)
        sent = self.messages.get(cmid) if cmid is not None else None
        if sent is None:
            self.unexpected += 1
        elif user == sent.recipient:
            sent.pushes += 1
            if sent.pushed_at is None:
                sent.pushed_at = at
        elif user == sent.sender:
            sent.echoes += 1
            if sent.echoed_at is None:
                sent.echoed_at = at
        else:
            self.unexpected += 1

    def settled(self) -> bool:
        """Every acked message pushed to its recipient and echoed, and nothing still waiting
        for its SEND_ACK (errors settle a message: nothing is expected of it)."""
        for sent in self.messages.values():
            if sent.error is not None:
                continue
            if sent.ack_at is None or sent.pushed_at is None or sent.echoed_at is None:
                return False
        return True

    def latencies(self) -> tuple[Samples, Samples]:
        """(SEND_ACK, PUSHED) in ms from the intended send time."""
        ack, pushed = Samples(), Samples()
        for sent in self.messages.values():
            if sent.ack_at is not None:
                ack.add((sent.ack_at - sent.intended) * 1000)
            if sent.pushed_at is not None:
                pushed.add((sent.pushed_at - sent.intended) * 1000)
        return ack, pushed

    def summary(self) -> dict[str, Any]:
        values = self.messages.values()
        acked = [s for s in values if s.ack_at is not None]
        return {
            "sent": len(self.messages),
            "acked": len(acked),
            "errors": dict(sorted(self.errors.items())),
            "pushed": sum(1 for s in values if s.pushed_at is not None),
            "echoed": sum(1 for s in values if s.echoed_at is not None),
            "push_entries": sum(s.pushes for s in values),
            "echo_entries": sum(s.echoes for s in values),
            "duplicate_pushes": sum(max(0, s.pushes - 1) for s in values),
            "unexpected_entries": self.unexpected,
            "unmatched_acks": self.unmatched_acks,
            "missing_ack": sum(1 for s in values if s.ack_at is None and s.error is None),
            "lost": sum(1 for s in acked if s.pushed_at is None),
            "echo_missing": sum(1 for s in acked if s.echoed_at is None),
        }


@dataclass
class Deliveries:
    """Fan-out bookkeeping: each message is expected once at each of ``recipients``."""

    recipients: frozenset[str]
    intended: dict[str, float] = field(default_factory=dict)
    first_at: dict[tuple[str, str], float] = field(default_factory=dict)
    entries: int = 0
    duplicates: int = 0
    unexpected: int = 0
    last_at: float = 0.0

    def on_send(self, cmid: str, intended: float) -> None:
        self.intended[cmid] = intended

    def on_entry(self, user: str, payload: bytes, at: float) -> None:
        cmid = cmid_of_payload(payload)
        if cmid is None or cmid not in self.intended or user not in self.recipients:
            self.unexpected += 1
            return
        self.entries += 1
        if (cmid, user) in self.first_at:
            self.duplicates += 1
            return
        self.first_at[(cmid, user)] = at
        self.last_at = max(self.last_at, at)

    @property
    def expected(self) -> int:
        return len(self.intended) * len(self.recipients)

    def complete(self) -> bool:
        return len(self.first_at) >= self.expected

    def latency(self) -> Samples:
        """PUSHED latency (ms from the intended send time) of every (message, recipient)."""
        return Samples((at - self.intended[cmid]) * 1000 for (cmid, _), at in self.first_at.items())

    def summary(self) -> dict[str, int]:
        return {
            "messages": len(self.intended),
            "expected_deliveries": self.expected,
            "delivered": len(self.first_at),
            "missing": self.expected - len(self.first_at),
            "duplicates": self.duplicates,
            "unexpected_entries": self.unexpected,
        }
