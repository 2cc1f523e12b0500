"""The MailboxNode's device_token_digest cache follows the compacted topic (spec 16.6):
registrations appear, tombstones remove, and the lag gauge reads 0 once caught up."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaProducer
from prometheus_client import CollectorRegistry

from qim.agents.mailbox.offline_push import DigestFollower
from qim.devstack.stack import Stack
from qim.schemas.records.notify import DeviceKey, DeviceTokenDigest, encode
from qim.streams.topics import DEVICE_TOKEN_DIGEST

pytestmark = pytest.mark.integration


async def test_digest_cache_applies_registrations_and_tombstones(stack: Stack) -> None:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    producer = AIOKafkaProducer(bootstrap_servers=stack.cfg.kafka.bootstrap, acks="all")
    await producer.start()
    registry = CollectorRegistry()
    partitions = stack.cfg.partition_counts["mailbox_shard_count"]
    follower = DigestFollower(
        stack.cfg.kafka.bootstrap, DEVICE_TOKEN_DIGEST.name, partitions, registry
    )
    follower.start()
    try:
        phone, tablet = DeviceKey(tenant, "u", "phone"), DeviceKey(tenant, "u", "tablet")
        value = encode(DeviceTokenDigest(provider="APNS"))
        for key in (phone, tablet):
            await producer.send_and_wait(
                DEVICE_TOKEN_DIGEST.name, value, key=key.encode(), partition=3
            )
        await producer.send_and_wait(
            DEVICE_TOKEN_DIGEST.name, None, key=phone.encode(), partition=3
        )
        barrier = DeviceKey(tenant, "v", "phone")
        await producer.send_and_wait(
            DEVICE_TOKEN_DIGEST.name, value, key=barrier.encode(), partition=3
        )
        deadline = asyncio.get_running_loop().time() + 60
        while not follower.cache.devices(tenant, "v"):
            assert asyncio.get_running_loop().time() < deadline, "the barrier never arrived"
            await asyncio.sleep(0.1)
        assert follower.cache.devices(tenant, "u") == ("tablet",)
        assert registry.get_sample_value("device_token_digest_lag") == 0.0
    finally:
        await follower.stop()
        await producer.stop()
