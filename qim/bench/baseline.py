"""The Kafka baseline: the send path's hops as plain aiokafka relays, nothing else.

The send path crosses four topics: gateway -> conversation-requests -> writer -> outbox ->
fanout -> dispatch -> mailbox -> to-gateway -> gateway. Here a producer writes the same
number of records of the same size at the same open-loop rate into the first of four
temporary topics; three relays (consume, produce every record on, ``getmany`` batches with
the producer futures gathered per batch, the fastest plain-aiokafka shape of
faust-kafka-notes section 7) carry them to a sink that measures latency from each record's
intended send time. Producer settings are the workers' (``acks=all``). What qim costs on
top of this is what qim does: admission, sequencing, RocksDB, fan-out, sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
import uuid
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from qim.bench.histogram import Samples
from qim.bench.schedule import run_open_loop, timetable
from qim.devstack.stack import wait_topics_visible

__all__ = ["BaselineSpec", "run_baseline"]

_STAMP = struct.Struct(">d")  # the intended send time, monotonic seconds, at the record's head
_ASSIGN_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class BaselineSpec:
    count: int
    record_bytes: int = 200
    rate: float | None = None  # None: as fast as the producer goes
    topics: int = 4
    partitions: int = 4
    drain_s: float = 60.0


def _producer(bootstrap: str) -> AIOKafkaProducer:
    return AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")


def _consumer(bootstrap: str, topic: str, group: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest"
    )


async def _assigned(consumer: AIOKafkaConsumer) -> None:
    deadline = time.monotonic() + _ASSIGN_TIMEOUT_S
    while not consumer.assignment():
        if time.monotonic() > deadline:
            raise TimeoutError("baseline consumer got no partitions")
        await asyncio.sleep(0.05)


async def _relay(consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, out: str) -> None:
    while True:
        batches = await consumer.getmany(timeout_ms=100, max_records=2000)
        futures = [
            await producer.send(out, record.value, key=record.key)
            for records in batches.values()
            for record in records
        ]
        if futures:
            await asyncio.gather(*futures)
            await consumer.commit()


async def _sink(
    consumer: AIOKafkaConsumer, count: int, latency: Samples, done: list[float]
) -> None:
    while len(latency) < count:
        batches = await consumer.getmany(timeout_ms=100, max_records=2000)
        now = time.monotonic()
        for records in batches.values():
            for record in records:
                assert record.value is not None
                (intended,) = _STAMP.unpack_from(record.value)
                latency.add((now - intended) * 1000)
                done.append(now)


async def run_baseline(bootstrap: str, spec: BaselineSpec) -> dict[str, Any]:
    """Throughput and end-to-end latency through ``spec.topics`` topics; temporary topics are
    deleted afterwards."""
    run = uuid.uuid4().hex[:8]
    names = [f"qim-bench-baseline-{run}-{i}" for i in range(spec.topics)]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    tasks: list[asyncio.Task[None]] = []
    clients: list[AIOKafkaConsumer | AIOKafkaProducer] = []
    try:
        await admin.create_topics([NewTopic(n, spec.partitions, 1) for n in names])
        await wait_topics_visible(admin, dict.fromkeys(names, spec.partitions))
        consumers = [_consumer(bootstrap, n, f"qim-bench-{run}-{i}") for i, n in enumerate(names)]
        producers = [_producer(bootstrap) for _ in names[:-1]]
        head = _producer(bootstrap)
        clients = [*consumers, *producers, head]
        await asyncio.gather(*(c.start() for c in clients))
        await asyncio.gather(*(_assigned(c) for c in consumers))
        for i in range(spec.topics - 1):
            tasks.append(asyncio.create_task(_relay(consumers[i], producers[i], names[i + 1])))
        latency, done = Samples(), list[float]()
        sink = asyncio.create_task(_sink(consumers[-1], spec.count, latency, done))
        tasks.append(sink)
        pad = b"x" * max(0, spec.record_bytes - _STAMP.size)
        pending: list[asyncio.Future[Any]] = []

        def fire(index: int, intended: float) -> None:
            value = _STAMP.pack(intended) + pad
            key = str(index % 1024).encode()
            pending.append(asyncio.ensure_future(head.send(names[0], value, key=key)))

        start = time.monotonic() + 0.05
        if spec.rate is None:
            for i in range(spec.count):
                fire(i, time.monotonic())
                if i % 500 == 499:
                    await asyncio.sleep(0)  # let the relays run meanwhile
        else:
            times = timetable(spec.rate, spec.count / spec.rate, start)
            await run_open_loop(times, fire, clock=time.monotonic, sleep=asyncio.sleep)
        await asyncio.gather(*pending)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(sink), spec.drain_s)
        span = max((max(done) if done else time.monotonic()) - start, 1e-9)
        return {
            "count": spec.count,
            "received": len(latency),
            "record_bytes": spec.record_bytes,
            "topics": spec.topics,
            "partitions": spec.partitions,
            "target_rate": spec.rate,
            "achieved_rate": round(len(latency) / span, 2),
            "latency_ms": latency.summary(),
        }
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(c.stop() for c in clients), return_exceptions=True)
        with contextlib.suppress(Exception):
            await admin.delete_topics(names)
        await admin.close()
