"""Waits for the ConversationWriter's :class:`AdminReply` records on ``qim.admin-replies``.

The admin endpoint is not a consumer-group member: it reads the topic's one partition directly,
from the end as of its start, so it sees only replies to requests it sends from then on and
never competes with another admin process (each filters by its own ``node_id``, the record key,
then by ``correlation_id``). ``isolation_level=read_committed``: the writer answers inside the
Kafka transaction that commits the membership change, so a reply is visible only once the
change is durable, and a fenced writer's reply never is (direction.md §4.6).

The end offset is resolved in ``start`` *before* any request can be produced, so a reply can
never land below the position and be missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition

from qim.schemas.records.requests import AdminReply, decode_admin_reply

__all__ = ["AdminReplyWaiter"]

log = logging.getLogger(__name__)


class AdminReplyWaiter:
    """``expect(correlation_id)`` before producing, then await the future it returns."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        node_id: str,
        *,
        poll_timeout_ms: int = 200,
        consumer: Any = None,
    ) -> None:
        self.topic = topic
        self.node_id = node_id
        self._key = node_id.encode("utf-8")
        self._poll_timeout_ms = poll_timeout_ms
        self._consumer: Any = consumer or AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            client_id=f"{node_id}-replies",
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        self._pending: dict[str, asyncio.Future[AdminReply]] = {}
        self._task: asyncio.Task[None] | None = None
        self.ignored = 0  # records of other admin nodes or undecodable ones

    async def start(self) -> None:
        consumer = self._consumer
        try:
            await consumer.start()
            tp = TopicPartition(self.topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_end(tp)
            await consumer.position(tp)  # resolve the end now, before any request goes out
        except BaseException:
            await consumer.stop()
            raise
        self._task = asyncio.create_task(self._read(), name=f"{self.topic}-reader")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for future in self._pending.values():
            if not future.done():
                future.cancel()
        self._pending.clear()
        await self._consumer.stop()

    def expect(self, correlation_id: str) -> asyncio.Future[AdminReply]:
        """Register interest in one reply; pair with :meth:`discard` on timeout."""
        future: asyncio.Future[AdminReply] = asyncio.get_running_loop().create_future()
        self._pending[correlation_id] = future
        return future

    def discard(self, correlation_id: str) -> None:
        self._pending.pop(correlation_id, None)

    @property
    def waiting(self) -> int:
        return len(self._pending)

    def _accept(self, key: bytes | None, value: bytes | None) -> None:
        if key != self._key or not value:
            self.ignored += 1
            return
        try:
            reply = decode_admin_reply(value)
        except (msgspec.DecodeError, ValueError):
            log.warning("undecodable AdminReply on %s ignored", self.topic)
            self.ignored += 1
            return
        if reply.node_id != self.node_id:
            self.ignored += 1
            return
        future = self._pending.pop(reply.correlation_id, None)
        if future is not None and not future.done():
            future.set_result(reply)

    async def _read(self) -> None:
        while True:
            try:
                fetched = await self._consumer.getmany(timeout_ms=self._poll_timeout_ms)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reading %s failed; retrying", self.topic)
                await asyncio.sleep(1)
                continue
            for records in fetched.values():
                for record in records:
                    self._accept(record.key, record.value)
