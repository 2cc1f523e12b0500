"""The node's follower of the compacted presence topic (the PresenceDirectory, spec 5.4).

Every partition, from the beginning, with no consumer group (every node needs all of it and
commits nothing), into a pure :class:`~qim.core.transient.presence_view.PresenceView`. Each
record names the user it changed (``on_change``); leases that run out change nothing in the
topic, so a sweep every second calls ``on_tick`` for the subscribers to look again. ``ready``
is set once the view has caught up to the end offsets seen at start, so a first snapshot is
not read from an empty view. The per-frame path only reads the view: no remote call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition

from qim.core.transient.presence_view import PresenceView

__all__ = ["PresenceDirectory"]

log = logging.getLogger(__name__)


class PresenceDirectory:
    """``await start()`` / ``await stop()``; ``view`` is read by PRESENCE_SUB and RTC."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        partitions: int,
        clock_ms: Callable[[], int],
        client_id: str = "qim-gateway-presence",
    ) -> None:
        self.view = PresenceView()
        self.ready = asyncio.Event()
        self.on_change: Callable[[str, str], None] = lambda _tenant, _user: None
        self.on_tick: Callable[[int], None] = lambda _now: None
        self._bootstrap, self._topic, self._client_id = bootstrap, topic, client_id
        self._clock_ms = clock_ms
        self._partitions = partitions  # mailbox_shard_count: presence is co-partitioned (5.4.2)
        self._consumer: AIOKafkaConsumer | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Returns at once: the follower connects in the background, retrying, so a broker
        that is down at start delays presence (approximate by nature) but not the node."""
        self._tasks = [
            asyncio.create_task(self._run(), name="presence-directory"),
            asyncio.create_task(self._sweep(), name="presence-sweep"),
        ]

    async def _run(self) -> None:
        delay = 0.5
        while True:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self._bootstrap,
                client_id=self._client_id,
                group_id=None,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                metadata_max_age_ms=5000,  # the assigned topic's metadata soon, not in 5 minutes
                fetch_max_wait_ms=200,
            )
            try:
                await consumer.start()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("presence directory cannot connect (%r); retrying", exc)
                with contextlib.suppress(Exception):
                    await consumer.stop()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            self._consumer = consumer
            await self._follow(consumer)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    async def _follow(self, consumer: AIOKafkaConsumer) -> None:
        tps = [TopicPartition(self._topic, p) for p in range(self._partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        behind = {tp for tp, end in ends.items() if end > 0}
        if not behind:
            self.ready.set()
        while True:
            try:
                batches = await consumer.getmany(timeout_ms=500, max_records=2000)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("presence directory fetch failed; resuming")
                await asyncio.sleep(1)
                continue
            now = self._clock_ms()
            for tp, records in batches.items():
                for record in records:
                    self._apply(tp.partition, record.key, record.value, now)
                if tp in behind and records and records[-1].offset + 1 >= ends[tp]:
                    behind.discard(tp)
            if behind and not self.ready.is_set():
                for tp in list(behind):
                    if await consumer.position(tp) >= ends[tp]:
                        behind.discard(tp)
            if not behind:
                self.ready.set()

    def _apply(self, partition: int, key: bytes | None, value: bytes | None, now: int) -> None:
        if key is None:
            return
        try:
            tenant, user = self.view.apply_record(partition, key, value, now)
        except Exception as exc:  # junk on the topic must not stop the view
            log.warning("presence record at p%d not folded: %r", partition, exc)
            return
        self.on_change(tenant, user)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = self._clock_ms()
            self.view.expire(now)
            try:
                self.on_tick(now)
            except Exception:
                log.exception("presence sweep failed")
