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
(:class:`~qim.agents.mailbox.shard.OwnedShard`); then one offset commit whose metadata publishes
each shard's ``W_floor`` (bookkeeping and the floor, never the resume point); then the requests
of the fetch are answered (:func:`~qim.agents.mailbox.reads.answer`) on ``qim.to-gateway``.
On assignment the store is opened and the consumer SEEKS to ``resume_offset(W, epoch)``
(spec 10.4.2 (1), M-2). The retention sweep runs every ``sweep_interval_s``, shard by shard.

Online push (11.1.2, issue 6): the group also subscribes ``qim.presence``, so partition s of it
feeds shard s's presence cache (:mod:`~qim.agents.mailbox.presence`); presence records of a
fetch are applied before its dispatch records. After a shard's WriteBatch is written and its
W advanced, :mod:`~qim.agents.mailbox.push` plans the PushBatches and enqueues them on
``qim.to-gateway`` without waiting for acknowledgements. PRESENCE_STALE records on
user-requests invalidate cache entries; every ``reconcile_interval_s`` each ready cache is
reconciled against a full read of its partition with a group-less consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata
from mode import Service
from prometheus_client import CollectorRegistry

from qim.agents.keyring import BodyKeys, KeyTopicFollower, load_root_key, register_key_metrics
from qim.agents.mailbox.assignor import ShardAssignor
from qim.agents.mailbox.metrics import MailboxMetrics
from qim.agents.mailbox.offline_push import (
    DigestFollower,
    OfflinePush,
    OnlineChecks,
    catch_up_tasks,
    user_folds,
    with_current_badge,
)
from qim.agents.mailbox.options import MailboxOptions
from qim.agents.mailbox.presence import (
    NodePresence,
    read_partition,
    rewind,
    snapshot_of,
    stale_reports,
)
from qim.agents.mailbox.publish import plan_commit, replies_for, send_replies
from qim.agents.mailbox.push import plan_batch_pushes, send_pushes
from qim.agents.mailbox.quota import QuotaReconciler, publish_quota
from qim.agents.mailbox.reads import ReadContext
from qim.agents.mailbox.session_push import plan_session_pushes, send_session_pushes
from qim.agents.mailbox.sessions import (
    ReadMerge,
    SessionSnapshots,
    online_commands,
    send_commands,
    user_state_commands,
)
from qim.agents.mailbox.shard import OwnedShard, decode_run, encode_floor
from qim.agents.mailbox.takeover import take_over
from qim.agents.trace_lines import mailboxed as trace_mailboxed
from qim.core.mailbox import WrittenGroup
from qim.core.mailbox.sessions import SessionChange
from qim.schemas.records.dispatch import GroupDispatch, ShardLogRecord
from qim.schemas.records.notify import PushTask
from qim.schemas.records.push import ConnClosed
from qim.schemas.records.user_state import UserStateCommand
from qim.schemas.seqs import compose_mailbox_seq
from qim.streams.producer import RecoveringProducer, durable_producer, replaced_counter
from qim.streams.topics import DEVICE_TOKEN_DIGEST, KEYS, PUSH_TASKS
from qim.streams.transit import load_transit_sealer
from qim.tables.mailbox_checkpoint import create_checkpoint, ship_checkpoint
from qim.tables.mailbox_store import MailboxStore
from qim.tables.user_state_changelog import (
    CHANGED_KEY,
    PUBLISHED_KEY,
    changelog_records,
    marker_op,
    read_changelog,
    restore_ops,
    unpublished_rows,
)

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
        self.producer_replaced = replaced_counter(self.registry, "mailbox")
        self._dormant: dict[int, OwnedShard] = {}
        self._request_offsets: dict[int, int] = {}
        self._lock = asyncio.Lock()
        # the MAILBOX_BATCH / PUSH_EVENTS / preview decrypt points' keys (21.3.4)
        self.bodies = BodyKeys(
            load_root_key(), dek_cache_ttl_ms=int(options.settings.dek_cache_ttl)
        )
        self.key_follower = KeyTopicFollower(
            options.bootstrap, KEYS.name, self.bodies, client_id=f"{options.client_id}-keys"
        )
        register_key_metrics(self.registry, self.bodies, "mailbox")
        self._ctx = ReadContext(
            keys=options.cursor_keys,
            limits=options.limits,
            retry_after_ms=options.retry_after_ms,
            now_ms=lambda: int(time.time() * 1000),
            tombstone_probe=options.tombstone_probe,
            snapshots=SessionSnapshots(bodies=self.bodies),
            bodies=self.bodies,
        )
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: RecoveringProducer | None = None
        self._ucs_producer: RecoveringProducer | None = None
        """The UserConversationState changelog's (idempotent, acks=all: decision 41)."""
        self._ucs_tasks: set[asyncio.Future[bool]] = set()
        """Acknowledgement waits of changelog publishes (each advances ``ucs_published``)."""
        self._admin: AIOKafkaAdminClient | None = None
        self.presence = NodePresence()
        self._push_tasks: set[asyncio.Task[None]] = set()
        # 16.1.1 offline push: D(user) from the device_token_digest cache, PushTasks out
        self.digests = DigestFollower(
            options.bootstrap,
            DEVICE_TOKEN_DIGEST.name,
            options.settings.mailbox_shard_count,
            self.registry,
        )
        self.offline = OfflinePush(PUSH_TASKS.name, self.digests, self.registry)
        grace = int(options.settings.push_grace_window)
        self.checks = OnlineChecks(  # 16.1.2 the second check for online devices
            grace_ms=grace,
            extended_ms=int(options.settings.push_confirm_extended_window),
            tick_ms=max(10, min(250, grace // 4)),
            registry=self.registry,
        )
        self._reads = ReadMerge(options.settings.read_sync_merge_window)
        self.quota = QuotaReconciler(
            options.bootstrap, options.user_quota_topic, client_id=f"{options.client_id}-quota"
        )

    def status(self) -> dict[str, Any]:
        """For the worker's ``/mailbox`` page and the tests."""
        return {
            "group_id": self.options.group_id,
            "shard_epoch": self.options.shard_epoch,
            "serving": sorted(p for p, s in self.owned.items() if s.serving),
            "shards": {str(p): s.status() for p, s in sorted(self.owned.items())},
            "totals": dict(sorted(self.metrics.totals.items())),
            "presence": self.presence.status(),
            "device_token_digests": len(self.digests.cache),
            "second_check_pending": sum(len(c) for c in self.checks.shards.values()),
            "user_quota": self.quota.status(),
        }

    # -- lifecycle -------------------------------------------------------------------------------

    async def on_start(self) -> None:
        opts = self.options
        self._admin = AIOKafkaAdminClient(bootstrap_servers=opts.bootstrap)
        await self._admin.start()
        # replaced if its sender dies; a failed reply, push or command keeps its own handling
        # (a reply or push is at-least-once, a command costs the client a retry)
        self._producer = RecoveringProducer(
            opts.reply_producer,
            name="replies",
            idempotent=False,
            resend=False,
            on_replaced=lambda reason: self.producer_replaced.labels(
                producer="replies", reason=reason
            ).inc(),
        )
        # replies and pushes carry opened bodies: sealed for their hop to the gateway
        self._producer.seal_topics[opts.to_gateway_topic] = load_transit_sealer().seal
        await self._producer.start()
        self._ucs_producer = durable_producer(
            opts.bootstrap,
            name="ucs_changelog",
            linger_ms=2,
            client_id=f"{opts.client_id}-ucs",
            on_replaced=lambda reason: self.producer_replaced.labels(
                producer="ucs_changelog", reason=reason
            ).inc(),
        )
        await self._ucs_producer.start()
        await self.key_follower.start()  # before any shard serves a read
        self.digests.start()
        consumer = opts.consumer(ShardAssignor)
        await consumer.start()
        topics = [opts.dispatch_topic, opts.requests_topic, opts.presence_topic]
        consumer.subscribe(topics, listener=_Listener(self))
        self._consumer = consumer

    async def on_shutdown(self) -> None:
        """After the tasks are cancelled: publish what is pending, leave the group, close."""
        if self._ucs_tasks:  # the changelog's last acks advance the markers while stores are open
            await asyncio.gather(*self._ucs_tasks, return_exceptions=True)
        await self._revoked()
        if self._consumer is not None:
            await self._consumer.stop()
        for shard in self._dormant.values():
            shard.close()
        self._dormant.clear()
        if self._push_tasks:
            await asyncio.gather(*self._push_tasks, return_exceptions=True)
        await self.digests.stop()
        await self._append(self._reads.all())
        await self.quota.stop()
        await self.key_follower.stop()
        if self._producer is not None:
            await self._producer.stop()
        if self._ucs_producer is not None:
            await self._ucs_producer.stop()
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
            fetched_at = time.monotonic()
            async with self._lock:
                requests = []
                now_ms = int(time.time() * 1000)
                for tp, records in sorted(fetched.items()):
                    if tp.topic == self.options.presence_topic and records:
                        for _ in range(self.presence.apply(tp.partition, records, now_ms)):
                            self.metrics.on_record("presence", "malformed")
                for tp, records in sorted(fetched.items()):
                    if tp.topic == self.options.presence_topic:
                        continue
                    if tp.topic == self.options.dispatch_topic and records:
                        await self._fold(tp, records, fetched_at)
                    elif records:
                        requests.append((tp.partition, records))
                await self._commit()
                for partition, records in requests:
                    await self._answer(partition, records)

    @Service.task
    async def _second_check(self) -> None:
        """16.1.2: tick the owned shards' second checks; what came due is pushed like an
        offline device's task (PD-1). The node's clock drives it, never core."""
        while not self.should_stop:
            await self.sleep(self.checks.tick_ms / 1000)
            async with self._lock:
                for p, tasks in self.checks.due(int(time.time() * 1000)).items():
                    await self._send_checked(p, tasks)

    def _catch_up(
        self, p: int, closes: Sequence[ConnClosed], released: Sequence[PushTask]
    ) -> list[PushTask]:
        """16.1.2 catch-all: each closed device's (APPLIED, last_pushed_user_seq] entries
        that no held task covered (e.g. delivered to its kernel, then the app died)."""
        shard = self.owned.get(p)
        if shard is None or not closes or not len(self.digests.cache):
            return []
        out: list[PushTask] = []
        for closed in closes:
            skip = frozenset(t.event_id for t in released if t.device_id == closed.device_id)
            try:
                out += catch_up_tasks(
                    closed,
                    reader=shard.reader,
                    store=shard.store,
                    digests=self.digests.cache,
                    at_all_notify_muted=self.options.at_all_notify_muted(closed.tenant_id),
                    skip=skip,
                )
            except Exception:
                log.exception("shard %d: CONN_CLOSED catch-up of %s failed", p, closed.user_id)
        self.checks.outcomes.labels("conn_closed_range").inc(len(out))
        return out

    async def _send_checked(self, p: int, tasks: Sequence[PushTask]) -> None:
        """Second-check tasks of shard ``p`` out, badges as committed now; never raises."""
        shard = self.owned.get(p)
        if shard is None or self._producer is None or not tasks:
            return
        try:
            fresh = with_current_badge(shard.store, tasks)
            await self.offline.send(
                self._producer, fresh, mailbox_shard=p, background=self._push_tasks
            )
        except Exception:
            log.exception("shard %d: second-check push failed (the mailbox is unaffected)", p)

    @Service.task
    async def _read_flusher(self) -> None:
        """Append the MARK_READs whose ``read_sync_merge_window`` has ended."""
        while not self.should_stop:
            await self.sleep(0.25)
            async with self._lock:  # after any answer that released the same user's reads
                await self._append(self._reads.due(int(time.time() * 1000)))

    async def _append(self, commands: Sequence[UserStateCommand]) -> None:
        """User-state commands onto the shard log, materialized from there (12.9)."""
        if not commands or self._producer is None:
            return
        failed = await send_commands(self._producer, self.options.dispatch_topic, commands)
        for _ in range(len(commands) - failed):
            self.metrics.on_record("user-requests", "user_state")
        for _ in range(failed):
            self.metrics.on_record("user-requests", "failed")

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

    @Service.task
    async def _checkpointer(self) -> None:
        """19.3: every ``checkpoint_interval``, each serving shard that folded something since
        its last checkpoint is checkpointed between two WriteBatches (under the lock: hard links
        on the store's disk) and shipped to ``checkpoint_dir`` outside it (a thread)."""
        root = self.options.checkpoint_dir
        if root is None:
            return
        while not self.should_stop:
            await self.sleep(self.options.checkpoint_interval_s)
            if self.should_stop:  # the sleep ends early on stop; a shutdown ships nothing
                return
            for p in sorted(self.owned):
                try:
                    await self.checkpoint(p)
                except Exception:
                    self.metrics.on_checkpoint("failed", 0.0, 0)
                    log.exception("shard %d: checkpoint failed; retried next interval", p)

    async def checkpoint(self, p: int) -> bool:
        """Checkpoint and ship shard ``p`` now if it changed; False when there was nothing."""
        root = self.options.checkpoint_dir
        if root is None:
            return False
        started = time.monotonic()
        staging = self.options.checkpoint_staging(p)
        async with self._lock:
            shard = self.owned.get(p)
            if shard is None or not shard.serving or not isinstance(shard.store, MailboxStore):
                return False
            seq = shard.applied_seq
            restored = shard.restored_checkpoint_s is not None and seq == shard.restored_from
            if seq == 0 or seq == shard.checkpointed_seq or restored:
                return False
            await asyncio.to_thread(shutil.rmtree, staging, True)
            create_checkpoint(shard.store, staging)
        shipped = await asyncio.to_thread(
            ship_checkpoint,
            staging,
            root,
            shard=p,
            checkpoint_id=seq,
            shard_epoch=self.options.shard_epoch,
            keep=self.options.checkpoint_keep,
        )
        if self.owned.get(p) is shard:
            shard.checkpointed_seq = seq
        self.metrics.on_checkpoint("shipped", time.monotonic() - started, shipped.bytes)
        return True

    @Service.task
    async def _reconciler(self) -> None:
        """5.4.3 (2): every ``reconcile_interval_s``, each ready cache against a full read."""
        interval = self.options.reconcile_interval_s
        if interval <= 0:
            return
        reader = self.options.presence_reader()
        await reader.start()
        try:
            while not self.should_stop:
                await self.sleep(interval)
                for shard in sorted(self.presence.shards):
                    try:
                        await self._reconcile(reader, shard)
                    except Exception:
                        log.exception("presence %d: reconcile failed", shard)
        finally:
            await reader.stop()

    @Service.task
    async def _quota_reconciler(self) -> None:
        """I-26: heal the ``qim.user-quota`` records of taken-over shards (``mailbox_quota``)."""
        while not self.should_stop:
            await self.sleep(1.0)
            await self.quota.run_due(lambda p: self.owned.get(p), self._lock, self._producer)

    async def _reconcile(self, reader: AIOKafkaConsumer, shard: int) -> None:
        """Read up to what the cache applied (outside the lock), then diff under the lock; if
        the cache moved on meanwhile, read the difference first."""
        tp = TopicPartition(self.options.presence_topic, shard)
        state = self.presence.shards.get(shard)
        if state is None or not state.ready:
            return
        start = int((await reader.beginning_offsets([tp]))[tp])
        records: list[Any] = []
        read_to = start
        for _ in range(5):
            target = state.next_offset
            await read_partition(reader, tp, read_to, target, records)
            read_to = target
            async with self._lock:
                if self.presence.shards.get(shard) is not state:
                    return  # revoked or reassigned meanwhile
                if state.next_offset == target:
                    now_ms = int(time.time() * 1000)
                    report = self.presence.reconcile(shard, snapshot_of(records), now_ms)
                    if report is not None:
                        self.metrics.on_reconcile(report.presence_reconcile_diff)
                    return

    async def _fold(self, tp: TopicPartition, records: list[Any], fetched_at: float) -> None:
        """Materialize one fetched run of a shard's dispatch partition, one WriteBatch;
        ``fetched_at`` (monotonic) starts the run's lane watermark advance clock."""
        shard = self.owned.get(tp.partition)
        if shard is None:
            return
        batch, malformed = decode_run(records)
        for offset in malformed:
            log.warning("shard %d: undecodable dispatch record at %d", shard.shard, offset)
            self.metrics.on_record("dispatch", "malformed")
        if batch:
            await self.key_follower.knows(
                (r.tenant_id, blob)
                for _, r in batch
                if isinstance(r, GroupDispatch)
                for blob in (r.payload, r.preview_or_placeholder)
            )
            first, last = batch[0][0], batch[-1][0]
            crash = self.options.crash
            started = time.perf_counter()
            before = shard.applied_seq
            old_w = shard.watermarks
            shard.advance.arrived(
                compose_mailbox_seq(shard.epoch, first),
                compose_mailbox_seq(shard.epoch, last),
                fetched_at,
            )
            try:
                result = shard.materialize(batch)
                if crash.armed("committed", shard.shard, first, last):
                    await self._commit_floor(tp, last + 1, result.watermark_floor)
                    crash.crash()
                ucs_rows = shard.write(result)
                if crash.armed("written", shard.shard, first, last):
                    crash.crash()
                if ucs_rows and crash.armed("ustate", shard.shard, first, last):
                    crash.crash()
            except Exception:
                log.exception(
                    "shard %d: materialize/write failed at %d..%d", shard.shard, first, last
                )
                self.metrics.on_write_failed(shard.shard)
                self._retry_from(tp, shard)
                return
            if ucs_rows:
                await self._publish_ucs(shard, ucs_rows, result.applied_seq)
            seconds, regressed = time.perf_counter() - started, result.applied_seq < before
            newest = max(
                (r.committed_at for _, r in batch if isinstance(r, GroupDispatch)), default=0
            )
            waits = shard.advance.advanced(old_w, shard.watermarks, time.monotonic())
            self.metrics.on_batch(shard.shard, result, seconds, regressed, newest, waits)
            trace_mailboxed(log, shard.shard, shard.epoch, batch, self.options.client_id)
            for change in result.sessions:
                if change.structural_change:  # 12.8.2: paging restarts on a new revision
                    self._ctx.snapshots.invalidate(change.tenant_id, change.user_id)
            await self._push(shard, result.written, batch)
            if result.sessions and last >= shard.high_water:  # replay pushes nothing
                await self._session_push(shard, result.sessions)
            if last >= shard.high_water:
                await self._offline_push(shard, result.written, result.sessions)
            if result.sessions and self._producer is not None:  # I-26: only crossings
                await publish_quota(
                    self._producer,
                    self.options.user_quota_topic,
                    shard.store,
                    result.sessions,
                    limit=shard.config.session_list.max_conversations_per_user,
                    mailbox_shard=shard.shard,
                    as_of_mailbox_seq=compose_mailbox_seq(shard.epoch, last),
                    on_failed=lambda: self.quota.request([shard.shard]),
                )
        shard.consumed(records[-1].offset)

    # -- UserConversationState changelog (decision 41) ---------------------------------------------

    async def _publish_ucs(
        self, shard: OwnedShard, rows: Sequence[tuple[bytes, bytes | None]], seq: int
    ) -> None:
        """After the WriteBatch: the batch's ``U`` rows are handed to the producer (one send
        each) and their acknowledgements awaited off the fold, in batch order per shard, so the
        fold never waits for the broker. ``ucs_published`` advances over an unbroken
        acknowledged run only; after a failure the next batch re-publishes from the store."""
        if shard.ucs_failed:
            shard.ucs_failed = not await self._republish_ucs(shard)
            return
        records = changelog_records(rows, mailbox_shard=shard.shard, mailbox_seq=seq)
        futures = await self._hand_ucs(shard, records)
        if futures is None:
            shard.ucs_failed = True
            return
        task = asyncio.ensure_future(self._ucs_acked(shard, shard.ucs_acks, futures, seq))
        shard.ucs_acks = task
        self._ucs_tasks.add(task)
        task.add_done_callback(self._ucs_tasks.discard)

    async def _ucs_acked(
        self,
        shard: OwnedShard,
        previous: asyncio.Future[bool] | None,
        futures: Sequence[asyncio.Future[Any]],
        seq: int,
    ) -> bool:
        ok = True if previous is None else await previous
        try:
            await asyncio.gather(*futures)
        except Exception as exc:
            log.warning("shard %d: UserConversationState changelog: %r", shard.shard, exc)
            self.metrics.on_record("dispatch", "ucs_changelog_failed")
            ok = False
        if not ok:
            shard.ucs_failed = True
            return False
        try:
            shard.mark_ucs_published(seq)
        except Exception:  # the shard was closed meanwhile: the next owner re-publishes
            return False
        return True

    async def _hand_ucs(
        self, shard: OwnedShard, records: Sequence[tuple[bytes, bytes | None]]
    ) -> list[asyncio.Future[Any]] | None:
        """Hand ``records`` to the changelog producer; their futures, or None on failure."""
        producer = self._ucs_producer
        if producer is None:
            return None
        topic = self.options.ucs_changelog_topic
        try:
            return [
                await producer.send(topic, value, key=key, partition=shard.shard)
                for key, value in records
            ]
        except Exception:
            log.exception("shard %d: UserConversationState changelog send failed", shard.shard)
            self.metrics.on_record("dispatch", "ucs_changelog_failed")
            return None

    async def _republish_ucs(self, shard: OwnedShard) -> bool:
        """Re-publish every ``U`` row changed after ``ucs_published`` (a crash or a failed
        publish left them out) and wait for it; equal values again are harmless (compacted,
        latest wins). False if it failed. Publishes still waiting for their acknowledgements
        end first, so no older value of a row can land after the re-published one."""
        if shard.ucs_acks is not None and not shard.ucs_acks.done():
            await asyncio.wait([shard.ucs_acks])
        changed = shard.ucs_changed
        if changed <= shard.ucs_published:
            return True
        rows = list(unpublished_rows(shard.store, shard.ucs_published))
        records = changelog_records(rows, mailbox_shard=shard.shard, mailbox_seq=changed)
        futures = await self._hand_ucs(shard, records)
        if futures is None:
            return False
        try:
            await asyncio.gather(*futures)
        except Exception:
            log.exception("shard %d: UserConversationState re-publish failed", shard.shard)
            self.metrics.on_record("dispatch", "ucs_changelog_failed")
            return False
        shard.mark_ucs_published(changed)
        log.info("shard %d: re-published %d UserConversationState rows", shard.shard, len(rows))
        return True

    async def _restore_ucs(self, shard: OwnedShard) -> int:
        """Takeover after the log's retention: bring the ``U`` rows back from the changelog
        before the log's remaining tail is replayed on top (``apply_command`` skips what a
        restored row already reflects)."""
        rows = await read_changelog(
            self.options.bootstrap,
            self.options.ucs_changelog_topic,
            shard.shard,
            client_id=f"{self.options.client_id}-ucs-restore",
        )
        ops, newest = restore_ops(shard.store, rows)
        if ops:
            changed = max(shard.ucs_changed, newest)
            published = max(shard.ucs_published, newest)
            shard.store.apply(
                (*ops, marker_op(CHANGED_KEY, changed), marker_op(PUBLISHED_KEY, published))
            )
            shard.ucs_changed, shard.ucs_published = changed, published
        shard.ucs_restored = len(ops)
        log.info(
            "shard %d: restored %d UserConversationState rows from the changelog (%d read)",
            shard.shard, len(ops), len(rows),
        )  # fmt: skip
        return len(ops)

    async def _ucs_takeover(self, assigned: set[TopicPartition]) -> None:
        """Per owned shard: restore from the changelog when the records the store needs have
        left the dispatch log, then re-publish what a crash left unpublished."""
        consumer = self._consumer
        assert consumer is not None
        tps = [TopicPartition(self.options.dispatch_topic, p) for p in sorted(self.owned)]
        begins = await consumer.beginning_offsets(tps) if tps else {}
        for tp in tps:
            shard = self.owned[tp.partition]
            try:
                if shard.resume_at() < int(begins[tp]):
                    await self._restore_ucs(shard)
                shard.ucs_failed = not await self._republish_ucs(shard)
            except Exception:
                log.exception("shard %d: UserConversationState takeover step failed", tp.partition)

    async def _session_push(self, shard: OwnedShard, changes: Sequence[SessionChange]) -> None:
        """SESSION_DELTA / BADGE_UPDATE / READ_SYNC after the WriteBatch; never raises."""
        if self._producer is None:
            return
        try:
            pushes = plan_session_pushes(
                shard.store,
                changes,
                presence=self.presence.cache(shard.shard),
                mailbox_shard=shard.shard,
                now_ms=int(time.time() * 1000),
                bodies=self.bodies,
            )
            topic = self.options.to_gateway_topic
            await send_session_pushes(self._producer, topic, pushes, self._push_tasks)
        except Exception:
            log.exception("shard %d: session push failed (the mailbox is unaffected)", shard.shard)

    async def _offline_push(
        self,
        shard: OwnedShard,
        written: Sequence[WrittenGroup],
        sessions: Sequence[SessionChange],
    ) -> None:
        """16.1.1 after the WriteBatch: PushTasks for offline devices; never raises."""
        if self._producer is None or not (written or sessions) or not len(self.digests.cache):
            return
        try:
            folds = user_folds(
                written,
                sessions,
                reader=shard.reader,
                store=shard.store,
                push_from_offset=shard.high_water,
                wakeable=lambda t, u: bool(self.digests.cache.devices(t, u)),
                at_all_notify_muted=self.options.at_all_notify_muted,
            )
            now_ms = int(time.time() * 1000)
            tasks, held = self.offline.plan(folds, self.presence.cache(shard.shard), now_ms)
            await self.offline.send(
                self._producer, tasks, mailbox_shard=shard.shard, background=self._push_tasks
            )
            self.checks.hold(shard.shard, held, now_ms)  # online devices: 16.1.2
        except Exception:
            log.exception("shard %d: offline push failed (the mailbox is unaffected)", shard.shard)

    async def _push(
        self,
        shard: OwnedShard,
        written: Sequence[WrittenGroup],
        batch: Sequence[tuple[int, ShardLogRecord]],
    ) -> None:
        """11.1.2 step after the WriteBatch: plan and enqueue; never raises into the fold."""
        if not written or self._producer is None:
            return
        try:
            outcome = plan_batch_pushes(
                written,
                batch,
                reader=shard.reader,
                mailbox_shard=shard.shard,
                shard_epoch=shard.epoch,
                push_from_offset=shard.high_water,
                presence=self.presence.cache(shard.shard),
                now_ms=int(time.time() * 1000),
                bodies=self.bodies,
            )
            self.metrics.on_push(outcome)
            await send_pushes(
                self._producer,
                self.options.to_gateway_topic,
                outcome.plans,
                on_done=self.metrics.on_push_acked,
                tasks=self._push_tasks,
            )
        except Exception:
            log.exception("shard %d: push step failed (the mailbox is unaffected)", shard.shard)
            self.metrics.on_push_acked(0, 1)

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
        now_ms = int(time.time() * 1000)
        for stale in stale_reports(records):
            self.metrics.on_presence_stale(self.presence.invalidate(stale, now_ms))
        released, closes = self.checks.apply(
            partition, records, self.presence.cache(partition), now_ms
        )
        await self._send_checked(partition, released + self._catch_up(partition, closes, released))
        commands = user_state_commands(records, partition, now_ms)
        await self._append(self._reads.add(commands, now_ms))
        replies = replies_for(
            self.owned.get(partition), partition, records, self._ctx, self.metrics
        )
        await send_replies(self._producer, self.options.to_gateway_topic, replies)
        await self._append(online_commands(replies, now_ms))  # 10.2.3: a login is activity

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
            self.presence.clear()
            self.checks.clear()

    async def _assigned(self, assigned: set[TopicPartition]) -> None:
        """Open the stores and seek (:func:`~qim.agents.mailbox.takeover.take_over`)."""
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
                on_restore=lambda _p, _s: self.metrics.on_restore(),
            )
            await self._ucs_takeover(assigned)
            self.quota.request(self.owned)  # I-26: heal a crossing lost by the previous owner
            self.checks.assign(self.owned, int(time.time() * 1000))
            presence = sorted(tp for tp in assigned if tp.topic == self.options.presence_topic)
            try:
                self.presence.assign(await rewind(consumer, presence))
            except Exception:  # no cache -> no push until the next assignment; mailbox unaffected
                log.exception("presence partitions could not be rewound; pushes are off")
                self.presence.assign({})
        log.info(
            "mailbox shards assigned in %.2f s: %s", time.monotonic() - started, sorted(self.owned)
        )
