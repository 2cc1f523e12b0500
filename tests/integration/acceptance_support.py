"""Helpers of test_mailbox_acceptance: a request without the SHARD_MOVED retry, and writing
the mailbox group's committed offset metadata (the published W_floor) from outside."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from qim.agents.mailbox.options import GROUP_ID
from qim.schemas.records.user_requests import (
    MailboxReply,
    PullMailboxRequest,
    SyncAuthRequest,
    encode_user_record,
)
from qim.streams.topics import DISPATCH, USER_REQUESTS
from tests.integration.mailbox_support import Client, shard_of


async def call_once(
    client: Client, request: SyncAuthRequest | PullMailboxRequest, within: float = 30.0
) -> MailboxReply:
    """Send ``request`` once and return its reply as is (SHARD_MOVED included)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    correlation = uuid.uuid4().hex
    sent = msgspec.structs.replace(request, correlation_id=correlation)
    partition = shard_of(request.tenant_id, request.user_id)
    await client._producer.send_and_wait(
        USER_REQUESTS.name, encode_user_record(sent), key=sent.key, partition=partition
    )
    while not client.replies.get(correlation):
        assert loop.time() < deadline, f"no reply to {request!r}"
        client._arrived.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(client._arrived.wait(), 0.5)
    return client.replies[correlation][0]


async def commit_dispatch_metadata(bootstrap: str, shard: int, offset: int, metadata: str) -> None:
    """Commit ``offset`` with ``metadata`` for the dispatch partition ``shard`` in the
    MailboxNodes' group (which must have no live member)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=GROUP_ID, enable_auto_commit=False
    )
    await consumer.start()
    try:
        tp = TopicPartition(DISPATCH.name, shard)
        consumer.assign([tp])
        await consumer.commit({tp: OffsetAndMetadata(offset, metadata)})
    finally:
        await consumer.stop()
