"""Publish a user's ``max_conversations_per_user`` crossing on ``qim.user-quota`` (I-26).

Like the session pushes (``mailbox_session_push``): planned after the WriteBatch is durable,
from the committed store (``qim.core.mailbox.quota``), and never raising into the fold. Unlike
them it is state, not a frame: a crossing is rare, so its acks are awaited here (a failure is
logged; the next crossing of that user republishes the state), and a replayed fold below the
takeover point publishes too (the topic is compacted by user: the same value again is harmless).

A lost crossing (the node died after the WriteBatch, before the ack) is healed by
:class:`QuotaReconciler`: after each takeover of a shard, once it has replayed to the end offset
seen at takeover, the shard's partition of ``qim.user-quota`` is read to its end offset with a
group-less reader (bounded by ``read_timeout_s``; a failure is logged and retried later, the
shard serves meanwhile), and under the fold lock the committed store is counted and the records
:func:`~qim.core.mailbox.quota.reconcile` finds wrong are published. A fold whose crossing was
not acknowledged asks for the same pass (``on_failed``).

``QIM_MAILBOX_QUOTA_CRASH=free|exhausted`` (tests only): kill -9 this process when a fold plans
a crossing to that state, before it is sent -- the lost publish the reconcile heals.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from qim.agents.mailbox.options import CrashHook
from qim.agents.mailbox.shard import OwnedShard
from qim.core.mailbox.ports import KVReader
from qim.core.mailbox.quota import (
    UserKey,
    latest_published,
    plan_quota_records,
    reconcile,
    shard_counts,
)
from qim.core.mailbox.sessions import SessionChange
from qim.schemas.records.user_quota import UserQuota, encode_user_quota

__all__ = ["QUOTA_CRASH_ENV", "QuotaReconciler", "publish_quota", "send_quota_records"]

QUOTA_CRASH_ENV: Final = "QIM_MAILBOX_QUOTA_CRASH"

log = logging.getLogger(__name__)


def _crash_armed(records: Sequence[UserQuota]) -> bool:
    step = os.environ.get(QUOTA_CRASH_ENV, "")
    wanted = {"free": False, "exhausted": True}.get(step)
    return wanted is not None and any(r.exhausted is wanted for r in records)


async def send_quota_records(
    producer: AIOKafkaProducer, topic: str, records: Sequence[UserQuota]
) -> int:
    """Send and await the acks; returns how many failed (raises only if a send cannot start)."""
    futures = [
        await producer.send(topic, encode_user_quota(r), key=r.key, partition=r.partition)
        for r in records
    ]
    outcomes = await asyncio.gather(*futures, return_exceptions=True)
    for r in records:
        log.info(
            "user-quota: %s/%s conversations=%d exhausted=%s",
            r.tenant_id,
            r.user_id,
            r.conversations,
            r.exhausted,
        )
    return sum(isinstance(o, BaseException) for o in outcomes)


async def publish_quota(
    producer: AIOKafkaProducer,
    topic: str,
    store: KVReader,
    changes: Sequence[SessionChange],
    *,
    limit: int,
    mailbox_shard: int,
    as_of_mailbox_seq: int,
    on_failed: Callable[[], None] | None = None,
) -> int:
    """Send one record per user whose fold crossed ``limit``; returns how many were acked.
    ``on_failed`` is called when a planned record may not have been published."""
    records: list[UserQuota] = []
    try:
        records = plan_quota_records(
            store,
            changes,
            limit=limit,
            mailbox_shard=mailbox_shard,
            as_of_mailbox_seq=as_of_mailbox_seq,
        )
        if records and _crash_armed(records):
            CrashHook.crash()
        failed = await send_quota_records(producer, topic, records)
    except Exception:
        log.exception("shard %d: user-quota publish failed", mailbox_shard)
        failed = max(len(records), 1)
    if failed:
        log.warning("shard %d: user-quota record(s) not acknowledged; reconciling", mailbox_shard)
        if on_failed is not None:
            on_failed()
        return max(len(records) - failed, 0)
    return len(records)


class QuotaReconciler:
    """The takeover pass of one node over its shards' ``qim.user-quota`` partitions."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        client_id: str = "qim-mailbox-quota",
        read_timeout_s: float = 30.0,
        retry_s: float = 5.0,
    ) -> None:
        self.bootstrap, self.topic, self.client_id = bootstrap, topic, client_id
        self.read_timeout_s, self.retry_s = read_timeout_s, retry_s
        self.pending: dict[int, float] = {}
        """Shard -> not before (monotonic)."""
        self.passes = 0
        self.corrected = 0
        self._reader: AIOKafkaConsumer | None = None

    def request(self, shards: Iterable[int]) -> None:
        for shard in shards:
            self.pending[shard] = 0.0

    def status(self) -> dict[str, object]:
        return {"pending": sorted(self.pending), "passes": self.passes, "corrected": self.corrected}

    async def stop(self) -> None:
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await self._reader.stop()
            self._reader = None

    async def run_due(
        self,
        owned: Callable[[int], OwnedShard | None],
        lock: asyncio.Lock,
        producer: AIOKafkaProducer | None,
    ) -> None:
        """One pass over the due shards that have replayed to their takeover end offset."""
        now = time.monotonic()
        for p in sorted(p for p, at in self.pending.items() if at <= now):
            shard = owned(p)
            if shard is None or producer is None:
                self.pending.pop(p, None)  # revoked: the next owner reconciles it
                continue
            if not shard.serving or shard.next_offset < shard.high_water:
                continue  # still replaying: a count now would be an old one
            try:
                published = await asyncio.wait_for(self._read(p), self.read_timeout_s)
                async with lock:
                    if owned(p) is not shard or not shard.serving:
                        self.pending.pop(p, None)
                        continue
                    fixed = self._plan(shard, published)
                    failed = await send_quota_records(producer, self.topic, fixed)
                if failed:
                    raise RuntimeError(f"{failed} record(s) not acknowledged")
            except Exception:
                log.warning("shard %d: user-quota reconcile failed; retrying", p, exc_info=True)
                self.pending[p] = time.monotonic() + self.retry_s
                await self.stop()  # a fresh reader next time
                continue
            self.pending.pop(p, None)
            self.passes += 1
            self.corrected += len(fixed)
            level = logging.INFO if fixed else logging.DEBUG
            log.log(level, "shard %d: user-quota reconciled, %d record(s) corrected", p, len(fixed))

    @staticmethod
    def _plan(shard: OwnedShard, published: Mapping[UserKey, UserQuota]) -> list[UserQuota]:
        limit = shard.config.session_list.max_conversations_per_user
        counts = shard_counts(shard.store, limit, published)
        return reconcile(
            published,
            counts,
            limit,
            mailbox_shard=shard.shard,
            as_of_mailbox_seq=shard.applied_seq,
        )

    async def _read(self, partition: int) -> dict[UserKey, UserQuota]:
        """The partition from its beginning to its end offset now, latest record per user."""
        if self._reader is None:
            reader = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=None,
                client_id=self.client_id,
                enable_auto_commit=False,
                fetch_max_wait_ms=100,
            )
            await reader.start()
            self._reader = reader
        reader = self._reader
        tp = TopicPartition(self.topic, partition)
        reader.assign([tp])
        start = int((await reader.beginning_offsets([tp]))[tp])
        end = int((await reader.end_offsets([tp]))[tp])
        values: list[bytes | None] = []
        reader.seek(tp, start)
        while start < end and await reader.position(tp) < end:
            fetched = await reader.getmany(tp, timeout_ms=500)
            values.extend(r.value for r in fetched.get(tp, ()) if r.offset < end)
        return latest_published(values)
