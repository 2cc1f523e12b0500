"""Small synchronous helpers over aiokafka for tests: create, produce, inspect offsets."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from qim.devstack.stack import wait_topics_visible


def create_topic(bootstrap: str, name: str, partitions: int, **configs: str) -> None:
    async def run() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs)])
            await wait_topics_visible(admin, {name: partitions})
        finally:
            await admin.close()

    asyncio.run(run())


def topic_config(bootstrap: str, name: str) -> dict[str, str]:
    async def run() -> dict[str, str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            res = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])
            entries = res[0].resources[0][4]
            return {e[0]: e[1] for e in entries}
        finally:
            await admin.close()

    return asyncio.run(run())


def list_topics(bootstrap: str) -> set[str]:
    async def run() -> set[str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            return set(await admin.list_topics())
        finally:
            await admin.close()

    return asyncio.run(run())


def produce(bootstrap: str, topic: str, records: Sequence[tuple[bytes, bytes]]) -> None:
    """Produce with acks=all and wait for every acknowledgement."""

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            futs = [await producer.send(topic, value=v, key=k) for k, v in records]
            await asyncio.gather(*futs)
        finally:
            await producer.stop()

    asyncio.run(run())


def group_caught_up(bootstrap: str, group: str, topic: str) -> bool:
    """True when `group` has committed every partition of `topic` up to its end offset."""

    async def run() -> bool:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await consumer.start()
        await admin.start()
        try:
            parts = consumer.partitions_for_topic(topic) or set()
            if not parts:
                await consumer._client.force_metadata_update()
                parts = consumer.partitions_for_topic(topic) or set()
            tps = [TopicPartition(topic, p) for p in sorted(parts)]
            ends = await consumer.end_offsets(tps)
            committed = await admin.list_consumer_group_offsets(group)
            for tp in tps:
                meta = committed.get(tp)
                if ends[tp] > 0 and (meta is None or meta.offset < ends[tp]):
                    return False
            return True
        finally:
            await consumer.stop()
            await admin.close()

    return asyncio.run(run())


def wait_for(
    check: object,
    timeout_s: float,
    what: str,
    interval_s: float = 0.25,
    diagnose: Callable[[], str] | None = None,
) -> None:
    """Poll a zero-argument callable until it returns truthy; `diagnose` adds context on failure."""
    assert callable(check)
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return
        time.sleep(interval_s)
    extra = f"\n{diagnose()}" if diagnose is not None else ""
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last: {last!r}{extra}")
