"""The topology replay of one MessageStore: rebuild a writer partition's history from the outbox.

Why: the MessageStore is derived state (ADR-0018: a pure function of committed outbox records),
so an operator must be able to prove it -- or rebuild it -- from the log while the system runs:

1. open the live store as a RocksDB *secondary* (no lock) and read how far it has applied the
   outbox (``applied_offset``);
2. read outbox partition p (read_committed: aborted zombie output is invisible, as to the
   writer) from its start through that offset and fold it with the writer's own restore path
   (``PartitionWriter.replay``: writer core, membership, archiver) into a fresh store;
3. compare every history and participant row byte for byte (:func:`store_digest`). The
   applied-offset key is reported, not compared: the live writer stores the offset of its
   transaction's last record, the replay the last *archived* one, and they differ when a
   transaction ends in a record that writes no row (a group create).

When retention has already deleted the start of the outbox, rows older than the log cannot be
rebuilt: the report then checks that every rebuilt row is in the live store unchanged and counts
the live-only rows as ``beyond_log``, instead of calling the stores identical.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from qim.agents.writer.options import WriterOptions
from qim.agents.writer.partition import PartitionWriter
from qim.core.mailbox import diff_stores, store_digest
from qim.schemas.records import decode_outbox_record
from qim.tables.message_store import MessageStore

__all__ = ["HistoryReplayReport", "replay_history_partition"]

Progress = Callable[[int, int], None]
"""``(records_read, records_expected)`` after every fetched run."""

_OFFSET_KEY = b"\x00outbox-offset"
_MAX_DIFFS = 20


@dataclass(frozen=True)
class HistoryReplayReport:
    """One partition's verdict; ``ok`` is what an operator or a test checks."""

    partition: int
    applied_offset: int
    log_start: int
    records_read: int
    live_digest: bytes
    replay_digest: bytes
    identical: bool
    beyond_log: int
    out_dir: Path
    differences: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.identical or (self.log_start > 0 and not self.differences)

    def lines(self) -> list[str]:
        verdict = "identical" if self.identical else (
            f"consistent ({self.beyond_log} rows older than the log start)"
            if self.ok else "DIFFERENT"
        )  # fmt: skip
        return [
            f"partition {self.partition}: {verdict}",
            f"outbox read from offset {self.log_start} through {self.applied_offset}: "
            f"{self.records_read} records",
            f"live   {self.live_digest.hex()}",
            f"replay {self.replay_digest.hex()}  ({self.out_dir})",
            *self.differences,
        ]


def _rows(store: MessageStore) -> Iterator[tuple[bytes, bytes]]:
    return ((k, v) for k, v in store.items() if k != _OFFSET_KEY)


async def _fold(
    options: WriterOptions,
    partition: int,
    through: int,
    writer: PartitionWriter,
    progress: Progress | None,
) -> tuple[int, int]:
    """Replay ``[log start, through]`` into ``writer``; returns (log start, records read)."""
    tp = TopicPartition(options.outbox_topic, partition)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=options.bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await consumer.start()
    read = 0
    try:
        consumer.assign([tp])
        start = (await consumer.beginning_offsets([tp]))[tp]
        end = (await consumer.end_offsets([tp]))[tp]
        last = min(through, end - 1)
        consumer.seek(tp, start)
        while last >= start and await consumer.position(tp) <= last:
            fetched = await consumer.getmany(tp, timeout_ms=500, max_records=2000)
            for record in fetched.get(tp, ()):
                if record.offset > last:
                    break
                read += 1
                writer.replay(decode_outbox_record(record.value), record.offset)
            if progress is not None:
                progress(read, last - start + 1)
        writer.flush_replay()
        return start, read
    finally:
        await consumer.stop()


def _require_fresh(out_dir: Path) -> None:
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} exists: replay writes a fresh store")


async def replay_history_partition(
    options: WriterOptions, partition: int, out_dir: Path, progress: Progress | None = None
) -> HistoryReplayReport:
    """Rebuild ``partition``'s MessageStore into ``out_dir`` (must not exist) and compare."""
    _require_fresh(out_dir)
    with tempfile.TemporaryDirectory(prefix="qim-history-secondary-") as secondary:
        live = MessageStore(
            options.store_path(partition), options.store_caps, secondary_path=Path(secondary)
        )
        try:
            applied = live.applied_offset
            writer = PartitionWriter.restored(
                partition,
                None,
                MessageStore(out_dir, options.store_caps),
                config=options.config,
                region_id=options.region_id,
                mailbox_shard_count=options.mailbox_shard_count,
            )
            try:
                start, read = await _fold(options, partition, applied, writer, progress)
                left, right = dict(_rows(live)), dict(_rows(writer.store))
            finally:
                writer.close()
        finally:
            live.close()
    live_digest, replay_digest = store_digest(left.items()), store_digest(right.items())
    identical = live_digest == replay_digest
    beyond_log = 0
    differences: list[str] = []
    if not identical:
        if start > 0:  # rows older than the log cannot be rebuilt: compare what can be
            beyond_log = len(left.keys() - right.keys())
            left = {k: v for k, v in left.items() if k in right}
        differences = diff_stores(left.items(), right.items())[:_MAX_DIFFS]
    return HistoryReplayReport(
        partition=partition,
        applied_offset=applied,
        log_start=start,
        records_read=read,
        live_digest=live_digest,
        replay_digest=replay_digest,
        identical=identical,
        beyond_log=beyond_log,
        out_dir=out_dir,
        differences=differences,
    )
