"""Taking MailboxShards over when the group assigns them (spec 10.4.2, direction.md 4.1-4.2).

Runs inside the consumer's ``on_partitions_assigned`` callback, and aiokafka starts the group
heartbeat only after that callback returns, so everything here is bounded and quick: one
OffsetFetch for all partitions, one ListOffsets, one store open per shard not kept from the
previous generation, and a seek per partition (:func:`take_over`).

* dispatch partition s -> open (or keep) shard s's store, adopt the floor the previous owner
  published in the committed offset's metadata, and SEEK to ``resume_offset(W, epoch)`` -- the
  committed offset itself is only recorded (M-2: a crash between commit and WriteBatch must
  not skip a dispatch);
* user-requests partition s -> the committed offset (the previous owner's answered requests
  are behind it), or the end for a first owner: requests queued before there was any owner
  belong to sessions that have long given up;
* presence partition s -> left to the caller (``qim.agents.mailbox.presence.rewind``): the
  cache is rebuilt from the beginning of the compacted partition on every assignment.

A shard with no local store and a shipped checkpoint (``MailboxOptions.checkpoint_dir``, spec
19.3, 26.6.3) first gets that checkpoint copied in (:func:`restore_shard`, in a thread); its
``W[]`` then makes the seek replay only the log's tail. A checkpoint is the store of the same
shard, so everything above applies to it unchanged: its log identity must match, its floor is
its own ``W_floor``.

A store that cannot be opened leaves its partition paused: its lanes answer SHARD_MOVED. So
does a store bound to another dispatch log (spec 17.2, :func:`bind_identity`): its ``W[]`` and
entries count offsets of the log it was folded from, and a recreated topic, another cluster or
a changed partition count would silently re-number them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from qim.agents.mailbox.options import MailboxOptions
from qim.agents.mailbox.shard import OwnedShard
from qim.schemas.log_identity import LogIdentity, LogIdentityMismatch, identity_mismatch
from qim.streams.identity import fetch_log_identity
from qim.tables.mailbox_checkpoint import latest_checkpoint, restore_checkpoint
from qim.tables.mailbox_store import MailboxStore

__all__ = ["IDENTITY_KEY", "bind_identity", "open_shard", "restore_shard", "take_over"]

IDENTITY_KEY = b"\x00log-identity"
"""The dispatch log a shard store was folded from; outside the core's one-letter keyspaces and
left out of replay digests (the rebuilt store is bound by its own run)."""

_IDENTITY = msgspec.msgpack.Decoder(LogIdentity)

log = logging.getLogger(__name__)


def bind_identity(store: MailboxStore, live: LogIdentity) -> None:
    """Bind an empty store to ``live``; refuse one bound to another log, or a non-empty store
    with no binding (written before it existed: its origin is unknown), with
    :class:`LogIdentityMismatch`."""
    raw = store.get(IDENTITY_KEY)
    if raw is None:
        if next(iter(store.items()), None) is not None:
            raise LogIdentityMismatch(f"{store.path}: store has no log identity; replay it")
        store.apply([(IDENTITY_KEY, msgspec.msgpack.encode(live))])
        return
    reason = identity_mismatch(_IDENTITY.decode(raw), live)
    if reason is not None:
        raise LogIdentityMismatch(f"{store.path}: {reason}")


def open_shard(options: MailboxOptions, shard: int) -> OwnedShard:
    """Shard ``shard``'s store under the worker's datadir, as an :class:`OwnedShard`."""
    store = MailboxStore(options.store_path(shard), options.store_caps)
    try:
        return OwnedShard(shard, store, options.config(shard), options.shard_epoch)
    except Exception:
        store.close()
        raise


def _store_absent(path: Path) -> bool:
    return not path.exists() or not any(path.iterdir())


def restore_shard(options: MailboxOptions, shard: int) -> float | None:
    """Copy shard ``shard``'s newest shipped checkpoint into its empty store path; returns
    the seconds it took, or None when there is nothing to restore (a local store exists, no
    checkpoint directory is configured, or it holds none of this shard at this epoch)."""
    root = options.checkpoint_dir
    path = options.store_path(shard)
    if root is None or not _store_absent(path):
        return None
    checkpoint = latest_checkpoint(root, shard)
    if checkpoint is None or checkpoint.shard_epoch != options.shard_epoch:
        return None
    started = time.monotonic()
    path.parent.mkdir(parents=True, exist_ok=True)
    restore_checkpoint(checkpoint, path)
    elapsed = time.monotonic() - started
    log.info(
        "shard %d: restored checkpoint %d (%d files, %d bytes) in %.3f s",
        shard, checkpoint.checkpoint_id, checkpoint.files, checkpoint.bytes, elapsed,
    )  # fmt: skip
    return elapsed


async def take_over(
    assigned: set[TopicPartition],
    *,
    options: MailboxOptions,
    consumer: AIOKafkaConsumer,
    admin: AIOKafkaAdminClient,
    dormant: MutableMapping[int, OwnedShard],
    opener: Callable[[int], OwnedShard] | None = None,
    on_restore: Callable[[int, float], None] | None = None,
) -> dict[int, OwnedShard]:
    """Seek every assigned partition; returns the shards now owned (see the module doc).

    ``dormant`` holds the shards of the previous generation: kept ones are reused (their store
    stays open), the others are closed.
    """
    dispatch = sorted(tp for tp in assigned if tp.topic == options.dispatch_topic)
    live = await fetch_log_identity(options.bootstrap, options.dispatch_topic) if dispatch else None
    opener = opener or (lambda p: open_shard(options, p))
    shards = {tp.partition for tp in dispatch}
    for p in [p for p in dormant if p not in shards]:
        dormant.pop(p).close()
    restored: dict[int, float] = {}
    for p in sorted(shards - set(dormant)):
        try:
            elapsed = await asyncio.to_thread(restore_shard, options, p)
        except Exception:
            log.exception("shard %d: checkpoint restore failed; replaying the log instead", p)
            elapsed = None
        if elapsed is not None:
            restored[p] = elapsed
            if on_restore is not None:
                on_restore(p, elapsed)
    committed = await admin.list_consumer_group_offsets(
        options.group_id, partitions=sorted(assigned)
    )
    ends = await consumer.end_offsets(dispatch) if dispatch else {}
    owned: dict[int, OwnedShard] = {}
    for tp in dispatch:
        p = tp.partition
        try:
            shard = dormant.pop(p, None) or opener(p)
        except Exception:
            log.exception("shard %d: store cannot be opened; not serving it", p)
            consumer.pause(tp)
            continue
        if live is not None and isinstance(shard.store, MailboxStore):
            try:
                bind_identity(shard.store, live)
            except LogIdentityMismatch as exc:
                log.error("shard %d: %s; not serving it (fail closed, 17.2)", p, exc)
                shard.close()
                consumer.pause(tp)
                continue
        offset = _seek_dispatch(consumer, tp, shard, committed.get(tp), ends[tp])
        if p in restored:
            shard.restored_checkpoint_s = restored[p]
        owned[p] = shard
        log.info(
            "shard %d: resume at %d (committed %s, end %d), %d lanes below the floor",
            p, offset, shard.committed_at_takeover, ends[tp], len(shard.refused()),
        )  # fmt: skip
    fresh = []
    for tp in sorted(tp for tp in assigned - set(dispatch) if tp.topic != options.presence_topic):
        meta = committed.get(tp)
        if meta is not None and meta.offset >= 0:
            consumer.seek(tp, meta.offset)
        else:
            fresh.append(tp)
    if fresh:
        await consumer.seek_to_end(*fresh)  # one call: each call waits for a fetcher round
    return owned


def _seek_dispatch(
    consumer: AIOKafkaConsumer, tp: TopicPartition, shard: OwnedShard, meta: Any, end: int
) -> int:
    committed = meta.offset if meta is not None and meta.offset >= 0 else None
    offset = shard.take_over(meta.metadata if committed is not None else None, committed)
    shard.high_water = end
    consumer.seek(tp, offset)
    return offset
