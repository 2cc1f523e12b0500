"""FanoutCoordinator: outbox in, one GroupDispatch per target MailboxShard out (spec 10.1, 7.8).

A ``mode.Service`` on the conversation app (:func:`register`), with its own aiokafka consumer in
group ``qim-fanout`` on ``qim.outbox``: read_committed (the ConversationWriter appends inside
transactions; an aborted append is never fanned out), auto-commit off, session timeout =
``shard_lease_ttl``. Why not a Faust agent: Faust's per-event stream machinery costs ~10x a
plain ``getmany`` relay (faust-kafka-notes 7), and the commit must follow the produce acks, not
Faust's own acking.

Pipelined per partition: the records a fetch (up to ``max_records``) returned for a partition
are that partition's next step, run as a task while the loop keeps fetching; records fetched
while a step is in flight queue for the step after it (the partition pauses once
``max_records`` queue). So one step at a time per partition, in log order, no partition waits
for another's acks, and the consumer keeps prefetching. A step:

1. ``PartitionFanout.feed``: each record in log order through ``FanoutState.apply_outbox``; a
   NotReady is held (counted, logged) and keeps the commit offset at it (``fanout_partition``);
2. every dispatch is produced to ``qim.dispatch`` at its explicit partition (the target shard)
   with a plain producer, ``acks="all"``, ``enable_idempotence=False`` (spec 6.5 / ADR-0017:
   idempotence would cap the requests in flight; duplicates are absorbed by the MailboxNode's
   dispatch-id dedup), and the futures are gathered;
3. only then the partition's commit offset is handed to the committer (ADR-0012: a commit
   never passes a record whose dispatches were not acknowledged) and the step ends: the
   partition's next step does not wait for the OffsetCommit round trip. The committer sends
   one OffsetCommit at a time, each carrying every partition's newest acknowledged offset, so
   the offsets handed over while one is in flight share the next request (issue 13: one request
   per round instead of one per step and partition). A failed produce or commit drops the
   partition's state and recovers it again from the committed offset: what was produced goes out
   again, with the same ``dispatch_id``. A partition whose offset moves without records (past the
   transaction markers read_committed skips, or a recovered start) gets a step without records.

Recovery (``fanout_recovery``) runs in this loop for newly assigned partitions, which are
paused until it has rebuilt their state up to the committed offset and sought there. On
revocation (aiokafka rebalances eagerly) the listener keeps the states dormant for a quick
return, waits for the steps in flight and sends what they handed to the committer, so their
commits land before the partitions move. A stop cancels the steps and the committer: nothing is
committed that was not acknowledged (what was acknowledged and not committed goes out again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, IllegalStateError
from mode import Service
from prometheus_client import CollectorRegistry

from qim.agents.fanout.metrics import FanoutMetrics
from qim.agents.fanout.options import FanoutOptions
from qim.agents.fanout.partition import PartitionFanout
from qim.agents.fanout.recovery import LogReader, recover_partition
from qim.agents.fanout.round import feed_live, observe, produce, report_held
from qim.params import Settings
from qim.streams.producer import RecoveringProducer, replaced_counter

__all__ = ["BeforeCommit", "FanoutCoordinatorService", "register"]

log = logging.getLogger(__name__)

BeforeCommit = Callable[[Mapping[int, int]], Awaitable[None]]
"""Test seam: awaited after the acks, before the commit of the offsets it is given
(``{partition: offset}``, every partition of one OffsetCommit); one call at a time, and no
commit runs while it is awaited."""


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped
    def __init__(self, service: FanoutCoordinatorService) -> None:
        self._service = service

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._service._revoked()

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self._service._assigned_partitions({tp.partition for tp in assigned})


class FanoutCoordinatorService(Service):
    """The FanoutCoordinator of the outbox partitions the group gives this worker."""

    def __init__(
        self,
        options: FanoutOptions,
        *,
        registry: CollectorRegistry | None = None,
        before_commit: BeforeCommit | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.options = options
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = FanoutMetrics(self.registry)
        self.producer_replaced = replaced_counter(self.registry, "conversation")
        self._before_commit = before_commit
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: RecoveringProducer | None = None
        self._lock = asyncio.Lock()
        self._commit_lock = asyncio.Lock()
        self._inflight: dict[int, asyncio.Task[None]] = {}
        self._queued: dict[int, list[Any]] = {}
        self._generation = 0
        self._assigned: set[int] = set()
        self._pending: set[int] = set()
        self._parts: dict[int, PartitionFanout] = {}
        self._dormant: dict[int, PartitionFanout] = {}
        self._recoveries: dict[int, dict[str, Any]] = {}
        self._committed: dict[int, int] = {}
        self._to_commit: dict[int, int] = {}
        """Acknowledged commit offsets not yet sent, by partition (the committer's queue)."""
        self._commit_wanted = asyncio.Event()
        self._committer: asyncio.Task[None] | None = None
        self._reported = 0.0

    def status(self) -> dict[str, Any]:
        """What is owned and how it was recovered (for tests and a status page)."""
        return {
            "assigned": sorted(self._assigned),
            "serving": sorted(self._parts),
            "recovering": sorted(self._pending),
            "held": {p: len(f.held) for p, f in sorted(self._parts.items()) if f.held},
            "stalled": {p: f.stalled.offset for p, f in sorted(self._parts.items()) if f.stalled},
            "recoveries": dict(sorted(self._recoveries.items())),
        }

    # -- lifecycle -------------------------------------------------------------------------------

    async def on_start(self) -> None:
        # replaced if its sender dies; its failures reset the partition (re-produced from the
        # committed offset, same dispatch_id), so nothing is re-sent by the producer itself
        producer = RecoveringProducer(
            self.options.producer,
            name="dispatch",
            idempotent=False,
            resend=False,
            on_replaced=lambda reason: self.producer_replaced.labels(
                producer="dispatch", reason=reason
            ).inc(),
        )
        await producer.start()
        self._producer = producer
        consumer = self.options.consumer()
        await consumer.start()
        consumer.subscribe([self.options.outbox_topic], listener=_Listener(self))
        self._consumer = consumer
        self._committer = asyncio.create_task(self._commit_loop(consumer), name="fanout-commits")
        self._committer.add_done_callback(_log_failure)

    async def on_shutdown(self) -> None:
        """After the loop is cancelled: cancel the steps and the committer, leave the group,
        stop the producer; commit nothing more."""
        committer, self._committer = self._committer, None
        if committer is not None:
            committer.cancel()
            await asyncio.gather(committer, return_exceptions=True)
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._inflight.clear()
        if self._consumer is not None:
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()

    # -- the loop --------------------------------------------------------------------------------

    @Service.task
    async def _serve(self) -> None:
        while not self.should_stop:
            consumer = self._consumer
            if consumer is None:
                await self.sleep(0.1)
                continue
            if self._pending:
                await self._recover(consumer)
                continue
            try:
                fetched = await consumer.getmany(
                    timeout_ms=500, max_records=self.options.max_records
                )
            except Exception:
                log.exception("outbox fetch failed; retrying")
                await self.sleep(self.options.retry_s)
                continue
            batches = {tp.partition: rs for tp, rs in fetched.items() if rs}
            for p, part in list(self._parts.items()):
                records = batches.get(p, [])
                if p in self._inflight:
                    queued = self._queued.setdefault(p, [])
                    queued += records
                    if len(queued) >= self.options.max_records:
                        self._pause(consumer, p)  # until the next step takes them
                elif records or await self._due(consumer, p, part):
                    self._start(consumer, p, part, records)
            self.metrics.held.set(sum(f.blocking for f in self._parts.values()))
            if time.monotonic() - self._reported >= self.options.held_report_interval_s:
                self._reported = time.monotonic()
                report_held(self._parts)

    def _start(
        self, consumer: AIOKafkaConsumer, p: int, part: PartitionFanout, records: list[Any]
    ) -> None:
        task = asyncio.create_task(self._step(consumer, p, part, records), name=f"fanout-p{p}")
        self._inflight[p] = task
        task.add_done_callback(_log_failure)

    async def _step(
        self, consumer: AIOKafkaConsumer, p: int, part: PartitionFanout, records: list[Any]
    ) -> None:
        """Steps 1-3 of the module docstring for one partition's records (none: a commit)."""
        try:
            if records and part.stalled is None:
                assert self._producer is not None
                try:  # a failure drops the state: it may be ahead of what was acknowledged
                    fed, pause = feed_live(part, records, self.metrics, self.options.max_held)
                    if pause:
                        self._pause(consumer, p)
                    await produce(self._producer, self.options.dispatch_topic, fed)
                except Exception as exc:
                    log.error("p%d: feeding or producing failed (%r); recovering it", p, exc)
                    self.metrics.batch_failures.inc()
                    self._reset(consumer, p)
                    return
                observe(self.metrics, fed, time.time())
            if not self._queued.get(p):  # else the position is past records not yet fed
                await self._seen(consumer, p, part)
            if part.commit_offset > self._commit_floor(p):
                self._to_commit[p] = part.commit_offset
                self._commit_wanted.set()
        finally:
            self._inflight.pop(p, None)
        queued = self._queued.pop(p, [])
        if queued and self._parts.get(p) is part:  # else reset, recovering or revoked
            if part.stalled is None and len(part.held) < self.options.max_held:
                with contextlib.suppress(IllegalStateError):  # paused for the queue
                    consumer.resume(TopicPartition(self.options.outbox_topic, p))
            self._start(consumer, p, part, queued)

    def _commit_floor(self, p: int) -> int:
        """The highest offset of ``p`` committed or handed to the committer."""
        return max(self._committed.get(p, -1), self._to_commit.get(p, -1))

    async def _commit_loop(self, consumer: AIOKafkaConsumer) -> None:
        """The committer: one OffsetCommit at a time with everything handed over meanwhile."""
        while True:
            await self._commit_wanted.wait()
            self._commit_wanted.clear()
            await self._commit(consumer)

    async def _commit(self, consumer: AIOKafkaConsumer) -> None:
        """Commit every partition's newest acknowledged offset in one request."""
        async with self._commit_lock:
            offsets = {p: o for p, o in self._to_commit.items() if o > self._committed.get(p, -1)}
            self._to_commit.clear()
            if not offsets:
                return
            topic = self.options.outbox_topic
            try:
                if self._before_commit is not None:
                    await self._before_commit(offsets)
                await consumer.commit({TopicPartition(topic, p): o for p, o in offsets.items()})
                self.metrics.commits.inc()
                self._committed.update(offsets)
            except (CommitFailedError, IllegalStateError) as exc:
                log.info("outbox commit of %s refused (%r): moved in a rebalance", offsets, exc)
            except Exception:
                log.exception("outbox commit of %s failed; recovering them", offsets)
                self.metrics.batch_failures.inc()
                for p in offsets:
                    self._reset(consumer, p)

    def _pause(self, consumer: AIOKafkaConsumer, p: int) -> None:
        with contextlib.suppress(IllegalStateError):
            consumer.pause(TopicPartition(self.options.outbox_topic, p))

    async def _seen(self, consumer: AIOKafkaConsumer, p: int, part: PartitionFanout) -> None:
        """One that holds nothing takes the consumer position (past markers read_committed
        skips), so a caught-up partition commits its log end."""
        if part.stalled is None and not part.blocking:
            with contextlib.suppress(IllegalStateError):  # revoked
                tp = TopicPartition(self.options.outbox_topic, p)
                part.seen_up_to(await consumer.position(tp))

    async def _due(self, consumer: AIOKafkaConsumer, p: int, part: PartitionFanout) -> bool:
        """An idle partition whose commit offset moved without records."""
        if p in self._inflight:
            return False
        await self._seen(consumer, p, part)
        if self._parts.get(p) is not part or p in self._inflight:
            return False
        return part.commit_offset > self._commit_floor(p)

    # -- rebalance and recovery ------------------------------------------------------------------

    async def _revoked(self) -> None:
        async with self._lock:
            self._generation += 1
            self._dormant.update(self._parts)
            self._parts.clear()  # no step starts another
            self._queued.clear()  # the recovery seeks back to the commit
            self._pending.clear()
            self._assigned = set()
        tasks = list(self._inflight.values())
        if tasks:  # the steps in flight commit before the partitions move
            await asyncio.wait(tasks)
        consumer = self._consumer
        if consumer is not None and self._committer is not None and not self._committer.done():
            await self._commit(consumer)  # what the steps handed over, before they move

    def _assigned_partitions(self, partitions: set[int]) -> None:
        self._assigned = set(partitions)
        self._pending = set(partitions)
        for p in [p for p in self._dormant if p not in partitions]:
            del self._dormant[p]
        consumer = self._consumer
        if consumer is not None:
            topic = self.options.outbox_topic
            consumer.pause(*(TopicPartition(topic, p) for p in partitions))
        log.info("assigned outbox partitions %s", sorted(partitions))

    def _reset(self, consumer: AIOKafkaConsumer, p: int) -> None:
        """Drop a partition's state (it may be ahead of what was acknowledged) and recover it."""
        if self._parts.pop(p, None) is None:
            return  # revoked meanwhile (or already reset)
        self._queued.pop(p, None)  # the recovery seeks back to the commit
        self._pending.add(p)
        self._pause(consumer, p)

    async def _recover(self, consumer: AIOKafkaConsumer) -> None:
        opts, generation = self.options, self._generation
        partitions = sorted(self._pending)
        outbox = {p: TopicPartition(opts.outbox_topic, p) for p in partitions}
        tps = [*outbox.values(), *(TopicPartition(opts.snapshots_topic, p) for p in partitions)]
        reader: LogReader | None = None
        try:
            committed = {p: await consumer.committed(tp) for p, tp in outbox.items()}
            reader = await LogReader.open(opts.bootstrap, f"{opts.client_id}-recovery", tps)
            for p in partitions:
                started = time.monotonic()
                result = await recover_partition(
                    reader, p, committed[p], dormant=self._dormant.pop(p, None), options=opts
                )
                async with self._lock:
                    if generation != self._generation or p not in self._pending:
                        if p in self._assigned:  # revoked and given back meanwhile
                            self._dormant[p] = result.fanout
                        return
                    consumer.seek(outbox[p], result.start)
                    consumer.resume(outbox[p])
                    self._parts[p] = result.fanout
                    # -1: commit the start once (no commit yet, or one past the log end)
                    self._committed[p] = result.start if committed[p] == result.start else -1
                    self._pending.discard(p)
                self.metrics.recovered(result.basis, result.replayed, time.monotonic() - started)
                self._recoveries[p] = result.describe()
                log.info("p%d serving from %d: %s", p, result.start, self._recoveries[p])
        except Exception:
            log.exception("recovering outbox partitions %s failed; retrying", partitions)
            await self.sleep(opts.retry_s)
        finally:
            if reader is not None:
                await reader.close()


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("fanout step failed", exc_info=task.exception())


def register(
    app: faust.App,
    options: FanoutOptions | None = None,
    *,
    registry: CollectorRegistry | None = None,
) -> Callable[..., FanoutCoordinatorService]:
    """Start a FanoutCoordinator with ``app``'s workers (``app.service``); returns the class
    (Faust instantiates it with keyword arguments only).

    Without ``options`` it reads ``Settings.load()`` and the app's broker list. ``registry``
    is where its metrics go; by default the service creates its own. (The conversation app
    subclasses the service itself, to reach the instance for ``/healthz`` and share one
    ``/metrics`` registry with the ConversationWriter.)
    """
    bootstrap = ",".join(f"{url.host}:{url.port}" for url in app.conf.broker)

    @app.service
    class FanoutCoordinator(FanoutCoordinatorService):
        """The FanoutCoordinator of the outbox partitions the group gives this worker."""

        def __init__(self, **kwargs: Any) -> None:
            opts = options or FanoutOptions.from_settings(Settings.load(), bootstrap=bootstrap)
            super().__init__(opts, registry=registry, **kwargs)

    return FanoutCoordinator
