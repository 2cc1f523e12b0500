"""``OwnedPartition`` round 5 (issue 13): what a transaction no longer waits for in series.

* the request offsets are handed to the transaction while the outbox acknowledgements are still
  outstanding, and the commit still comes only after them (``early_offsets``);
* a committed transaction's replies are still acknowledged before ``process`` returns (the
  background hand-off was measured and reverted, bench/README.md round 5).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.unit.agents.support import (
    FakeProducer,
    RecordMetadata,
    Sent,
    consumed,
    create,
    group_on,
    new_writer,
    owned,
)

P = 3


@dataclass
class HeldAcks(FakeProducer):
    """A transactional double whose send acknowledgements wait for ``release``; ``log`` says
    in which order the outbox sends, the offsets and the acknowledgements happened."""

    log: list[str] = field(default_factory=list)
    held: list[tuple[asyncio.Future[RecordMetadata], int]] = field(default_factory=list)

    async def send(
        self, topic: str, value: bytes, key: bytes | None = None, partition: int | None = None
    ) -> asyncio.Future[RecordMetadata]:
        done = await super().send(topic, value, key, partition)
        future: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        self.held.append((future, done.result().offset))
        self.log.append(f"send:{topic}")
        return future

    def release(self) -> None:
        self.log.append("acks")
        for future, offset in self.held:
            future.set_result(RecordMetadata(offset))
        self.held.clear()

    async def send_offsets_to_transaction(self, offsets: dict[Any, Any], group_id: str) -> None:
        self.log.append("offsets")
        await super().send_offsets_to_transaction(offsets, group_id)

    async def commit_transaction(self) -> None:
        self.log.append("commit")
        await super().commit_transaction()


@dataclass
class ReplyProducer:
    """The non-transactional reply producer's double: acknowledgements wait for ``ack``."""

    sent: list[Sent] = field(default_factory=list)
    pending: list[asyncio.Future[RecordMetadata]] = field(default_factory=list)

    async def send(
        self, topic: str, value: bytes, key: bytes | None = None, partition: int | None = None
    ) -> asyncio.Future[RecordMetadata]:
        assert partition is not None
        self.sent.append(Sent(topic, partition, key, value, len(self.sent)))
        future: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        self.pending.append(future)
        return future

    def ack(self) -> None:
        for i, future in enumerate(self.pending):
            future.set_result(RecordMetadata(i))
        self.pending.clear()


async def _until(condition: Any) -> None:
    """Let the loop run until ``condition`` holds (a bounded number of turns, not a time)."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def test_the_offsets_go_to_the_transaction_before_the_outbox_is_acknowledged(
    tmp_path: Path,
) -> None:
    writer, producer = new_writer(tmp_path / "s", P), HeldAcks()
    group = group_on(P)
    part = owned(writer, producer)
    task = asyncio.create_task(part.process(consumed([create("alice", group, ("bob",))])))
    await _until(lambda: "offsets" in producer.log)
    assert "acks" not in producer.log and producer.transactions == 0
    producer.release()
    await task
    assert producer.log.index("offsets") < producer.log.index("acks") < producer.log.index("commit")
    assert producer.transactions == 1 and list(producer.group_offsets.values()) == [1]


async def test_without_early_offsets_the_offsets_follow_the_acknowledgements(
    tmp_path: Path,
) -> None:
    writer, producer = new_writer(tmp_path / "s", P), HeldAcks()
    part = owned(writer, producer, early_offsets=False)
    task = asyncio.create_task(part.process(consumed([create("alice", group_on(P), ())])))
    await _until(lambda: bool(producer.held))
    for _ in range(5):
        await asyncio.sleep(0)
    assert "offsets" not in producer.log
    producer.release()
    await task
    assert producer.log[-3:] == ["acks", "offsets", "commit"]


async def test_a_failed_acknowledgement_aborts_with_the_offsets_already_requested(
    tmp_path: Path,
) -> None:
    writer, producer = new_writer(tmp_path / "s", P), HeldAcks()
    part = owned(writer, producer)
    task = asyncio.create_task(part.process(consumed([create("alice", group_on(P), ())])))
    await _until(lambda: "offsets" in producer.log)
    producer.held[0][0].set_exception(RuntimeError("not durable"))
    try:
        await task
    except RuntimeError as exc:
        assert "not durable" in str(exc)
    else:
        raise AssertionError("the failed acknowledgement did not propagate")
    assert producer.aborted == 1 and producer.committed == [] and producer.group_offsets == {}
    assert writer.store.applied_offset == -1


async def test_the_partition_waits_for_its_reply_acks(tmp_path: Path) -> None:
    writer, producer, replies = new_writer(tmp_path / "s", P), FakeProducer(), ReplyProducer()
    part = owned(writer, producer, reply_producer=replies)
    task = asyncio.create_task(part.process(consumed([create("alice", group_on(P), ())])))
    await _until(lambda: bool(replies.pending))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done() and producer.transactions == 1
    replies.ack()
    await task
