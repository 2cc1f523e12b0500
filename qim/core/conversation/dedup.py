"""ClientDedup (spec 7.2, 8.3): ``(tenant, sender, client_message_id)`` -> the SEND_ACK fields.

The spec's table is written with ``IF NOT EXISTS`` so concurrent writer instances converge. Here
one writer owns a conversation's partition and the entry is *derived from the committed outbox
record* (``apply()``), so the coordinates are durable before any ack can be replayed and a
takeover rebuilds the same entries by replay: the spec's INFLIGHT states (steps 1, 3, 6 of 8.3)
collapse into "the record is in the log or it is not" (spec 8 Kafka-mapping note).

Window: ``client_dedup_ttl_seconds`` (7200, ADR-0008) measured in **log time**: an entry expires
when a record committed at least the TTL after it is applied. Expiry is thus a function of the
log, never of the wall clock at read time, so live state and replayed state agree byte for byte.
The price is that an idle partition keeps its entries past two hours, which only widens the
window (a late retry gets the old ack rather than a duplicate message).

Memory is bounded twice: by the window (entries are kept in commit order, the oldest evicted
first) and by ``client_dedup_max_entries``; evicting early by the cap is counted in
:attr:`ClientDedup.evicted_early` (a metric, not state).

Scope: keys are unique per writer partition. A sender reusing a ``client_message_id`` in a
conversation of another partition is not detected (spec 8 mapping note: a cmid belongs to one
conversation); reused in another conversation of the same partition, it is answered as the
duplicate it is under the spec's key (the client generated it twice; nothing is committed twice).

An empty ``client_message_id`` is never recorded: deduplicating on "" would make every such
message of a sender a duplicate of the first (silent loss).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = ["ClientDedup", "DedupEntry", "DedupKey"]

DedupKey = tuple[str, str, str]
"""``(tenant_id, sender_id, client_message_id)``."""


@dataclass(frozen=True, slots=True)
class DedupEntry:
    """What a duplicate is answered with (the SEND_ACK triple) and when it was committed."""

    conversation_id: str
    message_id: bytes
    conversation_seq: int
    last_activity_id: bytes
    committed_at: int


class ClientDedup:
    """Commit-ordered map; insertion order is ``committed_at`` order (the writer's HLC)."""

    __slots__ = ("_entries", "evicted_early", "max_entries", "ttl_ms")

    def __init__(self, ttl_seconds: int, max_entries: int) -> None:
        self.ttl_ms = ttl_seconds * 1000
        self.max_entries = max_entries
        self._entries: dict[DedupKey, DedupEntry] = {}
        self.evicted_early = 0

    def get(self, tenant_id: str, sender_id: str, client_message_id: str) -> DedupEntry | None:
        """The committed send of this key, if still in the window; never mutates."""
        if not client_message_id:
            return None
        return self._entries.get((tenant_id, sender_id, client_message_id))

    def record(self, key: DedupKey, entry: DedupEntry) -> None:
        """Remember a committed send, then expire by log time and enforce the cap.

        An existing key keeps its first entry (``IF NOT EXISTS``): one key maps to at most one
        ``conversation_seq`` within the window (spec 8 I-6).
        """
        if key[2] and key not in self._entries:
            self._entries[key] = entry
        self.expire(entry.committed_at)
        while len(self._entries) > self.max_entries:
            del self._entries[next(iter(self._entries))]
            self.evicted_early += 1

    def expire(self, log_time_ms: int) -> int:
        """Drop entries committed at least the TTL before ``log_time_ms``; return how many."""
        horizon = log_time_ms - self.ttl_ms
        dropped = 0
        while self._entries:
            key = next(iter(self._entries))
            if self._entries[key].committed_at > horizon:
                break
            del self._entries[key]
            dropped += 1
        return dropped

    def items(self) -> Iterator[tuple[DedupKey, DedupEntry]]:
        """Entries in commit order, for snapshots."""
        return iter(self._entries.items())

    def load(self, items: Iterable[tuple[DedupKey, DedupEntry]]) -> None:
        """Restore from :meth:`items` output (order preserved)."""
        self._entries = dict(items)

    def __len__(self) -> int:
        return len(self._entries)
