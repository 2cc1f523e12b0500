"""One owned MailboxShard: its store, its fold, and which lanes it may serve.

Why a per-shard object between the service and the core: the service owns Kafka (fetch, seek,
commit, rebalance), the core owns the rules (``materialize``, ``resume_offset``, the floor);
this object is the state that outlives a fetch -- the open store, the slice cache, ``W[]`` as
last committed, and the two floors that decide serving (direction.md 4.1, spec 10.4.2):

* ``required[]`` -- a lane is refused (SHARD_MOVED) until ``W[lane]`` reaches it. At takeover it
  is ``max(local W_floor, the floor the previous owner published)``: a store that lost data, or
  a fresh store still replaying, cannot answer with a watermark some client has already passed.
* ``published[]`` -- the floor this node has committed to Kafka (the metadata of its dispatch
  offset commit, :func:`encode_floor`). Reads are answered with ``min(W[lane],
  published[lane])``, so no client ever sees a watermark the next owner would not know about,
  even if this node dies before its next commit.

Why Kafka's offset-commit metadata carries the floor: the group is the one ownership authority
(direction.md 4.1) and the committed offset is already the per-partition record a new owner
reads at takeover; there is no second registry. Offsets themselves stay bookkeeping: the
consumer always starts at ``resume_offset(W, epoch)`` (10.4.2 (1), M-2).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from collections.abc import Iterable, Sequence
from typing import Any, Final, Protocol

import msgspec

from qim.agents.mailbox.observe import LaneAdvanceClock
from qim.core.mailbox import (
    KVReader,
    MailboxConfig,
    MaterializeResult,
    Op,
    SliceCache,
    StoreMailboxReader,
    SweepResult,
    materialize,
    refused_lanes,
    resume_offset,
    retention_sweep,
)
from qim.core.mailbox.keys import META
from qim.core.mailbox.session_store import CONV_STATE
from qim.core.mailbox.values import ShardMeta, decode_value, decode_vector, encode_vector
from qim.schemas.records.dispatch import ShardLogRecord, decode_dispatch_record
from qim.schemas.seqs import split_mailbox_seq
from qim.tables.user_state_changelog import (
    CHANGED_KEY,
    PUBLISHED_KEY,
    changed_rows,
    marker,
    marker_op,
)

__all__ = [
    "FLOOR_METADATA",
    "OwnedShard",
    "ShardStore",
    "decode_floor",
    "decode_run",
    "encode_floor",
]

FLOOR_METADATA: Final = "qim-floor/1"


def encode_floor(shard_epoch: int, floor: Sequence[int]) -> str:
    """Offset-commit metadata: ``"qim-floor/1 <epoch> <base64 of the u64 vector>"``."""
    return f"{FLOOR_METADATA} {shard_epoch} {base64.b64encode(encode_vector(floor)).decode()}"


def decode_floor(metadata: str, shard_epoch: int, lane_count: int) -> tuple[int, ...] | None:
    """The published floor if ``metadata`` is one of ours for this epoch; else None.

    A floor of another epoch refers to invalidated offsets (direction.md 4.5) and is ignored.
    """
    parts = (metadata or "").split(" ")
    if len(parts) != 3 or parts[0] != FLOOR_METADATA or parts[1] != str(shard_epoch):
        return None
    try:
        return decode_vector(base64.b64decode(parts[2], validate=True), lane_count)
    except (ValueError, binascii.Error):
        return None


def decode_run(records: Iterable[Any]) -> tuple[list[tuple[int, ShardLogRecord]], list[int]]:
    """``(offset, record)`` pairs of fetched consumer records, and the undecodable offsets
    (skipped: they occupy their offset and change nothing, like an unknown kind)."""
    batch: list[tuple[int, ShardLogRecord]] = []
    malformed: list[int] = []
    for record in records:
        try:
            batch.append((record.offset, decode_dispatch_record(record.value)))
        except (msgspec.DecodeError, msgspec.ValidationError, TypeError):
            malformed.append(record.offset)
    return batch, malformed


class ShardStore(KVReader, Protocol):
    """What a shard needs from its storage: the core's reads plus one atomic batch write."""

    def apply(self, ops: Iterable[Op]) -> object: ...


def _max(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    return tuple(max(x, y) for x, y in zip(a, b, strict=True))


class OwnedShard:
    """The state of one owned shard; the service drives it (see the module docstring)."""

    def __init__(
        self, shard: int, store: ShardStore, config: MailboxConfig, shard_epoch: int
    ) -> None:
        if config.mailbox_shard != shard:
            raise ValueError("config is for another shard")
        self.shard = shard
        self.store = store
        self.config = config
        self.epoch = shard_epoch
        self.reader = StoreMailboxReader(store, config.lane_count)
        self.slice_cache = SliceCache()
        raw = store.get(META)
        meta = ShardMeta() if raw is None else decode_value(raw, ShardMeta)
        if meta.shard_epoch > shard_epoch:
            raise ValueError(f"store is at shard_epoch {meta.shard_epoch}, not {shard_epoch}")
        self.log_now_ms = meta.log_now_ms
        self.applied_seq = meta.applied_seq
        self.watermarks = self.reader.watermarks()
        self.required = self.reader.watermark_floor()
        self.published = (0,) * config.lane_count
        self.serving = False
        self.next_offset = 0
        self.high_water = 0
        self.committed_at_takeover: int | None = None
        self.resumed_from: int | None = None
        self.pending = 0
        self.dirty = False
        """Something (offsets or the floor) waits to be committed to Kafka."""
        now = time.monotonic()
        self.advanced_at = [now] * config.lane_count
        self.advance = LaneAdvanceClock()
        """Arrival times for ``lane_watermark_advance`` (metrics only, never stored)."""
        self.restored_checkpoint_s: float | None = None
        """Seconds the takeover spent restoring a shipped checkpoint (None: none restored)."""
        self.restored_from = self.applied_seq
        """``applied_seq`` when the store was opened: a restored checkpoint's id."""
        self.checkpointed_seq: int | None = None
        """``applied_seq`` of the last checkpoint this node shipped."""
        self.ucs_changed = marker(store, CHANGED_KEY)
        """mailbox_seq of the last WriteBatch that changed ``U`` rows (in that WriteBatch)."""
        self.ucs_published = marker(store, PUBLISHED_KEY)
        """Every ``U`` change through this mailbox_seq is in the UserConversationState
        changelog (decision 41); below ``ucs_changed``: rows to re-publish."""
        if self.ucs_changed == 0 and next(store.scan(CONV_STATE, CONV_STATE, False), None):
            # rows folded before the changelog existed: publish them all at takeover
            self.ucs_changed = max(self.applied_seq, 1)
        self.ucs_before = self.ucs_changed
        """``ucs_changed`` before the last WriteBatch that changed rows: its rows may advance
        ``ucs_published`` only if everything before it is published."""
        self.ucs_failed = False
        """A changelog publish failed: the next one re-publishes from the store."""
        self.ucs_acks: asyncio.Future[bool] | None = None
        """The last publish's acknowledgement wait (the next one waits for it first)."""
        self.ucs_restored: int | None = None
        """Rows restored from the changelog at takeover (None: no restore)."""

    # -- takeover ------------------------------------------------------------------------------

    def take_over(self, metadata: str | None, committed: int | None) -> int:
        """Adopt the floor the previous owner published in its offset commit's ``metadata``;
        returns the offset to seek to (never ``committed``: that is only recorded)."""
        published = decode_floor(metadata or "", self.epoch, self.config.lane_count)
        if published is not None:
            self.required = _max(self.required, published)
            self.published = _max(self.published, published)
        self.committed_at_takeover = committed
        self.next_offset = self.resumed_from = self.resume_at()
        self.serving = True
        self.dirty = True  # publish max(local floor, previous) at once
        return self.next_offset

    def resume_at(self) -> int:
        """Where the log must be read from to rebuild what is not in the store."""
        return resume_offset(self.watermarks, self.epoch)

    def close(self) -> None:
        """Release the store (RocksDB holds a lock per database)."""
        self.serving = False
        close = getattr(self.store, "close", None)
        if close is not None:
            close()

    def floor_to_publish(self) -> tuple[int, ...]:
        return _max(self.required, self.watermarks)

    def mark_published(self, floor: Sequence[int]) -> None:
        self.published = _max(self.published, floor)

    # -- the fold ------------------------------------------------------------------------------

    def materialize(self, batch: Sequence[tuple[int, ShardLogRecord]]) -> MaterializeResult:
        """The core fold over the committed store; nothing is written yet."""
        return materialize(
            self.store,
            batch,
            shard_epoch=self.epoch,
            config=self.config,
            slice_cache=self.slice_cache,
        )

    def write(self, result: MaterializeResult) -> list[tuple[bytes, bytes | None]]:
        """Commit ``result`` as one WriteBatch, then take its W[] as the shard's; returns the
        ``U`` rows it changed (for the UserConversationState changelog). A batch that changed
        some records ``ucs_changed`` in the same WriteBatch, so a crash before they are
        published is seen at the next takeover."""
        rows = changed_rows(result.ops)
        if rows:
            self.store.apply((*result.ops, marker_op(CHANGED_KEY, result.applied_seq)))
            self.ucs_before = self.ucs_changed
            self.ucs_changed = max(self.ucs_changed, result.applied_seq)
        else:
            self.store.apply(result.ops)
        now = time.monotonic()
        for lane, (old, new) in enumerate(zip(self.watermarks, result.watermarks, strict=True)):
            if new > old:
                self.advanced_at[lane] = now
        self.watermarks = result.watermarks
        self.applied_seq = result.applied_seq
        self.pending = len(result.pending)
        self.dirty = True
        raw = self.store.get(META)
        if raw is not None:
            self.log_now_ms = decode_value(raw, ShardMeta).log_now_ms
        return rows

    def mark_ucs_published(self, mailbox_seq: int) -> None:
        """Every ``U`` change through ``mailbox_seq`` is acknowledged in the changelog."""
        if mailbox_seq > self.ucs_published:
            self.ucs_changed = max(self.ucs_changed, mailbox_seq)
            self.store.apply(
                [
                    marker_op(CHANGED_KEY, self.ucs_changed),
                    marker_op(PUBLISHED_KEY, mailbox_seq),
                ]
            )
            self.ucs_published = mailbox_seq

    def consumed(self, last_offset: int) -> None:
        """Every record up to ``last_offset`` was folded (or skipped as malformed)."""
        self.next_offset = max(self.next_offset, last_offset + 1)
        self.dirty = True

    def sweep(self, now_ms: int) -> SweepResult:
        """One retention pass (log time: the core clamps ``now_ms`` to it) as one WriteBatch."""
        result = retention_sweep(self.store, now_ms, self.config)
        if result.ops:
            self.store.apply(result.ops)
        return result

    # -- serving -------------------------------------------------------------------------------

    def served_watermark(self, lane: int) -> int | None:
        """``W[lane]`` as reads may show it, or None while the lane must answer SHARD_MOVED."""
        w = self.watermarks[lane]
        if not self.serving or w < self.required[lane]:
            return None
        return min(w, self.published[lane])

    def refused(self) -> list[int]:
        return refused_lanes(self.watermarks, self.required)

    def status(self) -> dict[str, object]:
        """For the worker's ``/mailbox`` page and the tests."""
        applied_epoch, applied_offset = split_mailbox_seq(self.applied_seq)
        return {
            "serving": self.serving,
            "applied_offset": applied_offset if applied_epoch == self.epoch else -1,
            "next_offset": self.next_offset,
            "high_water_at_takeover": self.high_water,
            "committed_at_takeover": self.committed_at_takeover,
            "resumed_from": self.resumed_from,
            "resume_offset": self.resume_at(),
            "watermark_min": min(self.watermarks),
            "watermark_max": max(self.watermarks),
            "lanes_refused": len(self.refused()),
            "pending_dispatches": self.pending,
            "log_now_ms": self.log_now_ms,
            "restored_checkpoint_s": self.restored_checkpoint_s,
            "restored_checkpoint_offset": (
                split_mailbox_seq(self.restored_from)[1]
                if self.restored_checkpoint_s is not None
                else None
            ),
            "checkpoint_offset": (
                None
                if self.checkpointed_seq is None
                else split_mailbox_seq(self.checkpointed_seq)[1]
            ),
            "ucs_changed_offset": split_mailbox_seq(self.ucs_changed)[1],
            "ucs_published_offset": split_mailbox_seq(self.ucs_published)[1],
            "ucs_restored_rows": self.ucs_restored,
        }
