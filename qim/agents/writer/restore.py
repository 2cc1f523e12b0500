"""Taking a partition over: fence the former owner, then rebuild the state from the log.

The order is the point (direction.md 4.6, spec 19.2.3):

1. **Fence.** Start the partition's transactional producer (``transactional_id =
   qim-conversation-writer-<p>``). Its InitProducerId bumps the producer epoch of that id: the
   former owner's open transaction is aborted and its next send or commit fails with
   ProducerFenced. From here on nobody else can commit to outbox p.
2. **Checkpoint.** Read the newest checkpoint of ``qim.writer-snapshots`` partition p
   (read_committed; ``writer_snapshot`` explains the chunks).
3. **Replay.** Read ``qim.outbox`` partition p (read_committed) from the checkpoint's offset + 1
   (or from where the MessageStore stopped, if that is earlier) up to the end offset, which a
   read_committed consumer gets as the last stable offset: after step 1 it is final. Every record
   goes through ``PartitionWriter.replay`` -- the writer core, GroupMembership and the
   MessageStore archiver. The HLC is part of the writer state, so it is restored before the
   first id is assigned.
4. **Raise the fencing epoch** above every epoch in the log (``PartitionWriter.take_over``).

Every checkpoint is bound to the outbox's identity (cluster id, topic id, partition count; spec
17.2): a checkpoint of another log -- a recreated outbox, another cluster, or one written before
the binding existed -- is refused with :class:`LogIdentityMismatch` and the partition is not
served (fail closed; the service retries and logs why).

A MessageStore that claims more of the outbox than the log holds (a re-created topic) is wiped
and rebuilt; a store that is behind (a crash before its write, a wiped datadir) catches up in
step 3. A partition kept from the previous assignment ("dormant") skips step 2 and replays only
what others committed since. The service pauses the partition's requests until this returns.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from qim.agents.writer.partition import PartitionWriter
from qim.agents.writer.snapshot import Checkpoint, latest_checkpoint
from qim.core.conversation import WriterConfig
from qim.schemas.log_identity import LogIdentity, LogIdentityMismatch, identity_mismatch
from qim.schemas.records import decode_outbox_record
from qim.streams.identity import fetch_log_identity
from qim.tables.message_store import MessageStore

__all__ = ["RestoreResult", "check_bound", "fenced_producer", "restore_partition"]

log = logging.getLogger(__name__)

_FIRST_WINDOW = 16
_READ_TIMEOUT_S = 120.0


async def fenced_producer(
    bootstrap: str, transactional_id: str, *, transaction_timeout_ms: int, client_id: str
) -> AIOKafkaProducer:
    """The partition's transactional producer, started; the former owner is fenced on return."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        transactional_id=transactional_id,
        transaction_timeout_ms=transaction_timeout_ms,
        acks="all",
        enable_idempotence=True,
        linger_ms=0,
    )
    await producer.start()
    try:
        # begin waits for InitProducerId (the fencing step); an empty abort costs no round trip
        await producer.begin_transaction()
        await producer.abort_transaction()
    except BaseException:
        await producer.stop()
        raise
    return producer


class _LogReader:
    """A read_committed consumer assigned to one partition's snapshot and outbox partitions.

    Both bounds are read before the first fetch: a broker answers one connection's requests in
    order, so a ListOffsets sent behind a long-polling Fetch waits for it. Re-assigning a started
    consumer costs a metadata round, and aiokafka 0.14 can hang in ``stop()`` after one, so
    both partitions are assigned once.
    """

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self.consumer = consumer
        self.bounds: dict[TopicPartition, tuple[int, int]] = {}

    @classmethod
    async def open(cls, bootstrap: str, client_id: str, *tps: TopicPartition) -> _LogReader:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            client_id=client_id,
            isolation_level="read_committed",
            enable_auto_commit=False,
            fetch_max_wait_ms=100,
        )
        await consumer.start()
        reader = cls(consumer)
        try:
            consumer.assign(list(tps))
            consumer.pause(*tps)
            begins = await consumer.beginning_offsets(list(tps))
            ends = await consumer.end_offsets(list(tps))  # read_committed: last stable offsets
            reader.bounds = {tp: (begins[tp], ends[tp]) for tp in tps}
        except BaseException:
            await consumer.stop()
            raise
        return reader

    async def records(self, tp: TopicPartition, start: int, end: int) -> AsyncIterator[list[Any]]:
        """Committed records of ``tp`` with ``start <= offset < end``, in fetch batches."""
        consumer = self.consumer
        consumer.pause(*consumer.assignment())
        consumer.resume(tp)
        consumer.seek(tp, start)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _READ_TIMEOUT_S
        while await consumer.position(tp) < end:
            if loop.time() > deadline:
                raise TimeoutError(f"reading {tp} up to {end} took over {_READ_TIMEOUT_S} s")
            fetched = await consumer.getmany(tp, timeout_ms=500, max_records=2000)
            batch = [m for m in fetched.get(tp, ()) if m.offset < end]
            if batch:
                yield batch
        consumer.pause(tp)

    async def close(self) -> None:
        await self.consumer.stop()


async def read_checkpoint(reader: _LogReader, tp: TopicPartition) -> Checkpoint | None:
    """The newest committed checkpoint of ``tp``: read the tail, widen until it is whole."""
    begin, end = reader.bounds[tp]
    window = _FIRST_WINDOW
    while True:
        start = max(begin, end - window)
        values = [m.value async for batch in reader.records(tp, start, end) for m in batch]
        found = latest_checkpoint(values)
        if found.checkpoint is not None or start == begin:
            if not found.complete:
                log.error("%s: the newest checkpoint is incomplete; replaying without one", tp)
            return found.checkpoint
        window *= 4


def check_bound(checkpoint: Checkpoint | None, live: LogIdentity, tp: TopicPartition) -> None:
    """Refuse a checkpoint written on another log than ``live`` (17.2)."""
    if checkpoint is None:
        return
    reason = identity_mismatch(checkpoint.outbox_identity, live)
    if reason is not None:
        raise LogIdentityMismatch(
            f"{tp}: checkpoint at offset {checkpoint.outbox_offset}: {reason}; refusing to "
            "restore from it (replay the outbox into an empty state, or restore the original log)"
        )


class AheadOfLogError(ValueError):
    """The local state claims outbox offsets the log does not have (a re-created topic)."""


async def _replay(reader: _LogReader, tp: TopicPartition, writer: PartitionWriter) -> int:
    begin, end = reader.bounds[tp]
    if max(writer.applied_offset, writer.store.applied_offset) >= end:
        raise AheadOfLogError(f"{tp}: local state claims offsets beyond the log end {end}")
    start = min(writer.applied_offset, writer.store.applied_offset) + 1
    if start < begin:
        log.warning("%s: outbox starts at %d, state needs %d (retention)", tp, begin, start)
        start = begin
    count = 0
    async for batch in reader.records(tp, start, end):
        for message in batch:
            writer.replay(decode_outbox_record(message.value), message.offset)
        count += len(batch)
    writer.flush_replay()
    return count


class RestoreResult:
    """A restored partition: its state, its fenced producer, what the replay applied."""

    def __init__(self, writer: PartitionWriter, producer: AIOKafkaProducer, read: int) -> None:
        self.writer = writer
        self.producer = producer
        self.read = read
        """Outbox records read (applied to the state, or only archived into the store)."""


async def restore_partition(
    partition: int,
    *,
    bootstrap: str,
    outbox_topic: str,
    snapshots_topic: str,
    store_path: Path,
    open_store: Callable[[Path], MessageStore],
    dormant: PartitionWriter | None,
    config: WriterConfig,
    region_id: int,
    mailbox_shard_count: int,
    transactional_id: str,
    transaction_timeout_ms: int,
    client_id: str,
) -> RestoreResult:
    """Steps 1-4 of the module docstring for ``partition``."""
    producer = await fenced_producer(
        bootstrap,
        transactional_id,
        transaction_timeout_ms=transaction_timeout_ms,
        client_id=client_id,
    )
    snapshots = TopicPartition(snapshots_topic, partition)
    outbox = TopicPartition(outbox_topic, partition)
    writer = dormant
    reader: _LogReader | None = None
    try:
        live = await fetch_log_identity(bootstrap, outbox_topic)
        if writer is not None and writer.outbox_identity != live:
            writer.close()
            writer = None  # a dormant state of another log: rebuild from this one
        reader = await _LogReader.open(bootstrap, f"{client_id}-restore", snapshots, outbox)
        if writer is None:
            checkpoint = await read_checkpoint(reader, snapshots)
            check_bound(checkpoint, live, snapshots)
            writer = PartitionWriter.restored(
                partition,
                checkpoint,
                open_store(store_path),
                config=config,
                region_id=region_id,
                mailbox_shard_count=mailbox_shard_count,
            )
        try:
            read = await _replay(reader, outbox, writer)
        except AheadOfLogError as exc:
            log.error("%s; wiping the local MessageStore and rebuilding", exc)
            writer.close()
            shutil.rmtree(store_path, ignore_errors=True)
            checkpoint = await read_checkpoint(reader, snapshots)
            check_bound(checkpoint, live, snapshots)
            writer = PartitionWriter.restored(
                partition,
                checkpoint,
                open_store(store_path),
                config=config,
                region_id=region_id,
                mailbox_shard_count=mailbox_shard_count,
            )
            read = await _replay(reader, outbox, writer)
        writer.outbox_identity = live
        writer.take_over()
        return RestoreResult(writer, producer, read)
    except BaseException:
        await producer.stop()
        if writer is not None and writer is not dormant:
            writer.close()
        raise
    finally:
        if reader is not None:
            await reader.close()
