"""The ConversationWriter's copy of the users at ``max_conversations_per_user`` (I-26).

``qim.user-quota`` is compacted and keyed by user, so reading it from the beginning gives each
user's latest crossing; following it keeps the set current. No consumer group: every worker
reads every partition (a small topic: one record per user that ever reached the cap), assigned
explicitly, positions never committed. ``read_uncommitted`` is enough because the MailboxNode's
producer is not transactional. :meth:`start` returns once the records present at start are
read, so a worker does not serve with an empty set the log already contradicts.

The set is the writer's argument (``RequestContext.exhausted``), never a global.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition

from qim.core.conversation.quota import UserKey
from qim.schemas.records.user_quota import decode_user_quota
from qim.streams.fetching import start_follower

__all__ = ["UserQuotaFollower"]

log = logging.getLogger(__name__)


class UserQuotaFollower:
    """Reads ``topic`` from offset 0 into :attr:`exhausted`, then follows it."""

    def __init__(
        self, bootstrap: str, topic: str, partitions: int, *, client_id: str = "qim-user-quota"
    ) -> None:
        self.bootstrap, self.topic, self.client_id = bootstrap, topic, client_id
        self.partitions = partitions
        """``mailbox_shard_count``: the topic's declared partition count (``USER_QUOTA``)."""
        self.exhausted: set[UserKey] = set()
        self.records = 0
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, catch_up_timeout_s: float = 30.0) -> None:
        tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        consumer = await start_follower(self.bootstrap, self.client_id, tps, fetch_max_wait_ms=200)
        self._consumer = consumer
        try:
            ends = await asyncio.wait_for(consumer.end_offsets(tps), catch_up_timeout_s)
            await asyncio.wait_for(self._catch_up(consumer, ends), catch_up_timeout_s)
        except Exception:  # a missing topic, a slow broker: follow anyway, say so
            log.warning("user-quota: %s not read to its end at start", self.topic, exc_info=True)
        self._task = asyncio.create_task(self._follow(consumer), name="user-quota")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._consumer is not None:
            await self._consumer.stop()

    async def _catch_up(self, consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int]) -> None:
        for tp, end in ends.items():
            while await consumer.position(tp) < end:
                self.apply_records(await consumer.getmany(timeout_ms=200))

    async def _follow(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            try:
                self.apply_records(await consumer.getmany(timeout_ms=1000))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("user-quota: fetch failed; retrying")
                await asyncio.sleep(1.0)

    def apply_records(self, batches: Mapping[TopicPartition, Sequence[object]]) -> None:
        """Fold fetched records in order: the latest record of a user decides."""
        for records in batches.values():
            for record in records:
                value = getattr(record, "value", None)
                if value is None:
                    continue  # a tombstone: nothing to keep
                try:
                    quota = decode_user_quota(value)
                except Exception:
                    log.warning("user-quota: undecodable record skipped")
                    continue
                key = (quota.tenant_id, quota.user_id)
                if quota.exhausted:
                    self.exhausted.add(key)
                else:
                    self.exhausted.discard(key)
                self.records += 1
