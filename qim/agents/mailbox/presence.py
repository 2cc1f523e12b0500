"""The MailboxNode's presence caches: one :class:`ShardPresenceCache` per owned MailboxShard.

Why the presence topic rides the node's group subscription (instead of a second, manually
assigned consumer that follows the owned set): the :class:`~qim.agents.mailbox.assignor.
ShardAssignor` already gives partition s of *every* subscribed topic to the owner of shard s,
so subscribing ``qim.presence`` co-assigns presence partition s with dispatch partition s in
the same generation. The cache is then fed only by the partitions of the shards this node owns
(5.4.2), and a revoke stops pushes and presence reads at the same instant; there is no second
ownership bookkeeping to drift.

Takeover (5.4.3, 11.1.2): the presence offsets are never committed. On every assignment the
consumer rewinds each owned presence partition to its beginning (:func:`rewind`), records the
end offset at that moment, and the shard's cache is *rebuilding* until it has applied
everything below that end. A rebuilding shard makes no push decision (the push is skipped and
counted; the entries are durable and the client pulls them), so no push is ever planned from a
half-read cache and nothing on the push path calls a remote service.

PRESENCE_STALE arrives on ``qim.user-requests`` (see ``qim.schemas.records.push``);
:func:`stale_reports` picks them out of a fetched run and :meth:`NodePresence.invalidate`
applies them to the shard's cache.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition

from qim.core.push import ReconcileReport, ShardPresenceCache
from qim.schemas.records.presence import PresenceEntry, PresenceKey, decode_presence
from qim.schemas.records.push import PresenceStale, decode_presence_stale

__all__ = [
    "NodePresence",
    "ShardPresence",
    "read_partition",
    "rewind",
    "snapshot_of",
    "stale_reports",
]

log = logging.getLogger(__name__)

_DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError)


@dataclass(slots=True)
class ShardPresence:
    """One owned shard's cache and how far its presence partition has been applied."""

    cache: ShardPresenceCache
    rebuild_until: int
    """End offset of the partition at takeover: the cache is complete once it reached it."""
    next_offset: int = 0

    @property
    def ready(self) -> bool:
        return self.next_offset >= self.rebuild_until


@dataclass(slots=True)
class NodePresence:
    """The caches of the shards the node owns; rebuilt from scratch on every assignment."""

    shards: dict[int, ShardPresence] = field(default_factory=dict)

    def assign(self, bounds: dict[int, tuple[int, int]]) -> None:
        """New empty caches for ``bounds`` (shard -> (start, end) offsets at takeover)."""
        self.shards = {
            s: ShardPresence(ShardPresenceCache(s), end, start)
            for s, (start, end) in bounds.items()
        }

    def clear(self) -> None:
        self.shards.clear()

    def cache(self, shard: int) -> ShardPresenceCache | None:
        """The shard's cache once it is fully rebuilt; None while rebuilding or not owned."""
        state = self.shards.get(shard)
        return state.cache if state is not None and state.ready else None

    def apply(self, partition: int, records: Sequence[Any], now_ms: int) -> int:
        """Fold a fetched run of presence partition ``partition``; returns malformed count."""
        state = self.shards.get(partition)
        if state is None or not records:
            return 0
        malformed = 0
        for record in records:
            try:
                state.cache.apply_record(partition, record.key, record.value, now_ms)
            except _DECODE_ERRORS:
                malformed += 1
                log.warning("presence %d: undecodable record at %d", partition, record.offset)
        state.next_offset = max(state.next_offset, records[-1].offset + 1)
        state.cache.expire(now_ms)
        return malformed

    def invalidate(self, stale: PresenceStale, now_ms: int) -> bool:
        """PRESENCE_STALE for a device of an owned shard; True if an entry was dropped."""
        state = self.shards.get(stale.mailbox_shard)
        return state is not None and state.cache.invalidate(stale, now_ms)

    def reconcile(
        self,
        shard: int,
        snapshot: Iterable[tuple[PresenceKey, PresenceEntry | None]],
        now_ms: int,
    ) -> ReconcileReport | None:
        """Diff and adopt a full read of the shard's partition (None: not owned / rebuilding)."""
        cache = self.cache(shard)
        return None if cache is None else cache.reconcile(snapshot, now_ms)

    def status(self) -> dict[str, object]:
        return {
            str(s): {"ready": st.ready, "next_offset": st.next_offset, "devices": len(st.cache)}
            for s, st in sorted(self.shards.items())
        }


async def rewind(
    consumer: AIOKafkaConsumer, tps: Sequence[TopicPartition]
) -> dict[int, tuple[int, int]]:
    """Seek the owned presence partitions to their beginning; returns partition -> (start,
    end). The start matters: a compacted partition whose records were all cleaned has
    ``start == end > 0`` and must count as rebuilt at once.

    One ``seek_to_beginning`` for all of them (each call waits for a fetcher round).
    """
    if not tps:
        return {}
    starts = await consumer.beginning_offsets(list(tps))
    ends = await consumer.end_offsets(list(tps))
    await consumer.seek_to_beginning(*tps)
    return {tp.partition: (int(starts[tp]), int(ends[tp])) for tp in tps}


async def read_partition(
    reader: AIOKafkaConsumer, tp: TopicPartition, start: int, up_to: int, into: list[Any]
) -> None:
    """Append the records of ``tp`` in ``[start, up_to)`` to ``into`` (the reconcile's read)."""
    if start >= up_to:
        return
    reader.assign([tp])
    reader.seek(tp, start)
    while True:
        fetched = await reader.getmany(tp, timeout_ms=500)
        for record in fetched.get(tp, ()):
            if record.offset >= up_to:
                return
            into.append(record)
        if await reader.position(tp) >= up_to:
            return


def stale_reports(records: Iterable[Any]) -> list[PresenceStale]:
    """The PRESENCE_STALE records of a fetched user-requests run (other kinds are skipped)."""
    out = []
    for record in records:
        try:
            out.append(decode_presence_stale(record.value))
        except _DECODE_ERRORS:
            continue
    return out


def snapshot_of(records: Iterable[Any]) -> list[tuple[PresenceKey, PresenceEntry | None]]:
    """Decode a full read of a presence partition for :meth:`NodePresence.reconcile`."""
    out: list[tuple[PresenceKey, PresenceEntry | None]] = []
    for record in records:
        try:
            out.append((PresenceKey.decode(record.key), decode_presence(record.value)))
        except _DECODE_ERRORS:
            continue
    return out
