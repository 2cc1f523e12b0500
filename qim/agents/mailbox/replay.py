"""The topology replay of one MailboxShard: rebuild its store from the dispatch log, compare.

Why (direction.md 4.2, style.md item 8, spec 26 case 26): "the dispatch log is the mailbox's
changelog" is only true if a store rebuilt from the log equals the live one byte for byte. This
is the independent audit of that claim, usable by tests and by an operator against a running
worker:

1. open the live store as a RocksDB *secondary* (no lock; a consistent view as of the open) and
   read how far it has folded the log (``ShardMeta.applied_seq``);
2. read the shard's dispatch partition from its start up to exactly that offset and fold it with
   the same ``materialize`` into a fresh store under ``out_dir``, batch by batch;
3. compare :func:`~qim.core.mailbox.store_digest` of both.

The live worker also runs the retention sweep, which changes the store without a log record.
Expiry is absolute in log time, so if the raw digests differ only because of sweeps, both stores
swept once more at the live store's log time are equal again: the report says which of the two
equalities held (``identical`` / ``identical_after_sweep``) and lists the first differences.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition

from qim.agents.mailbox.options import MailboxOptions
from qim.agents.mailbox.takeover import IDENTITY_KEY
from qim.core.mailbox import (
    MailboxConfig,
    SliceCache,
    diff_stores,
    materialize,
    retention_sweep,
    store_digest,
)
from qim.core.mailbox.keys import META
from qim.core.mailbox.values import ShardMeta, decode_value
from qim.schemas.records.dispatch import ShardLogRecord, decode_dispatch_record
from qim.schemas.seqs import split_mailbox_seq
from qim.streams.topics import DISPATCH
from qim.tables.mailbox_store import MailboxStore

__all__ = ["Progress", "ReplayReport", "replay_shard", "replay_worker_shard"]

Progress = Callable[[int, int], None]
"""``(records_read, records_expected)`` after every folded batch."""

_MAX_DIFFS = 20


@dataclass(frozen=True)
class ReplayReport:
    """What one replay found; ``ok`` is the verdict an operator or a test checks."""

    shard: int
    shard_epoch: int
    applied_offset: int  # the live store's last folded offset; -1 = nothing folded
    log_start: int
    records_read: int
    live_digest: bytes
    replay_digest: bytes
    identical: bool
    identical_after_sweep: bool
    out_dir: Path
    differences: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.identical or self.identical_after_sweep

    def lines(self) -> list[str]:
        """A human summary, one fact per line."""
        verdict = "identical" if self.identical else (
            "identical after a retention sweep at the live log time"
            if self.identical_after_sweep else "DIFFERENT"
        )  # fmt: skip
        return [
            f"shard {self.shard} epoch {self.shard_epoch}: {verdict}",
            f"log read from offset {self.log_start} through {self.applied_offset}: "
            f"{self.records_read} records",
            f"live   {self.live_digest.hex()}",
            f"replay {self.replay_digest.hex()}  ({self.out_dir})",
            *self.differences,
        ]


def _meta(store: MailboxStore) -> ShardMeta:
    raw = store.get(META)
    return ShardMeta() if raw is None else decode_value(raw, ShardMeta)


def _data(store: MailboxStore) -> Iterator[tuple[bytes, bytes]]:
    """The folded state: everything but the shell's bookkeeping under ``00`` (the log binding
    of ``bind_identity``, the UserConversationState changelog markers)."""
    return ((k, v) for k, v in store.items() if k != IDENTITY_KEY and k[:1] != b"\x00")


def _require_fresh(out_dir: Path) -> None:
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} exists: replay writes a fresh store")


def _swept(store: MailboxStore, now_ms: int, config: MailboxConfig) -> list[tuple[bytes, bytes]]:
    """The store's items as they would be after one more sweep at ``now_ms`` (not written)."""
    items = dict(_data(store))
    for key, value in retention_sweep(store, now_ms, config).ops:
        if value is None:
            items.pop(key, None)
        else:
            items[key] = value
    return sorted(items.items())


class _Log:
    """The partition's records ``[start, through]``, streamed in fetched runs."""

    def __init__(self, bootstrap: str, topic: str, shard: int, through: int) -> None:
        self.tp = TopicPartition(topic, shard)
        self.through = through
        self.start = 0
        self.read = 0
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_committed"
        )  # as the live fold: aborted slices are not part of the log

    async def runs(
        self, progress: Progress | None
    ) -> AsyncIterator[list[tuple[int, ShardLogRecord]]]:
        consumer, tp = self._consumer, self.tp
        await consumer.start()
        try:
            consumer.assign([tp])
            self.start = (await consumer.beginning_offsets([tp]))[tp]
            end = (await consumer.end_offsets([tp]))[tp]
            last = min(self.through, end - 1)
            consumer.seek(tp, self.start)
            while last >= self.start and await consumer.position(tp) <= last:
                fetched = await consumer.getmany(tp, timeout_ms=500, max_records=2000)
                run = []
                for record in fetched.get(tp, ()):
                    if record.offset > last:
                        break
                    self.read += 1
                    try:
                        run.append((record.offset, decode_dispatch_record(record.value)))
                    except (msgspec.DecodeError, msgspec.ValidationError, TypeError):
                        continue  # the live fold skipped it too
                if run:
                    yield run
                if progress is not None:
                    progress(self.read, last - self.start + 1)
        finally:
            await consumer.stop()


async def replay_shard(
    *,
    bootstrap: str,
    shard: int,
    live_path: Path,
    out_dir: Path,
    config: MailboxConfig,
    shard_epoch: int,
    topic: str = DISPATCH.name,
    progress: Progress | None = None,
    store_caps: Mapping[str, Any] | None = None,
) -> ReplayReport:
    """Rebuild ``shard`` into ``out_dir`` (must not exist) and compare with ``live_path``."""
    _require_fresh(out_dir)
    with tempfile.TemporaryDirectory(prefix="qim-replay-secondary-") as secondary:
        live = MailboxStore.secondary(live_path, Path(secondary))
        try:
            meta = _meta(live)
            epoch, offset = split_mailbox_seq(meta.applied_seq)
            applied = offset if meta.applied_seq and epoch == shard_epoch else -1
            log = _Log(bootstrap, topic, shard, applied)
            rebuilt = MailboxStore(out_dir, store_caps)
            try:
                cache = SliceCache()
                async for run in log.runs(progress):
                    result = materialize(
                        rebuilt, run, shard_epoch=shard_epoch, config=config, slice_cache=cache
                    )
                    rebuilt.apply(result.ops)
                live_digest = store_digest(_data(live))
                replay_digest = store_digest(_data(rebuilt))
                identical = live_digest == replay_digest
                after_sweep, differences = identical, []
                if not identical:
                    left = _swept(live, meta.log_now_ms, config)
                    right = _swept(rebuilt, meta.log_now_ms, config)
                    after_sweep = store_digest(left) == store_digest(right)
                    differences = diff_stores(left, right)[:_MAX_DIFFS]
            finally:
                rebuilt.close()
        finally:
            live.close()
    return ReplayReport(
        shard=shard,
        shard_epoch=shard_epoch,
        applied_offset=applied,
        log_start=log.start,
        records_read=log.read,
        live_digest=live_digest,
        replay_digest=replay_digest,
        identical=identical,
        identical_after_sweep=after_sweep,
        out_dir=out_dir,
        differences=differences,
    )


async def replay_worker_shard(
    options: MailboxOptions, shard: int, out_dir: Path, progress: Progress | None = None
) -> ReplayReport:
    """:func:`replay_shard` of a worker's shard with that worker's configuration (the CLI's
    entry: same datadir layout, Appendix B values, tenant retention and shard_epoch)."""
    return await replay_shard(
        bootstrap=options.bootstrap,
        shard=shard,
        live_path=options.store_path(shard),
        out_dir=out_dir,
        config=options.config(shard),
        shard_epoch=options.shard_epoch,
        topic=options.dispatch_topic,
        progress=progress,
        store_caps=options.store_caps,
    )
