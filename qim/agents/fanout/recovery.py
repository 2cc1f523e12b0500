"""Recovering one outbox partition: rebuild the fanout state up to the group's committed offset.

The algorithm (issue 5; ``K`` = the group's committed offset of partition p, or the log start
``B`` when the group has none; the outbox holds offsets ``[B, E)``):

1. **Dormant.** A state this worker kept from before a rebalance is reused when it is exactly
   where the group stands (its own commit offset is K: held records are still held), or when it
   has nothing held and is behind K (another member committed meanwhile): replay ``[next, K)``.
2. **Checkpoint.** Otherwise read ``qim.writer-snapshots`` partition p backwards in widening
   windows for the newest complete checkpoint with ``outbox_offset < K``; seed the state from it
   (``fanout_seed``) and replay ``[outbox_offset + 1, K)``. Why strictly below K: a checkpoint
   holds only each group's current version, so records at or below its offset may pin versions
   it no longer knows; the newest checkpoint is often ahead of K because the writer runs ahead.
3. **Log.** No such checkpoint and the outbox still starts at 0: replay ``[0, K)`` from empty.
4. **Degraded.** Neither: seed from the oldest complete checkpoint (or empty), log an error and
   go on from K; records it cannot place are held, which keeps the commit at them and alerts
   (``qim_fanout_held_records``). Only a compacted-away history plus an outbox retention that
   deleted the group's creation gets here.

Replay applies records with ``PartitionFanout.feed(live=False)`` -- the live function, output
discarded -- so the rebuilt state is the one the previous owner had at K. The service then seeks
the group consumer to K and produces from there.

Invariants: (a) no dispatch is lost -- K only ever passes records whose dispatches were all
acknowledged (the service commits after the acks), and production restarts at K; records in
``[K, E)`` that the previous owner had already dispatched go out again with the same
``dispatch_id`` and identical bytes (``FanoutState`` is deterministic), which the MailboxNode's
dispatch-id dedup absorbs. (b) The state fed at K equals the state a full replay would have
there, except the CONTROL stamp of the seeded current version (``fanout_seed``). (c) Nothing is
produced while rebuilding. A K above E (a re-created outbox) restarts at B; a K below B means
retention deleted records the group never dispatched: logged as an error, since nothing can
bring them back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from qim.agents.fanout.options import FanoutOptions
from qim.agents.fanout.partition import PartitionFanout
from qim.agents.fanout.seed import complete_checkpoints, seed_state
from qim.agents.writer.restore import check_bound
from qim.agents.writer.snapshot import Checkpoint
from qim.core.fanout import FanoutState
from qim.streams.identity import fetch_log_identity

__all__ = ["LogReader", "Recovered", "recover_partition"]

log = logging.getLogger(__name__)

_FIRST_WINDOW = 16
_READ_TIMEOUT_S = 120.0


class LogReader:
    """A read_committed consumer assigned once to the outbox and snapshot partitions of a round.

    Bounds are read before the first fetch (a ListOffsets queued behind a long-polling fetch
    waits for it), and the assignment never changes (``writer_restore`` notes aiokafka 0.14 can
    hang in ``stop()`` after a re-assignment).
    """

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self.consumer = consumer
        self.bounds: dict[TopicPartition, tuple[int, int]] = {}

    @classmethod
    async def open(cls, bootstrap: str, client_id: str, tps: list[TopicPartition]) -> LogReader:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            client_id=client_id,
            isolation_level="read_committed",
            enable_auto_commit=False,
            fetch_max_wait_ms=100,
        )
        await consumer.start()
        reader = cls(consumer)
        try:
            consumer.assign(tps)
            consumer.pause(*tps)
            begins = await consumer.beginning_offsets(tps)
            ends = await consumer.end_offsets(tps)  # read_committed: the last stable offsets
            reader.bounds = {tp: (begins[tp], ends[tp]) for tp in tps}
        except BaseException:
            await consumer.stop()
            raise
        return reader

    async def records(self, tp: TopicPartition, start: int, end: int) -> AsyncIterator[list[Any]]:
        """Committed records of ``tp`` with ``start <= offset < end``, in fetch batches."""
        if start >= end:
            return
        consumer = self.consumer
        consumer.pause(*consumer.assignment())
        consumer.resume(tp)
        consumer.seek(tp, start)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _READ_TIMEOUT_S
        try:
            while await consumer.position(tp) < end:
                if loop.time() > deadline:
                    raise TimeoutError(f"reading {tp} up to {end} took over {_READ_TIMEOUT_S} s")
                fetched = await consumer.getmany(tp, timeout_ms=500, max_records=2000)
                batch = [m for m in fetched.get(tp, ()) if m.offset < end]
                if batch:
                    yield batch
        finally:
            consumer.pause(tp)

    async def close(self) -> None:
        await self.consumer.stop()


async def find_checkpoints(
    reader: LogReader, tp: TopicPartition, below: int
) -> tuple[Checkpoint | None, Checkpoint | None]:
    """(the newest checkpoint with ``outbox_offset < below``, the oldest one seen)."""
    begin, end = reader.bounds[tp]
    window = _FIRST_WINDOW
    while True:
        start = max(begin, end - window)
        values = [m.value async for batch in reader.records(tp, start, end) for m in batch]
        found = complete_checkpoints(values, tp.partition)
        usable = [c for c in found if c.outbox_offset < below]
        if usable or start == begin:
            newest = max(usable, key=lambda c: c.outbox_offset, default=None)
            oldest = min(found, key=lambda c: c.outbox_offset, default=None)
            return newest, oldest
        window *= 4


@dataclass(frozen=True, slots=True)
class Recovered:
    """A rebuilt partition, where to produce from, and how it was rebuilt."""

    fanout: PartitionFanout
    start: int
    """The offset to seek the group consumer to (K)."""
    basis: str
    checkpoint_offset: int | None
    replayed: int

    def describe(self) -> dict[str, Any]:
        """For status pages and logs."""
        return {
            "basis": self.basis,
            "checkpoint_offset": self.checkpoint_offset,
            "replayed": self.replayed,
            "start": self.start,
        }


async def _replay(reader: LogReader, tp: TopicPartition, fanout: PartitionFanout, end: int) -> int:
    count = 0
    async for batch in reader.records(tp, fanout.next_offset, end):
        fanout.feed(((m.offset, m.value) for m in batch), live=False)
        count += len(batch)
    fanout.next_offset = max(fanout.next_offset, end)
    dropped = fanout.end_replay()
    if dropped:
        log.warning("%s: %d records stayed held in the replay below %d", tp, len(dropped), end)
    return count


async def recover_partition(
    reader: LogReader,
    partition: int,
    committed: int | None,
    *,
    dormant: PartitionFanout | None,
    options: FanoutOptions,
) -> Recovered:
    """Steps 1-4 of the module docstring for ``partition`` (the reader holds both its tps)."""
    outbox = TopicPartition(options.outbox_topic, partition)
    snapshots = TopicPartition(options.snapshots_topic, partition)
    begin, end = reader.bounds[outbox]
    k = begin if committed is None else committed
    if k > end:
        log.error("%s: committed offset %d is beyond the log end %d", outbox, k, end)
        k = begin
    elif k < begin:
        log.error("%s: records %d..%d were deleted before they were dispatched", outbox, k, begin)
        k = begin
    if dormant is not None and dormant.stalled is None:
        if dormant.commit_offset == k:
            return Recovered(dormant, k, "dormant", None, 0)
        if not dormant.held and begin <= dormant.next_offset <= k:
            replayed = await _replay(reader, outbox, dormant, k)
            return Recovered(dormant, k, "dormant", None, replayed)
    newest, oldest = await find_checkpoints(reader, snapshots, k)
    if newest is not None or oldest is not None:
        live = await fetch_log_identity(options.bootstrap, options.outbox_topic)
        check_bound(newest, live, snapshots)  # 17.2: fail closed on another log's checkpoint
        check_bound(oldest, live, snapshots)
    if newest is not None:
        if newest.outbox_offset + 1 < begin:
            log.warning("%s: outbox starts after checkpoint %d + 1", outbox, newest.outbox_offset)
        state = seed_state(newest, options.config)
        fanout = PartitionFanout(partition, state, max(newest.outbox_offset + 1, begin))
        replayed = await _replay(reader, outbox, fanout, k)
        return Recovered(fanout, k, "checkpoint", newest.outbox_offset, replayed)
    if begin == 0:
        fanout = PartitionFanout(partition, FanoutState(options.config), 0)
        return Recovered(fanout, k, "log", None, await _replay(reader, outbox, fanout, k))
    log.error(
        "%s: no writer checkpoint below %d and the outbox starts at %d: membership may be "
        "incomplete; records it cannot place will be held",
        outbox, k, begin,
    )  # fmt: skip
    if oldest is not None:
        fanout = PartitionFanout(partition, seed_state(oldest, options.config), k)
        return Recovered(fanout, k, "degraded", oldest.outbox_offset, 0)
    fanout = PartitionFanout(partition, FanoutState(options.config), begin)
    return Recovered(fanout, k, "degraded", None, await _replay(reader, outbox, fanout, k))
