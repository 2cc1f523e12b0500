"""Produces conversation requests to ``qim.conversation-requests`` without blocking a socket.

Why a queue and one sender task: a connection's read loop must never wait on Kafka (a slow
broker would stall PING/PONG and every other frame of the connection). ``submit`` only enqueues;
the sender hands each record to one idempotent ``acks=all`` producer, whose accumulator batches
what arrives within ``linger_ms`` (1-2 ms: a send's latency budget is 150 ms p99, §24.1.2), and
reports each delivery through a done-callback instead of awaiting it, so one slow
acknowledgement never holds back the next record. One queue also keeps a connection's requests
in order into each partition (idempotence keeps retries from reordering them).

Back-pressure: at most ``max_queued`` records wait for the producer; beyond that ``submit``
refuses at once and the caller answers an error with ``retry_after_ms`` rather than letting
memory grow while Kafka is away.

The partition count is checked against the topic at start: a gateway that hashed conversations
over another count than the topic has would route them to the wrong ConversationWriter. The
same producer and queue also carry the user requests of login sync (``extra_topics``: the
``qim.user-requests`` topic, whose partitions must be the MailboxShards), so a gateway holds one
producer connection set, not one per topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from aiokafka import AIOKafkaProducer

__all__ = [
    "Delivered",
    "Outgoing",
    "RequestForwarder",
    "RequestProducer",
    "check_partition_count",
    "kafka_request_producer",
]

log = logging.getLogger(__name__)

Delivered = Callable[[BaseException | None], None]
"""Called once per submitted record: None when Kafka acknowledged it, else the failure."""


class Outgoing(Protocol):
    """One record to produce: ``routing.Routed`` or a user request (``mailbox_requests``)."""

    @property
    def key(self) -> bytes: ...

    @property
    def value(self) -> bytes: ...

    @property
    def partition(self) -> int: ...


class RequestProducer(Protocol):
    """The part of ``AIOKafkaProducer`` the forwarder uses (tests plug a double in)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(
        self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int = ...
    ) -> asyncio.Future[Any]: ...

    async def partitions_for(self, topic: str) -> set[int]: ...

    async def flush(self) -> None: ...


def kafka_request_producer(
    bootstrap: str, *, linger_ms: int = 2, request_timeout_ms: int = 10_000, client_id: str = ""
) -> RequestProducer:
    """An idempotent ``acks=all`` producer: a request is only "sent" once it is durable."""
    producer: RequestProducer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        client_id=client_id or "qim-requests",
        acks="all",
        enable_idempotence=True,
        linger_ms=linger_ms,
        request_timeout_ms=request_timeout_ms,
    )
    return producer


async def check_partition_count(
    producer: RequestProducer,
    topic: str,
    expected: int,
    *,
    setting: str = "conversation_partition_count",
    owner: str = "ConversationWriter",
) -> None:
    """Raise RuntimeError unless ``topic`` has exactly ``expected`` partitions."""
    partitions = await producer.partitions_for(topic)
    if len(partitions) != expected:
        raise RuntimeError(
            f"{topic} has {len(partitions)} partitions but {setting} is {expected}: requests "
            f"would reach the wrong {owner}; fix the setting (QIM_{setting.upper()}) or the topic"
        )


@dataclass(frozen=True, slots=True)
class _Item:
    routed: Outgoing
    done: Delivered
    topic: str


class RequestForwarder:
    """``start``, ``submit`` from any callback of the event loop, ``stop`` (flushes)."""

    def __init__(
        self,
        producer: RequestProducer,
        topic: str,
        partition_count: int,
        *,
        max_queued: int = 10_000,
        extra_topics: Mapping[str, tuple[int, str, str]] | None = None,
    ) -> None:
        """``extra_topics``: topic -> (partition count, setting name, consumer) of the other
        topics ``submit(..., topic=)`` may name, checked at start like ``topic``."""
        if partition_count < 1 or max_queued < 1:
            raise ValueError("partition_count and max_queued must be positive")
        self.topic = topic
        self.partition_count = partition_count
        self.max_queued = max_queued
        self.extra_topics = dict(extra_topics or {})
        self._producer = producer
        self._queue: asyncio.Queue[_Item | None] = asyncio.Queue()
        self._sender: asyncio.Task[None] | None = None

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    async def start(self) -> None:
        await self._producer.start()
        try:
            await check_partition_count(self._producer, self.topic, self.partition_count)
            for topic, (count, setting, owner) in self.extra_topics.items():
                await check_partition_count(
                    self._producer, topic, count, setting=setting, owner=owner
                )
        except BaseException:
            await self._producer.stop()
            raise
        self._sender = asyncio.create_task(self._send_loop(), name=f"requests->{self.topic}")

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Hand the queued records to the producer and wait for the acknowledgements, for at
        most ``timeout_s`` (a broker that is away must not hold the shutdown), then stop."""
        sender, self._sender = self._sender, None
        if sender is not None:
            self._queue.put_nowait(None)
            try:
                await asyncio.wait_for(asyncio.shield(sender), timeout_s)
            except TimeoutError:
                log.warning("%d requests not handed to Kafka at shutdown", self._queue.qsize())
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sender
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._producer.flush(), timeout_s)
        await self._producer.stop()

    def submit(self, routed: Outgoing, done: Delivered, *, topic: str | None = None) -> bool:
        """Queue one record for ``topic`` (default: the requests topic); False (and ``done``
        never called) when the queue is full."""
        if self._sender is None or self._queue.qsize() >= self.max_queued:
            return False
        if topic is not None and topic != self.topic and topic not in self.extra_topics:
            raise ValueError(f"{topic} is not a topic of this forwarder")
        self._queue.put_nowait(_Item(routed, done, topic or self.topic))
        return True

    async def _send_loop(self) -> None:
        while True:
            item = await self._queue.get()
            if item is None:
                return
            routed = item.routed
            try:
                future = await self._producer.send(
                    item.topic, value=routed.value, key=routed.key, partition=routed.partition
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # metadata timeout, record too large, producer closed
                _report(item.done, exc)
                continue
            future.add_done_callback(functools.partial(_delivered, done=item.done))


def _delivered(future: asyncio.Future[Any], done: Delivered) -> None:
    if future.cancelled():
        _report(done, asyncio.CancelledError())
    else:
        _report(done, future.exception())


def _report(done: Delivered, exc: BaseException | None) -> None:
    try:
        done(exc)
    except Exception:  # a bug in a callback must not stop the sender
        log.exception("request delivery callback failed")
