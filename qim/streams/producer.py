"""A Kafka producer that replaces itself when it can no longer deliver (issue 15, item 1).

Why: aiokafka's idempotent producer gives a batch its sequence number when it drains it, and a
batch that then fails without being written leaves a gap the broker never forgets: every later
batch of that producer to that partition is refused with ``OutOfOrderSequenceNumber``, forever
(aio-libs/aiokafka#1017). A broker restart is enough: for a moment its metadata shows
partitions without a leader, and the accumulator fails a batch that waited longer than
``request_timeout_ms`` for one (``drain_by_nodes``) after it took a sequence number. Kafka's Java
client bumps its producer epoch and resets the sequences (KIP-360); aiokafka does not, so the
only cure is a new producer (a new producer id starts every partition at sequence 0). A
producer whose sender task died (an unexpected error in aiokafka's sender) is as unusable:
every later send waits forever.

:class:`RecoveringProducer` wraps one producer (idempotent or plain) and, on a delivery failure
that leaves it unusable -- any failed delivery of an idempotent producer (every one happens
after the sequence was taken), one of :data:`FATAL` from a plain one, or a dead sender --
replaces it:

1. new sends wait (``send`` blocks, so the owner's own queue gives back-pressure);
2. the old producer's outstanding deliveries settle, for at most ``drain_timeout_s`` (the other
   partitions' batches usually deliver; the poisoned partition's fail at once, in order);
3. the old producer is stopped (abandoned after ``stop_timeout_s``: a stop waits for batches
   a dead sender never sends);
4. a new producer from ``factory`` is started, retried with backoff until the broker answers;
5. with ``resend=True`` the records that failed -- and those whose outcome never came -- are
   sent again on the new producer in the order they were first sent, before any new record, so
   a connection's records keep their order within a partition. Without it they fail to their
   caller, whose own recovery decides (the FanoutCoordinator re-produces from its committed
   offset, the MailboxNode's replies and pushes are at-least-once anyway);
6. ``on_replaced(reason)`` is called (the process's ``qim_<process>_producer_replaced_total``
   counter, :func:`replaced_counter`), and sends resume.

What may be re-sent is the owner's decision: a record that failed this way was, except in rare
cases, never written (the broker refused it, or it never left), so a re-send is a retry, and
it is only safe where a duplicate is harmless. The gateway's conversation and user requests are
(ClientDedup by ``client_message_id`` for sends, reads, idempotent amends and user-state
commands: the client's own retry sends the same thing) and so are presence entries (a
compacted topic keyed by device, last write wins). The ConversationWriter's transactional
producers are not wrapped: a failed transaction already drops the partition and restores it
with a new producer whose InitProducerId fences every older one (``writer_restore``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    InvalidProducerEpoch,
    InvalidProducerIdMapping,
    KafkaConnectionError,
    OutOfOrderSequenceNumber,
    ProducerClosed,
    ProducerFenced,
    UnknownProducerId,
)
from prometheus_client import CollectorRegistry, Counter

__all__ = ["FATAL", "RecoveringProducer", "durable_producer", "replaced_counter", "sender_stopped"]

log = logging.getLogger(__name__)

FATAL: Final = (
    OutOfOrderSequenceNumber,
    UnknownProducerId,
    InvalidProducerEpoch,
    InvalidProducerIdMapping,
    ProducerFenced,
    ProducerClosed,
)
"""Errors after which no producer (idempotent or not) delivers to that partition again."""

_CLOSING: set[asyncio.Future[Any]] = set()
_COUNTERS: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = weakref.WeakKeyDictionary()


def replaced_counter(registry: CollectorRegistry, process: str) -> Counter:
    """``qim_<process>_producer_replaced_total{producer, reason}``, one per registry (the
    conversation app's ConversationWriter and FanoutCoordinator share theirs)."""
    counter = _COUNTERS.get(registry)
    if counter is None:
        counter = Counter(
            f"qim_{process}_producer_replaced_total",
            "Kafka producers replaced because they could no longer deliver, by producer and "
            "the error that showed it (a broker restart leaves idempotent ones unusable)",
            ["producer", "reason"],
            registry=registry,
        )
        _COUNTERS[registry] = counter
    return counter


def sender_stopped(producer: Any) -> bool:
    """True when an aiokafka producer's sender task ended: nothing it accepts is sent again."""
    task = getattr(getattr(producer, "_sender", None), "sender_task", None)
    return isinstance(task, asyncio.Future) and task.done()


@dataclass(slots=True, eq=False)
class _Pending:
    seq: int
    topic: str
    value: bytes | None
    key: bytes | None
    partition: int | None
    outer: asyncio.Future[Any]
    generation: int
    attempts: int = field(default=0)


class RecoveringProducer:
    """``start`` / ``send`` / ``flush`` / ``partitions_for`` / ``stop`` like aiokafka's producer;
    ``send`` returns a future of the record's final outcome (see the module docstring)."""

    def __init__(
        self,
        factory: Callable[[], Any],
        *,
        name: str,
        idempotent: bool,
        resend: bool,
        on_replaced: Callable[[str], None] | None = None,
        drain_timeout_s: float = 10.0,
        stop_timeout_s: float = 5.0,
        start_timeout_s: float = 30.0,
        backoff_s: tuple[float, float] = (0.2, 5.0),
        max_attempts: int = 3,
    ) -> None:
        """``factory`` makes an unstarted producer; ``max_attempts`` bounds the re-sends of one
        record (a record the broker refuses for itself must not replace producers forever)."""
        self._factory = factory
        self.name = name
        self.idempotent = idempotent
        self.resend = resend
        self._on_replaced = on_replaced or (lambda reason: None)
        self._drain_timeout_s = drain_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._start_timeout_s = start_timeout_s
        self._backoff_s = backoff_s
        self._max_attempts = max_attempts
        self._producer: Any = None
        self._generation = 0
        self._seq = itertools.count()
        self._inflight: dict[int, _Pending] = {}
        self._failed: list[_Pending] = []
        self._ready = asyncio.Event()
        self._changed = asyncio.Event()
        self._replacing: asyncio.Task[None] | None = None
        self._replacing_generation = -1
        self._again: str | None = None
        self.seal_topics: dict[str, Callable[[bytes], bytes]] = {}
        """Topics whose values are sealed before they are handed over (to-gateway: the
        transit seal of topology.md decision 44)."""
        self._closed = False
        self.replacements = 0

    @property
    def producer(self) -> Any:
        """The producer in use now (tests inspect it)."""
        return self._producer

    @property
    def replacing(self) -> bool:
        return self._replacing is not None

    async def start(self) -> None:
        producer = self._factory()
        await producer.start()
        self._producer = producer
        self._ready.set()

    async def stop(self) -> None:
        """Finish a replacement in progress (bounded), flush and stop the producer; whatever
        still has no outcome fails with ProducerClosed."""
        if self._closed:
            return
        self._closed = True
        task = self._replacing
        if task is not None:
            timeout = self._drain_timeout_s + self._stop_timeout_s
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout)
            except (TimeoutError, Exception):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._ready.set()  # waiting senders wake up and see the producer closed
        producer = self._producer
        if producer is not None:
            await self._close(producer)
        closed = ProducerClosed()
        for pending in [*self._inflight.values(), *self._failed]:
            _fail(pending.outer, closed)
        self._inflight.clear()
        self._failed.clear()

    async def flush(self) -> None:
        """Wait for the outcome of every record sent so far (re-sends included)."""
        outers = [p.outer for p in (*self._inflight.values(), *self._failed)]
        if outers:
            await asyncio.wait(outers)

    async def partitions_for(self, topic: str) -> Any:
        await self._ready.wait()
        if self._closed:
            raise ProducerClosed()
        return await self._producer.partitions_for(topic)

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
    ) -> asyncio.Future[Any]:
        """Hand one record to the producer; the future resolves with its RecordMetadata or the
        failure that reached the caller. Raises what aiokafka's ``send`` raises (no metadata in
        time, a record too large): nothing was handed over then. A value for a topic in
        :attr:`seal_topics` is sealed first (``qim.streams.transit``)."""
        seal = self.seal_topics.get(topic)
        if seal is not None and value is not None:
            value = seal(value)
        while True:
            if self._closed:
                raise ProducerClosed()
            if not self._ready.is_set():
                await self._ready.wait()
                continue
            producer, generation = self._producer, self._generation
            if sender_stopped(producer):
                self._replace(generation, "sender_stopped")
                continue
            break
        loop = asyncio.get_running_loop()
        pending = _Pending(next(self._seq), topic, value, key, partition, loop.create_future(), 0)
        pending.generation = generation
        self._inflight[pending.seq] = pending
        try:
            inner = await producer.send(topic, value, key=key, partition=partition)
        except BaseException:
            if self._inflight.get(pending.seq) is pending:
                del self._inflight[pending.seq]
                self._changed.set()
            raise
        self._attach(pending, inner, generation)
        return pending.outer

    # -- deliveries ------------------------------------------------------------------------------

    def _attach(self, pending: _Pending, inner: asyncio.Future[Any], generation: int) -> None:
        inner.add_done_callback(lambda f: self._settle(pending, generation, f))

    def _settle(self, pending: _Pending, generation: int, inner: asyncio.Future[Any]) -> None:
        exc = asyncio.CancelledError() if inner.cancelled() else inner.exception()
        if self._inflight.get(pending.seq) is not pending or pending.generation != generation:
            return  # given up on and sent again (or failed) by a replacement
        del self._inflight[pending.seq]
        self._changed.set()
        if inner.cancelled():
            pending.outer.cancel()
            return
        if exc is None:
            if not pending.outer.done():
                pending.outer.set_result(inner.result())
            return
        if not self._unusable(exc, generation):
            _fail(pending.outer, exc)
            return
        if self.resend and pending.attempts < self._max_attempts:
            self._failed.append(pending)
        else:
            _fail(pending.outer, exc)
        self._replace(generation, type(exc).__name__)

    def _unusable(self, exc: BaseException, generation: int) -> bool:
        if self.idempotent or isinstance(exc, FATAL):
            return True
        return generation == self._generation and sender_stopped(self._producer)

    # -- replacement -----------------------------------------------------------------------------

    def _replace(self, generation: int, reason: str) -> None:
        if self._closed or generation != self._generation:
            return
        if self._replacing is not None:
            if generation != self._replacing_generation:
                self._again = reason  # the new producer failed during the re-sends
            return
        self._ready.clear()
        self._replacing_generation = generation
        self._replacing = asyncio.create_task(self._run(reason), name=f"replace-{self.name}")

    async def _run(self, reason: str) -> None:
        try:
            next_reason: str | None = reason
            while next_reason is not None and not self._closed:
                self._replacing_generation = self._generation
                await self._replace_once(next_reason)
                next_reason, self._again = self._again, None
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s: replacing the Kafka producer failed", self.name)
        finally:
            self._replacing = None
            self._ready.set()

    async def _replace_once(self, reason: str) -> None:
        old, generation = self._producer, self._generation
        log.warning("%s: Kafka producer unusable (%s); replacing it", self.name, reason)
        await self._drain(generation)
        await self._close(old)
        for pending in [p for p in self._inflight.values() if p.generation == generation]:
            del self._inflight[pending.seq]  # no outcome came: treat it as failed
            if self.resend and pending.attempts < self._max_attempts:
                self._failed.append(pending)
            else:
                _fail(pending.outer, KafkaConnectionError(f"{self.name}: producer replaced"))
        producer = await self._start_new()
        if producer is None:  # stopped meanwhile
            return
        self._producer = producer
        self._generation = generation + 1
        self.replacements += 1
        self._on_replaced(reason)
        failed, self._failed = sorted(self._failed, key=lambda p: p.seq), []
        if failed:
            log.warning("%s: sending %d records again on the new producer", self.name, len(failed))
        for pending in failed:
            await self._send_again(pending)

    async def _drain(self, generation: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._drain_timeout_s
        while any(p.generation == generation for p in self._inflight.values()):
            remaining = deadline - loop.time()
            if remaining <= 0:
                log.warning(
                    "%s: deliveries still open after %.1f s", self.name, self._drain_timeout_s
                )
                return
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    async def _send_again(self, pending: _Pending) -> None:
        pending.attempts += 1
        pending.generation = generation = self._generation
        self._inflight[pending.seq] = pending
        try:
            inner = await self._producer.send(
                pending.topic, pending.value, key=pending.key, partition=pending.partition
            )
        except Exception as exc:
            self._inflight.pop(pending.seq, None)
            _fail(pending.outer, exc)
            return
        self._attach(pending, inner, generation)

    async def _start_new(self) -> Any:
        delay, longest = self._backoff_s
        while not self._closed:
            producer = self._factory()
            try:
                await asyncio.wait_for(producer.start(), self._start_timeout_s)
            except Exception as exc:
                log.warning("%s: new Kafka producer did not start (%r); retrying", self.name, exc)
                await self._close(producer)
                await asyncio.sleep(delay)
                delay = min(delay * 2, longest)
                continue
            return producer
        return None

    async def _close(self, producer: Any) -> None:
        try:
            await asyncio.wait_for(producer.stop(), self._stop_timeout_s)
        except Exception as exc:
            log.warning("%s: Kafka producer stop: %r; abandoning it", self.name, exc)
            _abandon(producer)


def _abandon(producer: Any) -> None:
    """Cancel a producer's sender whose stop did not finish (it waits for batches it will never
    send), so no task of it outlives the replacement."""
    task = getattr(getattr(producer, "_sender", None), "sender_task", None)
    if isinstance(task, asyncio.Future) and not task.done():
        task.cancel()
    close = getattr(getattr(producer, "client", None), "close", None)
    if close is not None:
        with contextlib.suppress(Exception):
            closing = asyncio.ensure_future(close())
            _CLOSING.add(closing)
            closing.add_done_callback(_CLOSING.discard)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def durable_producer(
    bootstrap: str,
    *,
    name: str,
    linger_ms: int,
    client_id: str | None = None,
    on_replaced: Callable[[str], None] | None = None,
    **kafka: Any,
) -> RecoveringProducer:
    """An idempotent ``acks=all`` producer (a send is done once it is durable) that replaces
    itself after a broker restart left it unusable and resends what was in flight; ``name``
    labels ``qim_<process>_producer_replaced_total``. ``kafka``: further AIOKafkaProducer
    options (``request_timeout_ms``, ...)."""
    options: dict[str, Any] = {"client_id": client_id} if client_id else {}

    def make() -> AIOKafkaProducer:
        return AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            enable_idempotence=True,
            linger_ms=linger_ms,
            **options,
            **kafka,
        )

    return RecoveringProducer(
        make, name=name, idempotent=True, resend=True, on_replaced=on_replaced
    )
