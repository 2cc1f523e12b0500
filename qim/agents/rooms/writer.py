"""RoomWriter: owns rooms by partition through Kafka's group protocol (spec 14.1, 5.1).

Ownership: group ``qim-room-writers`` on ``qim.room-requests``; the partitions the group gives
this worker are the rooms it writes (``room_partition``), the session (``shard_lease_ttl``) is
the lease, and the self-fence of the ConversationWriter applies (``HeartbeatLease``: no
successful heartbeat for ``writer_self_fence_deadline`` -> nothing is written until heartbeats
are back or the group has moved the partition).

**Not transactional, and why that is safe here.** A ConversationWriter's commit is a
mailbox-bound fact, so it is fenced by Kafka transactions. Rooms are best-effort by design
(14.3: "chatrooms may lose messages"; I-28: the room log is the only persisted data the design
allows to lose) and never feed a mailbox, history or a session list, so nothing downstream can
be corrupted by a duplicate or a loss. What could go wrong and what bounds it:

* a zombie owner (evicted, still running) writes room_seqs the new owner also allocates: the
  new owner starts each room at a **new ``room_epoch``** (its last epoch in the retained Room
  Log + 1), the self-fence stops the old one within the deadline, and ConnectionNodes drop
  broadcasts of an older epoch than they have seen (``merge.RoomMerge``);
* requests are at-least-once (offsets commit after the fetch's records are acknowledged): a
  send processed twice across a takeover is broadcast twice (the ``client_message_id`` dedup
  lives in the ring, which a takeover does not restore) -- the SDK drops an event whose
  ``message_id`` it already holds;
* a JOIN answered by the old owner whose shard registration died with it: the gateway renews
  every registration every ``room_target_renew_ms``, so a new owner knows every live target
  within one renewal period; until then broadcasts miss that shard (a gap the client replays).

Each fetch: decode -> :class:`~qim.core.rooms.writer.RoomWriterCore` -> RoomRecords to
``qim.room-log`` (partition = the room's partition), then the broadcasts (one per room and
target ConnectionShard) and the replies to ``qim.to-gateway``; all through one idempotent
``acks=all`` producer, so per partition they keep this order; then the offsets commit.

Takeover (a partition assigned): read its ``qim.room-log`` partition from the beginning to
the end offset seen now (at most ``room_log_retention_minutes`` of records), learning each
room's last epoch and the newest ``message_id`` time (the HLC restarts above it). A partition
that comes back to this worker with its log's end where this worker left it (nobody wrote in
between) keeps its rooms as they were: an eager rebalance that changes nothing for it is not an
epoch change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import IllegalStateError
from mode import Service
from prometheus_client import CollectorRegistry, Counter, Histogram

from qim.agents.rooms.definitions import RoomDefinitions
from qim.agents.writer.lease import HeartbeatLease
from qim.core.rooms.ids import room_partition
from qim.core.rooms.writer import RoomConfig, RoomKey, RoomOutput, RoomWriterCore
from qim.params import Settings
from qim.schemas.ids import HlcClock, split_message_id, unix_ms_to_hlc_ms
from qim.schemas.records.requests import encode_record, user_key
from qim.schemas.records.rooms import (
    RoomRequest,
    decode_room_record,
    decode_room_request,
    encode_room_record,
    room_key,
)
from qim.streams.fetching import hot_fetch
from qim.streams.producer import RecoveringProducer, durable_producer, replaced_counter
from qim.streams.topics import ADMIN_REPLIES, ROOM_LOG, ROOM_REQUESTS, ROOMS, TO_GATEWAY

__all__ = ["GROUP_ID", "ROOM_WRITER_ID_BASE", "RoomWriterOptions", "RoomWriterService"]

log = logging.getLogger(__name__)

GROUP_ID = "qim-room-writers"
ROOM_WRITER_ID_BASE = 0x80000
"""``writer_id`` of room partition p's HLC = this + p: never a ConversationWriter's (< 2^19)."""


@dataclass(frozen=True)
class RoomWriterOptions:
    bootstrap: str
    settings: Settings
    config: RoomConfig
    group_id: str = GROUP_ID
    client_id: str = "qim-room-writer"
    region_id: int = 0
    max_records: int = 500
    requests_topic: str = ROOM_REQUESTS.name
    log_topic: str = ROOM_LOG.name
    rooms_topic: str = ROOMS.name
    to_gateway_topic: str = TO_GATEWAY.name
    admin_replies_topic: str = ADMIN_REPLIES.name

    @classmethod
    def load(
        cls, settings: Settings, env: Mapping[str, str] | None = None, *, bootstrap: str
    ) -> RoomWriterOptions:
        env = os.environ if env is None else env
        rate = settings.room_msg_rate
        config = RoomConfig(
            msg_rate_count=rate.count,
            msg_rate_period_ms=rate.period_ms,
            retention_ms=int(settings.room_log_retention_minutes) * 60_000,
            max_records=int(env.get("QIM_ROOM_LOG_MAX_RECORDS", "10000")),
            target_ttl_ms=int(env.get("QIM_ROOM_TARGET_TTL_MS", "30000")),
        )
        return cls(
            bootstrap=bootstrap,
            settings=settings,
            config=config,
            region_id=int(env.get("QIM_REGION_ID", "0")),
        )


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped
    def __init__(self, service: RoomWriterService) -> None:
        self._service = service

    async def on_partitions_revoked(self, revoked: Any) -> None:
        self._service._revoked()

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._service._assigned({tp.partition for tp in assigned})


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class RoomWriterService(Service):
    """The RoomWriter of the room partitions this worker owns (module docstring)."""

    def __init__(
        self,
        options: RoomWriterOptions,
        registry: CollectorRegistry | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.options = options
        self.registry = registry if registry is not None else CollectorRegistry()
        settings = options.settings
        self.lease = HeartbeatLease(int(settings.writer_self_fence_deadline))
        self.definitions = RoomDefinitions(options.bootstrap, options.rooms_topic)
        self.core = RoomWriterCore(options.config, self.definitions.rooms, self._message_id)
        self.partition_count = 0
        self.assigned: set[int] = set()
        self.serving: set[int] = set()
        self.counters: dict[str, int] = dict.fromkeys(
            ("requests", "messages", "broadcasts", "replies", "self_fenced", "takeovers"), 0
        )
        self._clocks: dict[int, HlcClock] = {}
        self._log_end: dict[int, int] = {}  # partition -> log end offset after our last write
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: RecoveringProducer | None = None
        self.producer_replaced = replaced_counter(self.registry, "rooms")
        self.rate_limited = Counter(
            "room_rate_limited_total",
            "Room messages refused by room_msg_rate (24.1.10)",
            ["room"],
            registry=self.registry,
        )
        self.replays = Counter(
            "qim_room_replay_total",
            "ROOM_REPLAY answers; room_replay_gap_ratio = truncated / all (24.1.10)",
            ["truncated"],
            registry=self.registry,
        )
        self.target_shards = Histogram(
            "room_target_connection_shards",
            "Target ConnectionShards per room broadcast (24.1.10)",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
            registry=self.registry,
        )

    def status(self) -> dict[str, Any]:
        return {
            "assigned": sorted(self.assigned),
            "serving": sorted(self.serving),
            "lease_valid": self.lease.valid(),
            "rooms": len(self.core.rings),
            "definitions": len(self.definitions.rooms),
            "definitions_caught_up": self.definitions.caught_up,
            **self.counters,
        }

    # -- lifecycle -------------------------------------------------------------------------------

    async def on_start(self) -> None:
        opts = self.options
        self._producer = durable_producer(
            opts.bootstrap,
            name="rooms",
            linger_ms=1,
            client_id=f"{opts.client_id}-out",
            on_replaced=lambda reason: self.producer_replaced.labels(
                producer="rooms", reason=reason
            ).inc(),
        )
        await self._producer.start()
        await self.definitions.start()
        self.partition_count = len(await self._producer.partitions_for(opts.requests_topic))
        consumer = AIOKafkaConsumer(
            bootstrap_servers=opts.bootstrap,
            group_id=opts.group_id,
            client_id=opts.client_id,
            enable_auto_commit=False,
            auto_offset_reset="latest",
            session_timeout_ms=int(opts.settings.shard_lease_ttl),
            heartbeat_interval_ms=int(opts.settings.writer_lease_renew_interval),
            metadata_max_age_ms=5000,
            **hot_fetch(),
        )
        await consumer.start()
        self.lease.install(consumer)
        consumer.subscribe([opts.requests_topic], listener=_Listener(self))
        self._consumer = consumer

    async def on_shutdown(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()
        await self.definitions.stop()

    # -- ownership -------------------------------------------------------------------------------

    def _partition_of(self, room: RoomKey) -> int:
        return room_partition(room[0], room[1], self.partition_count)

    def _revoked(self) -> None:
        """Eager rebalance: everything is revoked; rooms stay dormant until ``_assigned``."""
        self.serving.clear()
        self.assigned.clear()

    async def _assigned(self, partitions: set[int]) -> None:
        self.lease.renew()
        self.assigned = set(partitions)
        ends = await self._log_ends(partitions)
        for p in sorted(partitions):
            if p in self._log_end and self._log_end[p] == ends.get(p):
                self.serving.add(p)  # ours since our last write: keep the rooms as they are
                continue
            self.core.forget(lambda room, p=p: self._partition_of(room) != p)  # type: ignore[misc]
            await self._recover(p, ends.get(p, 0))
            self.serving.add(p)
            self.counters["takeovers"] += 1
        for p in list(self._log_end):
            if p not in partitions:
                del self._log_end[p]
        self.core.forget(lambda room: self._partition_of(room) in partitions)

    async def _log_ends(self, partitions: set[int]) -> dict[int, int]:
        if not partitions:
            return {}
        consumer = self._reader()
        await consumer.start()
        try:
            tps = [TopicPartition(self.options.log_topic, p) for p in partitions]
            ends = await consumer.end_offsets(tps)
            return {tp.partition: int(off) for tp, off in ends.items()}
        finally:
            await consumer.stop()

    def _reader(self) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            bootstrap_servers=self.options.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            client_id=f"{self.options.client_id}-recover",
        )

    async def _recover(self, partition: int, end: int) -> None:
        """Each room's last epoch and the newest message_id time in the retained Room Log."""
        last_epoch: dict[RoomKey, int] = {}
        last_hlc = 0
        if end > 0:
            consumer = self._reader()
            await consumer.start()
            try:
                tp = TopicPartition(self.options.log_topic, partition)
                consumer.assign([tp])
                await consumer.seek_to_beginning(tp)
                while await consumer.position(tp) < end:
                    for records in (await consumer.getmany(tp, timeout_ms=500)).values():
                        for record in records:
                            if record.offset >= end or record.value is None:
                                continue
                            try:
                                rec = decode_room_record(record.value)
                            except Exception:
                                continue
                            room = (rec.tenant_id, rec.room_id)
                            last_epoch[room] = max(last_epoch.get(room, 0), rec.room_epoch)
                            mid = int.from_bytes(rec.message_id, "big")
                            last_hlc = max(last_hlc, split_message_id(mid).hlc_ms)
            finally:
                await consumer.stop()
        for room, epoch in last_epoch.items():
            self.core.next_epoch[room] = min(epoch + 1, 0x7FFF)
        writer_id = ROOM_WRITER_ID_BASE + partition
        self._clocks[partition] = HlcClock.restore(last_hlc, self.options.region_id, writer_id)
        self._log_end[partition] = end
        log.info("room partition %d taken over: %d rooms in its log", partition, len(last_epoch))

    def _message_id(self, room: RoomKey, now_ms: int) -> int:
        p = self._partition_of(room)
        clock = self._clocks.get(p)
        if clock is None:
            clock = self._clocks[p] = HlcClock(self.options.region_id, ROOM_WRITER_ID_BASE + p)
        return clock.assign(unix_ms_to_hlc_ms(now_ms))

    # -- the loop --------------------------------------------------------------------------------

    @Service.task
    async def _serve(self) -> None:
        while not self.should_stop:
            consumer = self._consumer
            if consumer is None or not self.definitions.caught_up:
                await self.sleep(0.1)
                continue
            try:
                fetched = await consumer.getmany(
                    timeout_ms=500, max_records=self.options.max_records
                )
            except Exception:
                log.exception("room-requests fetch failed; retrying")
                await self.sleep(1.0)
                continue
            batches = {tp: recs for tp, recs in fetched.items() if recs}
            if not batches:
                continue
            if not self.lease.valid():
                self.counters["self_fenced"] += 1
                for tp, recs in batches.items():
                    with contextlib.suppress(IllegalStateError, AssertionError):
                        consumer.seek(tp, recs[0].offset)
                await self.sleep(0.2)
                continue
            try:
                await self._process(consumer, batches)
            except Exception:
                log.exception("room requests not processed; re-reading them")
                for tp, recs in batches.items():
                    with contextlib.suppress(IllegalStateError, AssertionError):
                        consumer.seek(tp, recs[0].offset)
                await self.sleep(1.0)

    async def _process(self, consumer: AIOKafkaConsumer, batches: dict[Any, list[Any]]) -> None:
        requests: list[RoomRequest] = []
        for tp, records in batches.items():
            if tp.partition not in self.serving:
                continue
            for record in records:
                if record.value is None:
                    continue
                try:
                    requests.append(decode_room_request(record.value))
                except Exception:
                    log.warning("undecodable room request at %s:%d skipped", tp, record.offset)
        self.counters["requests"] += len(requests)
        out = self.core.handle(requests, _wall_ms())
        await self._emit(out)
        offsets = {tp: recs[-1].offset + 1 for tp, recs in batches.items()}
        with contextlib.suppress(Exception):  # a revoked partition: its next owner re-reads
            await consumer.commit(offsets)

    async def _emit(self, out: RoomOutput) -> None:
        producer = self._producer
        assert producer is not None
        opts = self.options
        futures: list[asyncio.Future[Any]] = []
        log_partitions: list[int] = []
        for record in out.records:
            p = self._partition_of((record.tenant_id, record.room_id))
            key = room_key(record.tenant_id, record.room_id)
            futures.append(
                await producer.send(
                    opts.log_topic, encode_room_record(record), key=key, partition=p
                )
            )
            log_partitions.append(p)
        per_room: dict[RoomKey, int] = {}
        for cast in out.broadcasts:
            key = room_key(cast.tenant_id, cast.room_id)
            room = (cast.tenant_id, cast.room_id)
            per_room[room] = per_room.get(room, 0) + 1
            futures.append(
                await producer.send(
                    opts.to_gateway_topic,
                    encode_room_record(cast),
                    key=key,
                    partition=cast.connection_shard,
                )
            )
        for reply in out.replies:
            futures.append(
                await producer.send(
                    opts.to_gateway_topic,
                    encode_room_record(reply),
                    key=user_key(reply.tenant_id, reply.user_id),
                    partition=reply.connection_shard,
                )
            )
        for admin in out.admin_replies:  # a promotion's online members (14.4)
            futures.append(
                await producer.send(
                    opts.admin_replies_topic, encode_record(admin), key=admin.key, partition=0
                )
            )
        results = await asyncio.gather(*futures, return_exceptions=True)
        for p, result in zip(log_partitions, results, strict=False):
            if not isinstance(result, BaseException):
                self._log_end[p] = max(self._log_end.get(p, 0), int(result.offset) + 1)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            log.warning("%d room records not acknowledged: %r", len(failed), failed[0])
        self.counters["messages"] += len(out.records)
        self.counters["broadcasts"] += len(out.broadcasts)
        self.counters["replies"] += len(out.replies)
        for count in per_room.values():
            self.target_shards.observe(count)
        for room in out.rate_limited:
            self.rate_limited.labels(room=room[1]).inc()
        if out.replays:
            self.replays.labels(truncated="true").inc(out.truncated_replays)
            self.replays.labels(truncated="false").inc(out.replays - out.truncated_replays)
