"""Log identity (17.2): the broker's cluster id and KIP-516 topic id, and a recreated topic."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable
from pathlib import Path

import msgspec
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from qim.agents.writer.partition import PartitionWriter
from qim.agents.writer.restore import RestoreResult, restore_partition
from qim.agents.writer.snapshot import Checkpoint, checkpoint_records
from qim.devstack.stack import Stack
from qim.schemas.log_identity import LogIdentity, LogIdentityMismatch, identity_mismatch
from qim.streams.identity import fetch_log_identities, fetch_log_identity
from qim.tables.message_store import MessageStore
from tests.integration.kafka_util import create_topic, list_topics, wait_for
from tests.integration.writer_workers import PrivatePartition


def _delete(bootstrap: str, name: str) -> None:
    async def run() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([name])
        finally:
            await admin.close()

    asyncio.run(run())


def test_identity_names_the_cluster_and_the_topic(stack: Stack) -> None:
    bootstrap = stack.cfg.kafka.bootstrap
    create_topic(bootstrap, "ident-a", 3)
    create_topic(bootstrap, "ident-b", 5)
    both = asyncio.run(fetch_log_identities(bootstrap, ["ident-a", "ident-b"]))
    cluster_id = (stack.cfg.kafka.base_dir / "cluster.id").read_text().strip()
    assert {i.cluster_id for i in both.values()} == {cluster_id}
    assert (both["ident-a"].partition_count, both["ident-b"].partition_count) == (3, 5)
    assert both["ident-a"].topic_id != both["ident-b"].topic_id
    assert both["ident-a"].topic_id != "0" * 32 and len(both["ident-a"].topic_id) == 32
    assert identity_mismatch(both["ident-a"], both["ident-a"]) is None


def test_a_recreated_topic_has_a_new_identity_and_fails_closed(stack: Stack) -> None:
    bootstrap = stack.cfg.kafka.bootstrap
    create_topic(bootstrap, "ident-re", 2)
    before = asyncio.run(fetch_log_identity(bootstrap, "ident-re"))
    _delete(bootstrap, "ident-re")
    wait_for(lambda: "ident-re" not in list_topics(bootstrap), 30, "ident-re deleted")
    create_topic(bootstrap, "ident-re", 2)
    after = asyncio.run(fetch_log_identity(bootstrap, "ident-re"))
    assert after.topic_id != before.topic_id
    reason = identity_mismatch(before, after)
    assert reason is not None and "recreated" in reason


def _restore(part: PrivatePartition, name: str) -> Awaitable[RestoreResult]:
    return restore_partition(
        0,
        bootstrap=part.bootstrap,
        outbox_topic=part.names["outbox"],
        snapshots_topic=part.names["snap"],
        store_path=part.store_path(name),
        open_store=MessageStore,
        dormant=None,
        config=part.options.config,
        region_id=0,
        mailbox_shard_count=part.options.mailbox_shard_count,
        transactional_id=f"it-ident-{part.run}-{name}",
        transaction_timeout_ms=60_000,
        client_id=f"it-ident-{name}",
    )


def _checkpoint(part: PrivatePartition, identity: LogIdentity | None) -> Checkpoint:
    empty = PartitionWriter.restored(
        0, None, MessageStore(Path(tempfile.mkdtemp()) / "s"), config=part.options.config,
        region_id=0, mailbox_shard_count=part.options.mailbox_shard_count,
    )  # fmt: skip
    try:
        return msgspec.structs.replace(empty.checkpoint(-1), outbox_identity=identity)
    finally:
        empty.close()


def test_the_writer_refuses_a_checkpoint_of_another_log(stack: Stack, tmp_path: Path) -> None:
    """17.2: missing identity, another topic id or another partition count -> fail closed."""

    async def run() -> None:
        part = await PrivatePartition.create(stack.cfg.kafka.bootstrap, tmp_path)
        live = await fetch_log_identity(part.bootstrap, part.names["outbox"])
        other_topic = msgspec.structs.replace(live, topic_id="ab" * 16)
        wider = msgspec.structs.replace(live, partition_count=live.partition_count + 1)
        for n, bad in enumerate((None, other_topic, wider)):
            await _produce_checkpoint(part, _checkpoint(part, bad))
            with pytest.raises(LogIdentityMismatch):
                await _restore(part, f"bad{n}")
        await _produce_checkpoint(part, _checkpoint(part, live))
        result = await _restore(part, "good")
        try:
            assert result.writer.checkpoint_offset == -1
            assert result.writer.outbox_identity == live
            assert result.writer.checkpoint(-1).outbox_identity == live  # carried forward
        finally:
            await result.producer.stop()
            result.writer.close()

    asyncio.run(run())


async def _produce_checkpoint(part: PrivatePartition, checkpoint: Checkpoint) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=part.bootstrap, acks="all")
    await producer.start()
    try:
        for key, value in checkpoint_records(checkpoint):
            await (await producer.send(part.names["snap"], value, key=key, partition=0))
    finally:
        await producer.stop()
