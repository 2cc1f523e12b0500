"""Which rooms exist, and who may enter: ``qim.rooms`` read whole and followed.

Compacted and keyed by (tenant, room_id), one partition: reading it from the beginning gives
every room's latest definition (a null value deletes the room). Every RoomWriter worker reads
all of it with no group, positions never committed -- rooms are few. :meth:`start` returns once
the records present at start are read, so a writer never answers PERMISSION_DENIED for a room
the log already defines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition

from qim.core.rooms.writer import RoomKey
from qim.schemas.records.rooms import RoomDefinition, decode_room_definition
from qim.streams.fetching import start_follower

__all__ = ["RoomDefinitions"]

log = logging.getLogger(__name__)


class RoomDefinitions:
    """Reads ``topic`` from offset 0 into :attr:`rooms`, then follows it."""

    def __init__(self, bootstrap: str, topic: str, *, client_id: str = "qim-rooms") -> None:
        self.bootstrap, self.topic, self.client_id = bootstrap, topic, client_id
        self.rooms: dict[RoomKey, RoomDefinition] = {}
        self.caught_up = False
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, catch_up_timeout_s: float = 30.0) -> None:
        tp = TopicPartition(self.topic, 0)
        consumer = await start_follower(self.bootstrap, self.client_id, [tp], fetch_max_wait_ms=100)
        self._consumer = consumer
        try:
            ends = await asyncio.wait_for(consumer.end_offsets([tp]), catch_up_timeout_s)
            await asyncio.wait_for(self._catch_up(consumer, tp, ends[tp]), catch_up_timeout_s)
            self.caught_up = True
        except Exception:
            log.warning("rooms: %s not read to its end at start", self.topic, exc_info=True)
        self._task = asyncio.create_task(self._follow(consumer), name="room-definitions")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._consumer is not None:
            await self._consumer.stop()

    async def _catch_up(self, consumer: AIOKafkaConsumer, tp: TopicPartition, end: int) -> None:
        while await consumer.position(tp) < end:
            self.apply_records(await consumer.getmany(timeout_ms=200))

    async def _follow(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            try:
                self.apply_records(await consumer.getmany(timeout_ms=1000))
                self.caught_up = True
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("rooms: fetch failed; retrying")
                await asyncio.sleep(1.0)

    def apply_records(self, batches: Mapping[TopicPartition, Sequence[object]]) -> None:
        """The latest record of a key decides; a null value deletes the room."""
        for records in batches.values():
            for record in records:
                key, value = getattr(record, "key", None), getattr(record, "value", None)
                if value is None:
                    if isinstance(key, bytes) and key.count(b"\x00") == 1:
                        tenant, room = key.decode("utf-8").split("\x00")
                        self.rooms.pop((tenant, room), None)
                    continue
                try:
                    definition = decode_room_definition(value)
                except Exception:
                    log.warning("rooms: undecodable definition skipped")
                    continue
                self.rooms[(definition.tenant_id, definition.room_id)] = definition
