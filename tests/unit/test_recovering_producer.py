"""RecoveringProducer: a producer left unusable (the state a broker restart can leave an
idempotent aiokafka producer in) is replaced, what is safe is sent again in order, and the
replacement is counted. The broker is a double whose partitions keep each producer's sequence
state the way Kafka does: once a producer's batch to a partition was lost, every later batch of
that producer to that partition gets OutOfOrderSequenceNumber."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka.errors import (
    KafkaTimeoutError,
    LeaderNotAvailableError,
    OutOfOrderSequenceNumber,
    ProducerClosed,
)
from prometheus_client import CollectorRegistry

from qim.streams.producer import RecoveringProducer, replaced_counter, sender_stopped


@dataclass
class FakeBroker:
    log: dict[int, list[bytes]] = field(default_factory=dict)
    producers: list[FakeProducer] = field(default_factory=list)
    start_failures: int = 0

    def factory(self) -> FakeProducer:
        producer = FakeProducer(self)
        self.producers.append(producer)
        return producer


@dataclass(frozen=True)
class Metadata:
    partition: int
    offset: int


class _Sender:
    def __init__(self) -> None:
        self.sender_task: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class FakeProducer:
    """Delivers on the next loop turn; ``lose(p)`` drops the next batch to p after taking its
    sequence, so that batch and every later one to p fail (the sticky sequence gap)."""

    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.started = False
        self.stopped = False
        self.gap: set[int] = set()
        self.lose_next: set[int] = set()
        self.refuse: set[bytes] = set()
        self._sender: _Sender | None = None

    async def start(self) -> None:
        if self.broker.start_failures:
            self.broker.start_failures -= 1
            raise KafkaTimeoutError("no broker")
        self._sender = _Sender()
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    async def partitions_for(self, topic: str) -> set[int]:
        return {0, 1}

    def lose(self, partition: int) -> None:
        self.lose_next.add(partition)

    def kill_sender(self) -> None:
        assert self._sender is not None
        self._sender.sender_task.set_result(None)

    async def send(
        self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int = 0
    ) -> asyncio.Future[Metadata]:
        assert self.started and not self.stopped
        assert value is not None
        future: asyncio.Future[Metadata] = asyncio.get_running_loop().create_future()
        if partition in self.lose_next:
            self.lose_next.discard(partition)
            self.gap.add(partition)
            error: Exception | None = LeaderNotAvailableError()
        elif partition in self.gap or value in self.refuse:
            error = OutOfOrderSequenceNumber()
        else:
            error = None

        def settle() -> None:
            if error is not None:
                future.set_exception(error)
                return
            log = self.broker.log.setdefault(partition, [])
            log.append(value)
            future.set_result(Metadata(partition, len(log) - 1))

        asyncio.get_running_loop().call_soon(settle)
        return future


def recovering(broker: FakeBroker, **kwargs: Any) -> tuple[RecoveringProducer, CollectorRegistry]:
    registry = CollectorRegistry()
    counter = replaced_counter(registry, "gateway")
    options: dict[str, Any] = {
        "name": "requests",
        "idempotent": True,
        "resend": True,
        "on_replaced": lambda reason: counter.labels(producer="requests", reason=reason).inc(),
        "backoff_s": (0.001, 0.01),
        "drain_timeout_s": 1.0,
    }
    options.update(kwargs)
    return RecoveringProducer(broker.factory, **options), registry


def replaced(registry: CollectorRegistry, reason: str) -> float:
    value = registry.get_sample_value(
        "qim_gateway_producer_replaced_total", {"producer": "requests", "reason": reason}
    )
    assert value is not None, "the replacement counter has no such series"
    return value


async def test_a_lost_batch_replaces_the_idempotent_producer_and_resends_in_order() -> None:
    broker = FakeBroker()
    producer, registry = recovering(broker)
    await producer.start()
    first = broker.producers[0]
    ok = await producer.send("t", b"a", partition=0)
    await ok
    first.lose(0)
    futures = [
        await producer.send("t", b"b", partition=0),  # lost: takes the sequence, never written
        await producer.send("t", b"c", partition=1),  # another partition: delivered
        await producer.send("t", b"d", partition=0),  # OutOfOrderSequenceNumber
    ]
    later = await producer.send("t", b"e", partition=0)  # waits for the replacement
    results = await asyncio.gather(*futures, later)
    assert [r.partition for r in results] == [0, 1, 0, 0]
    assert broker.log == {0: [b"a", b"b", b"d", b"e"], 1: [b"c"]}  # the order of first sending
    assert len(broker.producers) == 2 and first.stopped
    assert producer.producer is broker.producers[1]
    assert producer.replacements == 1
    assert replaced(registry, "LeaderNotAvailableError") == 1
    await producer.stop()
    assert broker.producers[1].stopped


async def test_out_of_order_sequence_number_from_the_broker_replaces_the_producer() -> None:
    broker = FakeBroker()
    producer, registry = recovering(broker)
    await producer.start()
    broker.producers[0].gap.add(1)  # the state the gateway was stuck in for 6.5 minutes
    ack = await (await producer.send("t", b"x", partition=1))
    assert ack.partition == 1 and broker.log == {1: [b"x"]}
    assert replaced(registry, "OutOfOrderSequenceNumber") == 1
    await producer.stop()


async def test_without_resend_the_failure_reaches_the_caller_and_later_sends_work() -> None:
    broker = FakeBroker()
    producer, registry = recovering(broker, resend=False)
    await producer.start()
    broker.producers[0].gap.add(0)
    failed = await producer.send("t", b"x", partition=0)
    with pytest.raises(OutOfOrderSequenceNumber):
        await failed
    ack = await (await producer.send("t", b"y", partition=0))
    assert ack.offset == 0 and broker.log == {0: [b"y"]}
    assert replaced(registry, "OutOfOrderSequenceNumber") == 1
    await producer.stop()


async def test_a_plain_producer_with_a_dead_sender_is_replaced_before_the_next_send() -> None:
    broker = FakeBroker()
    producer, registry = recovering(broker, idempotent=False, resend=False)
    await producer.start()
    broker.producers[0].kill_sender()
    assert sender_stopped(broker.producers[0])
    ack = await (await producer.send("t", b"x", partition=0))
    assert ack.offset == 0 and len(broker.producers) == 2
    assert replaced(registry, "sender_stopped") == 1
    await producer.stop()


async def test_a_plain_producer_keeps_itself_through_an_ordinary_delivery_failure() -> None:
    broker = FakeBroker()
    producer, registry = recovering(broker, idempotent=False, resend=False)
    await producer.start()
    broker.producers[0].lose(0)  # LeaderNotAvailable: retriable, no sequence to break
    with pytest.raises(LeaderNotAvailableError):
        await (await producer.send("t", b"x", partition=0))
    assert len(broker.producers) == 1 and producer.replacements == 0
    assert registry.get_sample_value(
        "qim_gateway_producer_replaced_total",
        {"producer": "requests", "reason": "LeaderNotAvailableError"},
    ) in (None, 0.0)
    await producer.stop()


async def test_a_record_refused_by_every_producer_fails_after_max_attempts() -> None:
    broker = FakeBroker()
    producer, _ = recovering(broker, max_attempts=2)
    original = broker.factory

    def refusing() -> FakeProducer:
        p = original()
        p.refuse.add(b"poison")
        return p

    producer._factory = refusing
    await producer.start()
    broker.producers[0].refuse.add(b"poison")
    with pytest.raises(OutOfOrderSequenceNumber):
        await (await producer.send("t", b"poison", partition=0))
    ack = await (await producer.send("t", b"fine", partition=0))
    assert ack.offset == 0 and broker.log == {0: [b"fine"]}
    assert producer.replacements == 3  # each failure left its producer unusable
    await producer.stop()


async def test_the_replacement_waits_for_a_broker_that_does_not_answer_yet() -> None:
    broker = FakeBroker()
    producer, registry = recovering(broker)
    await producer.start()
    broker.start_failures = 2  # the broker is still restarting
    broker.producers[0].gap.add(0)
    ack = await (await producer.send("t", b"x", partition=0))
    assert ack.offset == 0
    assert len(broker.producers) == 4 and all(p.stopped for p in broker.producers[:3])
    assert replaced(registry, "OutOfOrderSequenceNumber") == 1
    await producer.stop()


async def test_stop_fails_what_has_no_outcome_and_later_sends_raise() -> None:
    broker = FakeBroker()
    producer, _ = recovering(broker)
    await producer.start()
    await producer.stop()
    with pytest.raises(ProducerClosed):
        await producer.send("t", b"x", partition=0)


def test_one_replacement_counter_per_registry() -> None:
    registry = CollectorRegistry()
    assert replaced_counter(registry, "conversation") is replaced_counter(registry, "conversation")
    replaced_counter(registry, "conversation").labels(producer="writer", reason="X").inc()
    assert (
        registry.get_sample_value(
            "qim_conversation_producer_replaced_total", {"producer": "writer", "reason": "X"}
        )
        == 1
    )
