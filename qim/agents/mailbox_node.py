"""MailboxNode: the owner of each MailboxShard, as a ``mode.Service`` of the mailbox app.

Ownership (direction.md 4.1): the service is a member of the consumer group
``qim-mailbox-nodes`` on the dispatch log and on user-requests; the :class:`ShardAssignor` gives
partition s of both topics to one member, and owning dispatch partition s *is* owning
MailboxShard s. Its session (``shard_lease_ttl``) is the lease.

Why user-requests rides the same group subscription instead of a second, manually assigned
consumer: one assignment, one generation -- the eager revoke stops reads and materialization of
a shard at the same instant, so a node never answers for a shard it no longer owns, and no
second ownership bookkeeping exists to drift. The group also commits the request offsets, so a
new owner continues where the previous one stopped instead of dropping the requests queued
during the handover. And one fetch loop orders "materialize, publish, then answer" per fetch.

Per fetch: dispatch records of each owned shard -> ``materialize`` -> ONE WriteBatch
(:class:`~qim.agents.mailbox_shard.OwnedShard`); then one offset commit whose metadata publishes
each shard's ``W_floor`` (bookkeeping and the floor, never the resume point); then the requests
of the fetch are answered (:func:`~qim.agents.mailbox_reads.answer`) on ``qim.to-gateway``.
On assignment the store is opened and the consumer SEEKS to ``resume_offset(W, epoch)``
(spec 10.4.2 (1), M-2). The retention sweep runs every ``sweep_interval_s``, shard by shard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata
from mode import Service
from prometheus_client import CollectorRegistry

from qim.agents.mailbox_assignor import ShardAssignor
from qim.agents.mailbox_metrics import MailboxMetrics
from qim.agents.mailbox_options import MailboxOptions
from qim.agents.mailbox_publish import plan_commit, replies_for, send_replies
from qim.agents.mailbox_reads import ReadContext
from qim.agents.mailbox_shard import OwnedShard, decode_run, encode_floor
from qim.agents.mailbox_takeover import take_over
from qim.schemas.records.dispatch import GroupDispatch

__all__ = ["MailboxNodeService"]

log = logging.getLogger(__name__)

_RETRY_S = 1.0


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped
    def __init__(self, service: MailboxNodeService) -> None:
        self._service = service

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._service._revoked()

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._service._assigned(set(assigned))


class MailboxNodeService(Service):
    """The MailboxNode of the shards this worker owns (see the module docstring)."""

    def __init__(self, options: MailboxOptions, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.options = options
        self.registry = CollectorRegistry()
        self.owned: dict[int, OwnedShard] = {}
        self.metrics = MailboxMetrics(self.registry, lambda: self.owned)
        self._dormant: dict[int, OwnedShard] = {}
        self._request_offsets: dict[int, int] = {}
        self._lock = asyncio.Lock()
        self._ctx = ReadContext(
            keys=options.cursor_keys,
            limits=options.limits,
            retry_after_ms=options.retry_after_ms,
            now_ms=lambda: int(time.time() * 1000),
        )
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._admin: AIOKafkaAdminClient | None = None

    def status(self) -> dict[str, Any]:
        """For the worker's ``/mailbox`` page and the tests."""
        return {
            "group_id": self.options.group_id,
            "shard_epoch": self.options.shard_epoch,
            "serving": sorted(p for p, s in self.owned.items() if s.serving),
            "shards": {str(p): s.status() for p, s in sorted(self.owned.items())},
            "totals": dict(sorted(self.metrics.totals.items())),
        }

    # -- lifecycle -------------------------------------------------------------------------------

    async def on_start(self) -> None:
        opts = self.options
        self._admin = AIOKafkaAdminClient(bootstrap_servers=opts.bootstrap)
        await self._admin.start()
        self._producer = opts.reply_producer()
        await self._producer.start()
        consumer = opts.consumer(ShardAssignor)
        await consumer.start()
        consumer.subscribe([opts.dispatch_topic, opts.requests_topic], listener=_Listener(self))
        self._consumer = consumer

    async def on_shutdown(self) -> None:
        """After the tasks are cancelled: publish what is pending, leave the group, close."""
        await self._revoked()
        if self._consumer is not None:
            await self._consumer.stop()
        for shard in self._dormant.values():
            shard.close()
        self._dormant.clear()
        if self._producer is not None:
            await self._producer.stop()
        if self._admin is not None:
            await self._admin.close()

    # -- the loop --------------------------------------------------------------------------------

    @Service.task
    async def _serve(self) -> None:
        while not self.should_stop:
            consumer = self._consumer
            if consumer is None:
                await self.sleep(0.1)
                continue
            try:
                fetched = await consumer.getmany(
                    timeout_ms=500, max_records=self.options.max_records
                )
            except Exception:
                log.exception("mailbox fetch failed; retrying")
                await self.sleep(_RETRY_S)
                continue
            async with self._lock:
                requests = []
                for tp, records in sorted(fetched.items()):
                    if tp.topic == self.options.dispatch_topic and records:
                        await self._fold(tp, records)
                    elif records:
                        requests.append((tp.partition, records))
                await self._commit()
                for partition, records in requests:
                    await self._answer(partition, records)

    @Service.task
    async def _sweeper(self) -> None:
        while not self.should_stop:
            await self.sleep(self.options.sweep_interval_s)
            for p in sorted(self.owned):
                async with self._lock:
                    shard = self.owned.get(p)
                    if shard is not None and shard.serving:
                        result = shard.sweep(int(time.time() * 1000))
                        self.metrics.on_sweep(result.metrics)

    async def _fold(self, tp: TopicPartition, records: list[Any]) -> None:
        """Materialize one fetched run of a shard's dispatch partition, one WriteBatch."""
        shard = self.owned.get(tp.partition)
        if shard is None:
            return
        batch, malformed = decode_run(records)
        for offset in malformed:
            log.warning("shard %d: undecodable dispatch record at %d", shard.shard, offset)
            self.metrics.on_record("dispatch", "malformed")
        if batch:
            first, last = batch[0][0], batch[-1][0]
            crash = self.options.crash
            started = time.perf_counter()
            before = shard.applied_seq
            try:
                result = shard.materialize(batch)
                if crash.armed("committed", shard.shard, first, last):
                    await self._commit_floor(tp, last + 1, result.watermark_floor)
                    crash.crash()
                shard.write(result)
                if crash.armed("written", shard.shard, first, last):
                    crash.crash()
            except Exception:
                log.exception(
                    "shard %d: materialize/write failed at %d..%d", shard.shard, first, last
                )
                self.metrics.on_write_failed(shard.shard)
                self._retry_from(tp, shard)
                return
            seconds, regressed = time.perf_counter() - started, result.applied_seq < before
            newest = max(
                (r.committed_at for _, r in batch if isinstance(r, GroupDispatch)), default=0
            )
            self.metrics.on_batch(shard.shard, result, seconds, regressed, newest)
        shard.consumed(records[-1].offset)

    def _retry_from(self, tp: TopicPartition, shard: OwnedShard) -> None:
        """After a failed fold: nothing was written; read again from W after a pause."""
        consumer = self._consumer
        assert consumer is not None
        shard.slice_cache = type(shard.slice_cache)()
        consumer.seek(tp, shard.resume_at())
        consumer.pause(tp)

        def resume() -> None:
            if tp in consumer.assignment():
                consumer.resume(tp)

        asyncio.get_running_loop().call_later(_RETRY_S, resume)

    async def _commit_floor(self, tp: TopicPartition, offset: int, floor: Any) -> None:
        assert self._consumer is not None
        metadata = encode_floor(self.options.shard_epoch, floor)
        await self._consumer.commit({tp: OffsetAndMetadata(offset, metadata)})

    async def _commit(self) -> None:
        """Bookkeeping offsets, and each shard's floor in the dispatch commit's metadata."""
        consumer, opts = self._consumer, self.options
        if consumer is None:
            return
        plan = plan_commit(
            self.owned,
            self._request_offsets,
            assigned=consumer.assignment(),
            shard_epoch=opts.shard_epoch,
            dispatch_topic=opts.dispatch_topic,
            requests_topic=opts.requests_topic,
        )
        if not plan.offsets:
            return
        try:
            await consumer.commit(plan.offsets)
        except KafkaError as exc:  # a rebalance is coming: the floor stays unpublished
            log.warning("mailbox offset commit failed: %s", exc)
            return
        for p, floor in plan.floors.items():
            self.owned[p].mark_published(floor)
            self.owned[p].dirty = False
        self._request_offsets.clear()

    async def _answer(self, partition: int, records: list[Any]) -> None:
        assert self._producer is not None
        self._request_offsets[partition] = records[-1].offset + 1
        replies = replies_for(
            self.owned.get(partition), partition, records, self._ctx, self.metrics
        )
        await send_replies(self._producer, self.options.to_gateway_topic, replies)

    # -- rebalance -------------------------------------------------------------------------------

    async def _revoked(self) -> None:
        async with self._lock:
            with contextlib.suppress(Exception):
                await self._commit()
            for p, shard in self.owned.items():
                shard.serving = False
                self._dormant[p] = shard
            self.owned.clear()
            self._request_offsets.clear()

    async def _assigned(self, assigned: set[TopicPartition]) -> None:
        """Open the stores and seek (:func:`~qim.agents.mailbox_takeover.take_over`)."""
        consumer, admin = self._consumer, self._admin
        assert consumer is not None and admin is not None
        started = time.monotonic()
        async with self._lock:
            self.owned = await take_over(
                assigned,
                options=self.options,
                consumer=consumer,
                admin=admin,
                dormant=self._dormant,
            )
        log.info(
            "mailbox shards assigned in %.2f s: %s", time.monotonic() - started, sorted(self.owned)
        )
