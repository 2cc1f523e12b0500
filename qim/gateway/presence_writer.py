"""Writes PresenceEntry records to the compacted presence topic (§5.4.2, §7.10).

Why one queue and one sender task: an upsert and the tombstone of the same device must reach
the partition in the order the node decided them (a replaced connection must never tombstone
its successor's entry late). ``publish`` / ``tombstone`` only enqueue, so the socket path never
waits on Kafka; the sender hands records to one idempotent ``acks=all`` producer in order.
The partition is explicit (the user's mailbox_shard_id), never the key hash.

The producer replaces itself when a broker restart left it unusable
(:class:`~qim.streams.producer.RecoveringProducer`) and sends the failed records again, in
their order: safe, because the topic is compacted by device key (last write wins) and a
re-sent record is the same decision.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

from qim.schemas.records.presence import PresenceEntry, PresenceKey, encode_presence
from qim.streams.producer import durable_producer

__all__ = ["KafkaPresenceWriter", "MemoryPresence"]

log = logging.getLogger(__name__)

_Record = tuple[bytes, bytes | None, int]


class KafkaPresenceWriter:
    """A :class:`~qim.gateway.ports.PresenceSink` over aiokafka."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        virtual_bucket_count: int,
        mailbox_shard_count: int,
        on_written: Callable[[str], None] | None = None,
        on_replaced: Callable[[str], None] | None = None,
    ) -> None:
        """``on_replaced(reason)``: the producer was replaced (a metric counts it)."""
        self.topic = topic
        self._vbc = virtual_bucket_count
        self._shards = mailbox_shard_count
        self._on_written = on_written or (lambda kind: None)
        self._producer = durable_producer(
            bootstrap, name="presence", linger_ms=5, on_replaced=on_replaced
        )
        self._queue: asyncio.Queue[_Record | None] = asyncio.Queue()
        self._sender: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._producer.start()
        self._sender = asyncio.create_task(self._send_loop(), name=f"presence->{self.topic}")

    async def stop(self) -> None:
        """Send everything queued (tombstones of a clean shutdown), then stop."""
        if self._sender is not None:
            self._queue.put_nowait(None)
            await self._sender
            self._sender = None
        await self._producer.stop()

    async def flush(self) -> None:
        """Wait until every record queued so far is acknowledged."""
        await self._queue.join()
        await self._producer.flush()

    def publish(self, entry: PresenceEntry) -> None:
        self._put(entry.key, encode_presence(entry))

    def tombstone(self, key: PresenceKey) -> None:
        self._put(key, None)

    def partition_of(self, key: PresenceKey) -> int:
        return key.partition(virtual_bucket_count=self._vbc, mailbox_shard_count=self._shards)

    def _put(self, key: PresenceKey, value: bytes | None) -> None:
        self._queue.put_nowait((key.encode(), value, self.partition_of(key)))

    async def _send_loop(self) -> None:
        while True:
            record = await self._queue.get()
            try:
                if record is None:
                    await self._producer.flush()
                    return
                key, value, partition = record
                future = await self._producer.send(
                    self.topic, value=value, key=key, partition=partition
                )
                kind = "upsert" if value is not None else "tombstone"
                future.add_done_callback(functools.partial(self._done, kind=kind))
            except Exception:  # a record lost here expires by lease (§5.4.3 (3))
                log.exception("presence record not sent")
            finally:
                self._queue.task_done()

    def _done(self, future: asyncio.Future[Any], kind: str) -> None:
        if future.cancelled() or future.exception() is not None:
            log.error("presence %s not acknowledged: %r", kind, future)
            return
        self._on_written(kind)


class MemoryPresence:
    """A PresenceSink that keeps the compacted view in memory (unit tests, no Kafka)."""

    def __init__(self) -> None:
        self.entries: dict[PresenceKey, PresenceEntry] = {}
        self.log: list[tuple[PresenceKey, PresenceEntry | None]] = []

    def publish(self, entry: PresenceEntry) -> None:
        self.entries[entry.key] = entry
        self.log.append((entry.key, entry))

    def tombstone(self, key: PresenceKey) -> None:
        self.entries.pop(key, None)
        self.log.append((key, None))
