"""The steps of one FanoutCoordinator round that touch Kafka records, logs and metrics.

Split from the service so the loop there reads as the three steps of its docstring: feed
(:func:`feed_live`), produce (:func:`produce`, every future gathered: faust-kafka-notes 7 --
never await each send), observe (:func:`observe`) after the acks. Held records are logged once
when first held and then periodically (:func:`report_held`), so a stuck partition stays visible
without a line per retry.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaProducer

from qim.agents.fanout.metrics import FanoutMetrics
from qim.agents.fanout.partition import Fed, PartitionFanout
from qim.agents.trace_lines import dispatched as trace_dispatched
from qim.schemas.records import (
    DispatchLogRecord,
    GroupDispatch,
    MessageAmended,
    MessageCommitted,
    MessageReacted,
    ReactionSummary,
    conversation_key,
    encode_dispatch_record,
)

__all__ = ["feed_live", "observe", "produce", "report_held"]

log = logging.getLogger("qim.agents.fanout.coordinator")


def feed_live(
    part: PartitionFanout, records: list[Any], metrics: FanoutMetrics, max_held: int
) -> tuple[Fed, bool]:
    """Feed fetched records; returns what to produce and whether to pause the partition."""
    fed = part.feed(((m.offset, m.value) for m in records), live=True)
    now = time.time()
    for record, _count in fed.sent:
        metrics.outbox_lag.observe(max(0.0, now - record.committed_at / 1000))
    for nr in fed.held:
        metrics.not_ready.labels(nr.reason.value).inc()
        log.warning(
            "p%d: holding message %s of %s/%s: membership v%d not ready (known v%d, %s)",
            part.partition, nr.message_id.hex(), nr.tenant_id, nr.conversation_id,
            nr.membership_version, nr.known_version, nr.reason.value,
        )  # fmt: skip
    metrics.released.inc(fed.released)
    if fed.stalled is not None:
        metrics.stalled.inc()
        stall = fed.stalled
        log.error("p%d stalled at offset %d: %s", part.partition, stall.offset, stall.reason)
        return fed, True
    if len(part.held) >= max_held:
        log.error("p%d holds %d records: pausing it", part.partition, len(part.held))
        return fed, True
    return fed, False


def dispatch_key(record: DispatchLogRecord) -> bytes:
    """``(tenant, dispatch_id)`` for a dispatch, ``(tenant, message_id)`` for a reaction
    summary; a member slice keys like the writer's."""
    if isinstance(record, GroupDispatch | ReactionSummary):
        return record.key
    return conversation_key(record.tenant_id, record.group_id)


async def produce(producer: AIOKafkaProducer, topic: str, fed: Fed) -> None:
    """Produce ``fed``'s dispatches in order at their explicit partitions; wait for every ack."""
    futures: list[asyncio.Future[Any]] = []
    for d in fed.dispatches:
        value = encode_dispatch_record(d)
        future = await producer.send(topic, value, key=dispatch_key(d), partition=d.partition)
        future.add_done_callback(_retrieve)  # a send that fails after a later one raised
        futures.append(future)
    await asyncio.gather(*futures)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def observe(metrics: FanoutMetrics, fed: Fed, now: float) -> None:
    """Count an acknowledged feed; ``now`` is the wall clock in seconds (metrics only)."""
    metrics.dispatches.inc(len(fed.dispatches))
    trace_dispatched(log, fed.dispatches)
    for record, count in fed.sent:
        if count == 0:
            continue  # an earlier create chunk: nothing dispatched, no lag to speak of
        metrics.lag.observe(max(0.0, now - record.committed_at / 1000))
        if isinstance(record, MessageCommitted):
            metrics.outbox_records.labels("message").inc()
            metrics.target_shards.observe(count)
        elif isinstance(record, MessageAmended):
            metrics.outbox_records.labels("amend").inc()
        elif isinstance(record, MessageReacted):
            metrics.outbox_records.labels("reaction").inc()
        else:
            metrics.outbox_records.labels("membership").inc()


def report_held(parts: Mapping[int, PartitionFanout]) -> None:
    """One line per partition that still holds records."""
    for p, part in sorted(parts.items()):
        if part.held:
            first = part.held[0]
            log.warning(
                "p%d still holds %d records; the first at offset %d waits for %s v%d",
                p, len(part.held), first.offset, first.reason.conversation_id,
                first.reason.membership_version,
            )  # fmt: skip
