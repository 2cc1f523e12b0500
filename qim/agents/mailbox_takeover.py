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
* presence partition s -> left to the caller (``qim.agents.mailbox_presence.rewind``): the
  cache is rebuilt from the beginning of the compacted partition on every assignment.

A store that cannot be opened leaves its partition paused: its lanes answer SHARD_MOVED.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from qim.agents.mailbox_options import MailboxOptions
from qim.agents.mailbox_shard import OwnedShard
from qim.tables.mailbox_store import MailboxStore

__all__ = ["open_shard", "take_over"]

log = logging.getLogger(__name__)


def open_shard(options: MailboxOptions, shard: int) -> OwnedShard:
    """Shard ``shard``'s store under the worker's datadir, as an :class:`OwnedShard`."""
    store = MailboxStore(options.store_path(shard), options.store_caps)
    try:
        return OwnedShard(shard, store, options.config(shard), options.shard_epoch)
    except Exception:
        store.close()
        raise


async def take_over(
    assigned: set[TopicPartition],
    *,
    options: MailboxOptions,
    consumer: AIOKafkaConsumer,
    admin: AIOKafkaAdminClient,
    dormant: MutableMapping[int, OwnedShard],
    opener: Callable[[int], OwnedShard] | None = None,
) -> dict[int, OwnedShard]:
    """Seek every assigned partition; returns the shards now owned (see the module doc).

    ``dormant`` holds the shards of the previous generation: kept ones are reused (their store
    stays open), the others are closed.
    """
    opener = opener or (lambda p: open_shard(options, p))
    dispatch = sorted(tp for tp in assigned if tp.topic == options.dispatch_topic)
    shards = {tp.partition for tp in dispatch}
    for p in [p for p in dormant if p not in shards]:
        dormant.pop(p).close()
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
        offset = _seek_dispatch(consumer, tp, shard, committed.get(tp), ends[tp])
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
