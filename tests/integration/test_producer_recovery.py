"""The sequence gap a broker restart leaves in an idempotent aiokafka producer, made on purpose
against the real broker: the raw producer stays stuck, the RecoveringProducer replaces itself,
sends the failed records again in order, exactly once, and counts the replacement.

The gap is made the way aiokafka makes it (aio-libs/aiokafka#1017): a sequence number is taken
for a partition without its batch reaching the broker (here by advancing the producer's
sequence for that partition by one; after a restart, by expiring a drained batch).
"""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import OutOfOrderSequenceNumber
from prometheus_client import CollectorRegistry

from qim.devstack.stack import Stack, wait_topics_visible
from qim.streams.producer import RecoveringProducer, replaced_counter

pytestmark = pytest.mark.integration


async def new_topic(bootstrap: str, partitions: int = 2) -> str:
    name = f"qim.test-recovery-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
        await wait_topics_visible(admin, {name: partitions})
    finally:
        await admin.close()
    return name


def idempotent(bootstrap: str) -> AIOKafkaProducer:
    return AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)


def open_gap(producer: AIOKafkaProducer, topic: str, partition: int) -> None:
    """Take one sequence number of ``partition`` that no batch will carry."""
    producer._txn_manager.increment_sequence_number(TopicPartition(topic, partition), 1)


async def read_all(bootstrap: str, topic: str, partition: int) -> list[bytes]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        consumer.seek(tp, (await consumer.beginning_offsets([tp]))[tp])
        values: list[bytes] = []
        while await consumer.position(tp) < end:
            for records in (await consumer.getmany(tp, timeout_ms=1000)).values():
                values += [r.value for r in records]
        return values
    finally:
        await consumer.stop()


async def test_a_raw_idempotent_producer_with_a_sequence_gap_never_delivers_again(
    stack: Stack,
) -> None:
    """The control: what the gateway lived with for 6.5 minutes."""
    bootstrap = stack.cfg.kafka.bootstrap
    topic = await new_topic(bootstrap)
    producer = idempotent(bootstrap)
    await producer.start()
    try:
        await (await producer.send(topic, b"before", partition=0))
        open_gap(producer, topic, 0)
        for i in range(3):
            with pytest.raises(OutOfOrderSequenceNumber):
                await (await producer.send(topic, f"after-{i}".encode(), partition=0))
        await (await producer.send(topic, b"other", partition=1))  # other partitions still work
    finally:
        await producer.stop()
    assert await read_all(bootstrap, topic, 0) == [b"before"]


async def test_the_recovering_producer_replaces_itself_and_resends_in_order_exactly_once(
    stack: Stack,
) -> None:
    bootstrap = stack.cfg.kafka.bootstrap
    topic = await new_topic(bootstrap)
    registry = CollectorRegistry()
    counter = replaced_counter(registry, "gateway")
    producer = RecoveringProducer(
        lambda: idempotent(bootstrap),
        name="requests",
        idempotent=True,
        resend=True,
        on_replaced=lambda reason: counter.labels(producer="requests", reason=reason).inc(),
    )
    await producer.start()
    try:
        await (await producer.send(topic, b"m0", partition=0))
        first = producer.producer
        open_gap(first, topic, 0)
        futures = [await producer.send(topic, f"m{i}".encode(), partition=0) for i in (1, 2, 3)]
        futures.append(await producer.send(topic, b"p1", partition=1))
        metadata = [await f for f in futures]
        later = await (await producer.send(topic, b"m4", partition=0))
    finally:
        await producer.stop()
    assert [m.partition for m in metadata] == [0, 0, 0, 1] and later.partition == 0
    assert producer.producer is not first and producer.replacements == 1
    assert await read_all(bootstrap, topic, 0) == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert await read_all(bootstrap, topic, 1) == [b"p1"]
    sample = registry.get_sample_value(
        "qim_gateway_producer_replaced_total",
        {"producer": "requests", "reason": "OutOfOrderSequenceNumber"},
    )
    assert sample == 1
