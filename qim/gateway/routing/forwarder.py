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
memory grow while Kafka is away. :meth:`RequestForwarder.drain_ms` says how long the queue
takes to reach Kafka at the rate of the last second's hand-overs (None when nothing was handed
over: Kafka is not taking records), so that hint is measured, not guessed.

After a broker restart: the producer is a :class:`~qim.streams.producer.RecoveringProducer`
(idempotent, ``resend=True``). An idempotent producer a restart left with a sequence gap
(``OutOfOrderSequenceNumber`` on every later record of a partition) is replaced and the records
that failed are sent again, in their order, before any later one; the caller's ``done`` hears
only the final outcome. Re-sending is safe for everything this queue carries: a send is
deduplicated by its ``client_message_id`` (ClientDedup), reads are reads, recalls and
user-state commands are idempotent, and any of them is what the client's own retry would send.

The partition count is checked against the topic at start: a gateway that hashed conversations
over another count than the topic has would route them to the wrong ConversationWriter. The
same producer and queue also carry the user requests of login sync (``extra_topics``: the
``qim.user-requests`` topic, whose partitions must be the MailboxShards), so a gateway holds one
producer connection set, not one per topic.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from qim.streams.producer import durable_producer

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
    bootstrap: str,
    *,
    linger_ms: int = 2,
    request_timeout_ms: int = 10_000,
    client_id: str = "",
    on_replaced: Callable[[str], None] | None = None,
) -> RequestProducer:
    """An idempotent ``acks=all`` producer: a request is only "sent" once it is durable. It
    replaces itself when a broker restart left it unusable (module docstring); ``on_replaced``
    counts that (``qim_gateway_producer_replaced_total``)."""

    return durable_producer(
        bootstrap,
        name="requests",
        linger_ms=linger_ms,
        client_id=client_id or "qim-requests",
        on_replaced=on_replaced,
        request_timeout_ms=request_timeout_ms,
    )


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


_RATE_WINDOW_S = 1.0


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``extra_topics``: topic -> (partition count, setting name, consumer) of the other
        topics ``submit(..., topic=)`` may name, checked at start like ``topic``; ``clock``
        (seconds) times the hand-over rate of :meth:`drain_ms`."""
        if partition_count < 1 or max_queued < 1:
            raise ValueError("partition_count and max_queued must be positive")
        self.topic = topic
        self.partition_count = partition_count
        self.max_queued = max_queued
        self.extra_topics = dict(extra_topics or {})
        self._producer = producer
        self._queue: asyncio.Queue[_Item | None] = asyncio.Queue()
        self._sender: asyncio.Task[None] | None = None
        self._handed: collections.deque[float] = collections.deque()  # for drain_ms
        self._clock = clock

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def drain_ms(self) -> int | None:
        """How long the queued records take to reach the producer at the rate of the last
        second's hand-overs; None when nothing was handed over in the last second (Kafka is not
        taking records, so no time can be promised)."""
        rate = self._prune(self._clock()) / _RATE_WINDOW_S
        if rate <= 0:
            return None
        return math.ceil(1000 * (self._queue.qsize() + 1) / rate)

    def _prune(self, now: float) -> int:
        handed = self._handed
        while handed and handed[0] < now - _RATE_WINDOW_S:
            handed.popleft()
        return len(handed)

    def _count_handed(self) -> None:
        now = self._clock()
        self._handed.append(now)
        self._prune(now)

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
            self._count_handed()
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
