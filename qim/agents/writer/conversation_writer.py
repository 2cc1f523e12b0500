"""ConversationWriter: the single writer of each conversation partition, as a ``mode.Service``.

Ownership (direction.md 4.1, 4.6): the service is a member of the consumer group
``qim-conversation-writers`` on ``qim.conversation-requests``; the partitions the group assigns
it are the conversation partitions it writes, and its session (``shard_lease_ttl``) is the lease.
Fencing is Kafka's: each partition p has a transactional producer with ``transactional_id =
qim-conversation-writer-<p>``, whose start fences any former owner of p (``writer_restore``).
Recovery is from the log: newest checkpoint, then the outbox after it.

Lifecycle of a partition:

* **assigned** -> paused, and a restore task fences, restores and replays it, then seeks the
  request consumer to the group's committed offset (read after the fence, so it includes the
  former owner's last committed transaction) and resumes it: **serving**.
* **serving** -> every fetch of its requests is one transaction (``writer_txn``); the request
  offsets commit inside it (``send_offsets_to_transaction``), so auto-commit is off. Pipelined
  per partition: a fetch pauses each partition it returned records for and runs its
  transaction as a task while the loop keeps fetching the others; the task resumes the
  partition when done, if the same ``OwnedPartition`` still serves it (a give-up or a revocation
  leaves the resume to the restore). So one transaction at a time per partition, in log order,
  and no partition waits for another's commit. The request offsets join the transaction
  while its produce acknowledgements are awaited (``early_offsets``, bench/README.md round 5).
  With ``linger_ms`` (``QIM_WRITER_LINGER_MS``) the first fetch of a resumed partition opens a
  *gather* instead: the partition keeps fetching, later records join it, and after
  ``linger_ms`` (or at ``min_batch`` requests) it pauses and runs as one transaction -- fewer
  transactions at low rates, where each carries one request otherwise (bench/README.md
  round 4).
* a failed transaction -> the state is dropped (it may be ahead of the log) and the partition is
  restored again; after ProducerFenced only once a session timeout passed without the group
  taking the partition away (a fenced member is about to be revoked). The restore starts a new
  transactional producer, whose InitProducerId fences every older one of the same
  ``transactional_id`` -- so a producer a broker restart left unusable (a sequence gap, a
  transaction the coordinator aborted) is replaced this way, the requests are read again from
  the committed offset (nothing is re-sent by hand), and fencing holds as at any takeover.
  Counted as ``qim_conversation_producer_replaced_total{producer="writer", reason}``.
* **revoked** (aiokafka rebalances eagerly: every rebalance revokes everything) -> the producer
  stops, the state is kept *dormant*; if the partition comes back it only replays what others
  committed meanwhile, otherwise it is closed.

Why a Service on the Faust app (``app.service``) and not an ``@app.task``: a Service has a start
and a shutdown hook, so a stopping worker leaves the group at once (the next owner takes over
without waiting for the session to expire) and closes its producers and RocksDB handles; a task
is only cancelled. It runs its own aiokafka consumer, not a Faust agent: Faust's group, commit
and ``exactly_once`` machinery would sit between the transaction and the offsets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import IllegalStateError, ProducerFenced
from mode import Service
from prometheus_client import CollectorRegistry

from qim.agents.keyring import BodyKeys, KeyTopicFollower, load_root_key, register_key_metrics
from qim.agents.writer.lease import HeartbeatLease
from qim.agents.writer.metrics import WriterMetrics
from qim.agents.writer.options import WriterOptions, describe_topics
from qim.agents.writer.partition import PartitionWriter
from qim.agents.writer.requests import RequestContext, connection_shards
from qim.agents.writer.restore import restore_partition
from qim.agents.writer.txn import OwnedPartition, SelfFencedError, Topics
from qim.agents.writer.user_quota import UserQuotaFollower
from qim.core.conversation import WriterFencedError
from qim.core.transient import TypingGate
from qim.schemas.routing import connection_shard_id, user_bucket
from qim.streams import txn_retries
from qim.streams.fetching import hot_fetch
from qim.streams.producer import RecoveringProducer, durable_producer, replaced_counter
from qim.streams.topics import KEYS
from qim.streams.transit import load_transit_sealer
from qim.tables.message_store import MessageStore

__all__ = ["ConversationWriterService"]

log = logging.getLogger(__name__)

_RETRY_S = 1.0


class _Gather:
    """A partition's fetched requests waiting for its next transaction (``linger_ms``)."""

    def __init__(self, owned: OwnedPartition, records: list[Any], min_batch: int) -> None:
        self.owned = owned
        self.records = records
        self.min_batch = min_batch
        self.open = True
        self.full = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self._check()

    def add(self, records: list[Any]) -> None:
        self.records.extend(records)
        self._check()

    def _check(self) -> None:
        if len(self.records) >= self.min_batch:
            self.full.set()


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped
    def __init__(self, service: ConversationWriterService) -> None:
        self._service = service

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._service._revoked()

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._service._assigned_partitions({tp.partition for tp in assigned})


class ConversationWriterService(Service):
    """The ConversationWriter of the partitions this worker owns (see the module docstring)."""

    def __init__(
        self, options: WriterOptions, registry: CollectorRegistry | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.options = options
        self.registry = registry if registry is not None else CollectorRegistry()
        self.lease = HeartbeatLease(options.self_fence_deadline_ms)
        self.counters: dict[str, int] = dict.fromkeys(
            ("fenced", "failed", "restores", "self_fenced"), 0
        )
        self.takeover_ms: dict[int, float] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self._topics: Topics | None = None
        self._ctx: RequestContext | None = None
        self._assigned: set[int] = set()
        self._owned: dict[int, OwnedPartition] = {}
        self._dormant: dict[int, PartitionWriter] = {}
        self._restoring: dict[int, asyncio.Task[None]] = {}
        self._inflight: dict[int, asyncio.Task[None]] = {}
        self._gathering: dict[int, _Gather] = {}
        self._semaphore = asyncio.Semaphore(options.restore_concurrency)
        self._assigned_at = 0.0
        self.metrics = WriterMetrics(self.registry, self.status)
        self.producer_replaced = replaced_counter(self.registry, "conversation")
        self._replies: RecoveringProducer | None = None
        self.quota = UserQuotaFollower(
            options.bootstrap, options.user_quota_topic, options.mailbox_shard_count
        )
        """The users at ``max_conversations_per_user`` (``writer_requests._check_quota``)."""
        self.keys = BodyKeys(load_root_key(), dek_cache_ttl_ms=int(options.settings.dek_cache_ttl))
        """The encrypt point and the HISTORY_BATCH decrypt point (``writer_sealing``)."""
        self.key_follower = KeyTopicFollower(
            options.bootstrap,
            KEYS.name,
            self.keys,
            client_id=f"{options.client_id}-keys",
            create=True,
        )
        register_key_metrics(self.registry, self.keys, "conversation")

    # -- status ----------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """For the worker's ``/writer`` page and the tests: what is owned and in what state."""
        return {
            "assigned": sorted(self._assigned),
            "serving": sorted(self._owned),
            "restoring": sorted(self._restoring),
            "lease_valid": self.lease.valid(),
            "lease_lapses": self.lease.lapses,
            "committed_transactions": sum(o.committed for o in self._owned.values()),
            "takeover_ms": {str(p): round(ms) for p, ms in sorted(self.takeover_ms.items())},
            "quota_records": self.quota.records,
            "quota_exhausted": len(self.quota.exhausted),
            **self.counters,
        }

    # -- lifecycle -------------------------------------------------------------------------------

    def _concurrent_transactions(self, transactional_id: str, kind: str) -> None:
        """A CONCURRENT_TRANSACTIONS answer to one of this process's producers
        (``qim.streams.txn_retries``): counted when the producer is one of the writer's."""
        if transactional_id.startswith(f"{self.options.transactional_id_prefix}-"):
            self.metrics.concurrent_transactions.labels(kind).inc()

    async def on_start(self) -> None:
        opts = self.options
        txn_retries.add_listener(self._concurrent_transactions)
        if opts.txn_retry_backoff_ms is not None:
            txn_retries.set_retry_backoff_ms(opts.txn_retry_backoff_ms)
        self._topics, partitions = await describe_topics(opts)
        # Replies leave after their transaction commits, all partitions through one producer
        # (txn.OwnedPartition._reply): a resend after a replacement is a duplicate reply at
        # worst, which the gateway drops (its request is no longer pending).
        self._replies = durable_producer(
            opts.bootstrap,
            name="replies",
            linger_ms=1,
            client_id=f"{opts.client_id}-replies",
            on_replaced=lambda reason: self.producer_replaced.labels(
                producer="replies", reason=reason
            ).inc(),
        )
        # replies leave the decrypt point with bodies in clear: sealed for their hop to the
        # gateway (qim.streams.transit)
        self._replies.seal_topics[self._topics.to_gateway] = load_transit_sealer().seal
        await self._replies.start()
        await self.quota.start()
        await self.key_follower.start()
        self._ctx = RequestContext(
            config=opts.config,
            partition_count=partitions,
            max_members=opts.max_members,
            e2ee_max_members=opts.e2ee_max_members,
            member_limits=opts.member_limits,
            exhausted=self.quota.exhausted,
            on_quota_refused=self.metrics.on_quota_refused,
            typing=opts.typing_rules,
            typing_gate=TypingGate(opts.typing_rules.merge_window_ms),
            connection_shard_of=connection_shards(
                opts.virtual_bucket_count, self._topics.to_gateway_partitions
            ),
            on_typing=self.metrics.on_typing,
            on_send_limited=self.metrics.on_send_limited,
            keys=self.keys,
            ensure_keys=self.key_follower.ensure_conversation_keys,
            on_policy_switch=self.metrics.on_policy_switch,
        )
        consumer = AIOKafkaConsumer(
            bootstrap_servers=opts.bootstrap,
            group_id=opts.group_id,
            client_id=opts.client_id,
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=opts.session_timeout_ms,
            heartbeat_interval_ms=opts.heartbeat_interval_ms,
            metadata_max_age_ms=5000,
            # a ListOffsets/OffsetFetch queues behind a long-polling fetch on its connection
            **hot_fetch(),
        )
        await consumer.start()
        self.lease.install(consumer)
        consumer.subscribe([opts.requests_topic], listener=_Listener(self))
        self._consumer = consumer

    async def on_shutdown(self) -> None:
        """After the loop is cancelled: drop every partition, then leave the group."""
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()  # as the loop's own cancellation did when it gathered them
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._revoked()
        for writer in self._dormant.values():
            writer.close()
        self._dormant.clear()
        if self._consumer is not None:
            await self._consumer.stop()
        if self._replies is not None:
            await self._replies.stop()
        await self.quota.stop()
        txn_retries.remove_listener(self._concurrent_transactions)
        await self.key_follower.stop()

    def _connection_shard(self, tenant_id: str, user_id: str) -> int:
        """A user's ConnectionShard (spec 5.2), where its REACTION_UPDATEs go."""
        settings = self.options.settings
        bucket = user_bucket(tenant_id, user_id, settings.virtual_bucket_count)
        return connection_shard_id(bucket, settings.connection_shard_count)

    # -- the loop --------------------------------------------------------------------------------

    @Service.task
    async def _flush_reactions(self) -> None:
        """Every 50 ms, push the reaction merge windows that ended (``OwnedPartition``)."""
        while not self.should_stop:
            await self.sleep(0.05)
            for owned in list(self._owned.values()):
                try:
                    await owned.flush_reactions()
                except Exception:
                    log.exception("p%d: reaction pushes failed", owned.partition)

    @Service.task
    async def _serve(self) -> None:
        opts = self.options
        while not self.should_stop:
            consumer = self._consumer
            if consumer is None:
                await self.sleep(0.1)
                continue
            try:
                fetched = await consumer.getmany(timeout_ms=500, max_records=opts.max_records)
            except Exception:
                log.exception("conversation-requests fetch failed; retrying")
                await self.sleep(_RETRY_S)
                continue
            batches = {tp: records for tp, records in fetched.items() if records}
            if not batches:
                continue
            if not self.lease.valid():
                self.counters["self_fenced"] += 1
                for tp, records in batches.items():
                    with contextlib.suppress(IllegalStateError, AssertionError):  # revoked
                        consumer.seek(tp, records[0].offset)
                await self.sleep(0.2)
                continue
            for tp, records in batches.items():
                self._dispatch(tp, records)

    def _dispatch(self, tp: TopicPartition, records: list[Any]) -> None:
        """Start ``records``' transaction, or gather them for it (``linger_ms``)."""
        p = tp.partition
        owned = self._owned.get(p)
        gather = self._gathering.get(p)
        if gather is not None and gather.open:
            if gather.owned is owned:
                gather.add(records)
                return
            if gather.task is not None:  # a former owner's: the restore sought back
                gather.task.cancel()
            del self._gathering[p]
        linger = self.options.linger_ms
        fresh: _Gather | None = None
        if owned is None or linger <= 0:
            self._pause(p)  # until its transaction is done: one at a time
            coro = self._process(tp, records)
        else:
            fresh = _Gather(owned, list(records), self.options.min_batch)
            self._gathering[p] = fresh
            coro = self._linger(tp, fresh, linger / 1000)
        task = asyncio.create_task(coro, name=f"txn-p{p}")
        if fresh is not None:
            fresh.task = task
        self._inflight[p] = task
        task.add_done_callback(self._finished)

    async def _linger(self, tp: TopicPartition, gather: _Gather, linger_s: float) -> None:
        """Gather for ``linger_s`` (or ``min_batch`` records), then run them as one transaction.

        Closing the gather and pausing the partition happen in one step, so no fetched record
        can fall between this transaction and the next gather."""
        p = tp.partition
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(gather.full.wait(), linger_s)
        finally:
            gather.open = False
            if self._gathering.get(p) is gather:
                del self._gathering[p]
        if self._owned.get(p) is not gather.owned:
            return  # given up or revoked meanwhile: the restore seeks back and resumes
        self._pause(p)
        await self._process(tp, gather.records, gather.owned)

    def _finished(self, task: asyncio.Task[None]) -> None:
        for p, t in list(self._inflight.items()):
            if t is task:
                del self._inflight[p]
        if not task.cancelled() and task.exception() is not None:
            log.error("transaction task failed", exc_info=task.exception())

    async def _process(
        self, tp: TopicPartition, records: list[Any], owned: OwnedPartition | None = None
    ) -> None:
        owned = owned if owned is not None else self._owned.get(tp.partition)
        if owned is None:
            return  # not serving (restoring, failed): the restore seeks back to the commit
        async with owned.lock:
            if self._owned.get(tp.partition) is not owned:
                return
            try:
                await owned.process(records)
            except (ProducerFenced, WriterFencedError) as exc:
                log.warning("p%d fenced: %s; waiting for the group to reassign", tp.partition, exc)
                self.counters["fenced"] += 1
                self._replaced(exc)
                await self._give_up(owned, delay=self.options.session_timeout_ms / 1000)
            except SelfFencedError as exc:
                log.warning("p%d: %s; transaction aborted", tp.partition, exc)
                self.counters["self_fenced"] += 1
                await self._give_up(owned, delay=_RETRY_S)
            except Exception as exc:
                log.exception("p%d: transaction failed; restoring the partition", tp.partition)
                self.counters["failed"] += 1
                self._replaced(exc)
                await self._give_up(owned, delay=_RETRY_S)
        if self._owned.get(tp.partition) is owned and not self.should_stop:
            self._resume(tp.partition)  # else given up or revoked: the restore resumes it

    def _replaced(self, exc: BaseException) -> None:
        """A transaction failed: its producer is closed, the restore makes a fenced new one."""
        if isinstance(exc, WriterFencedError):
            return  # the log's fencing epoch, not the producer
        reason = type(exc).__name__
        log.warning("Kafka producer unusable (%s): the partition's restore replaces it", reason)
        self.producer_replaced.labels(producer="writer", reason=reason).inc()

    async def _give_up(self, owned: OwnedPartition, *, delay: float) -> None:
        """Stop serving a partition whose in-memory state may be ahead of the log."""
        p = owned.partition
        self._owned.pop(p, None)
        self._pause(p)
        await owned.close()
        owned.writer.close()
        if p in self._assigned:
            self._schedule_restore(p, delay)

    # -- rebalance -------------------------------------------------------------------------------

    async def _revoked(self) -> None:
        for task in list(self._restoring.values()):
            task.cancel()
        for task in list(self._restoring.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._restoring.clear()
        for p, owned in list(self._owned.items()):
            async with owned.lock:
                if self._owned.get(p) is not owned:
                    continue  # given up while we waited: its state is gone
                await owned.close()
                del self._owned[p]  # a transaction task still queued on the lock must see it gone
            self._dormant[p] = owned.writer
        self._owned.clear()
        self._assigned = set()

    async def _assigned_partitions(self, partitions: set[int]) -> None:
        self._assigned = partitions
        self._assigned_at = time.monotonic()
        self.lease.renew()
        for p in partitions:
            self._pause(p)
        for p in [p for p in self._dormant if p not in partitions]:
            self._dormant.pop(p).close()
        log.info("assigned conversation partitions %s", sorted(partitions))
        for p in sorted(partitions):
            self._schedule_restore(p, 0.0)

    def _pause(self, partition: int) -> None:
        consumer = self._consumer
        tp = TopicPartition(self.options.requests_topic, partition)
        if consumer is not None and tp in consumer.assignment():
            consumer.pause(tp)

    def _resume(self, partition: int) -> None:
        consumer = self._consumer
        tp = TopicPartition(self.options.requests_topic, partition)
        if consumer is not None and tp in consumer.assignment():
            consumer.resume(tp)

    def _schedule_restore(self, partition: int, delay: float) -> None:
        previous = self._restoring.get(partition)
        if previous is not None and not previous.done():
            return
        task = asyncio.create_task(self._restore(partition, delay), name=f"restore-p{partition}")
        self._restoring[partition] = task

    async def _restore(self, p: int, delay: float) -> None:
        opts, consumer = self.options, self._consumer
        assert consumer is not None and self._topics is not None and self._ctx is not None
        owned: OwnedPartition | None = None
        dormant: PartitionWriter | None = None
        try:
            if delay:
                await asyncio.sleep(delay)
            async with self._semaphore:
                await self.lease.wait_valid()  # a zombie must not fence the real owner
                dormant = self._dormant.pop(p, None)
                result = await restore_partition(
                    p,
                    bootstrap=opts.bootstrap,
                    outbox_topic=opts.outbox_topic,
                    snapshots_topic=opts.snapshots_topic,
                    store_path=opts.store_path(p),
                    open_store=lambda path: MessageStore(path, opts.store_caps),
                    dormant=dormant,
                    config=opts.config,
                    region_id=opts.region_id,
                    mailbox_shard_count=opts.mailbox_shard_count,
                    transactional_id=opts.transactional_id(p),
                    transaction_timeout_ms=opts.transaction_timeout_ms,
                    client_id=f"{opts.client_id}-p{p}",
                )
            dormant = None
            await self.key_follower.catch_up()  # every key the former owner made is folded
            owned = OwnedPartition(
                result.writer,
                result.producer,
                topics=self._topics,
                group_id=opts.group_id,
                ctx=self._ctx,
                checkpoint_every=opts.checkpoint_every,
                checkpoint_interval_s=opts.checkpoint_interval_s,
                lease_valid=self.lease.valid,
                crash=opts.crash,
                metrics=self.metrics,
                reply_producer=self._replies,
                reaction_merge_window_ms=opts.settings.reaction_push_merge_window,
                connection_shard=self._connection_shard,
                early_offsets=opts.early_offsets,
            )
            tp = TopicPartition(opts.requests_topic, p)
            committed = await consumer.committed(tp)
            if committed is None:
                committed = (await consumer.beginning_offsets([tp]))[tp]
            consumer.seek(tp, committed)
            self._owned[p] = owned
            consumer.resume(tp)
            self.counters["restores"] += 1
            self.takeover_ms[p] = (time.monotonic() - self._assigned_at) * 1000
            log.info(
                "p%d serving: epoch %d, checkpoint at %s, read %d outbox records, requests from %d",
                p, result.writer.state.fencing_epoch, result.writer.checkpoint_offset, result.read,
                committed,
            )  # fmt: skip
        except asyncio.CancelledError:
            await self._discard(p, owned, dormant)
            raise
        except Exception:
            log.exception("p%d: restore failed; retrying", p)
            await self._discard(p, owned, dormant)
            if p in self._assigned:
                self._restoring.pop(p, None)
                self._schedule_restore(p, _RETRY_S)
        finally:
            if self._restoring.get(p) is asyncio.current_task():
                del self._restoring[p]

    async def _discard(
        self, p: int, owned: OwnedPartition | None, dormant: PartitionWriter | None
    ) -> None:
        if owned is not None and self._owned.get(p) is not owned:
            await owned.close()
            self._dormant[p] = owned.writer
        elif dormant is not None and not dormant.closed:
            self._dormant[p] = dormant  # replay only ever applies committed records
