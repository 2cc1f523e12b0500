"""Seeding the FanoutCoordinator from the ConversationWriter's checkpoint (read-only).

Why borrow the writer's checkpoint: the fanout's membership knowledge must outlive the outbox
retention (a group created nine days ago still receives messages), and the writer already
writes exactly that state -- the GroupMembership bytes as of an outbox offset -- to the
compacted ``qim.writer-snapshots``, in the same transaction as the outbox records it covers.
A checkpoint topic of our own would duplicate it.

What a checkpoint gives and what it does not (:func:`seed_state`):

* membership: the writer's ``GroupMembership`` bytes decode into the state's replica unchanged
  (same routing, the same ``apply`` on both sides);
* each group's *current* version with its target shards: the only version a record after the
  checkpoint can pin, because in log order a message pins the version current at its commit;
  older versions are not in the checkpoint, so a checkpoint is only a valid base for records
  *after* it -- recovery picks one strictly below the resume offset (``fanout_recovery``);
* fencing epochs: the writer's ConversationHead keeps the highest ``fencing_epoch`` of each
  conversation, which is what ``FanoutState`` stamps on CONTROL dispatches of later versions.
  The stamp of a seeded current version is that same maximum; it only matters if that
  version's CONTROL record is dispatched again, and it never is after the seed.

The state is built with ``FanoutState.seeded`` from exactly those two facts.

:func:`complete_checkpoints` assembles whole checkpoints from a window of chunk records: unlike
``writer_snapshot.latest_checkpoint`` it keeps every complete one, because recovery needs the
newest one *below an offset*, which is often not the newest one.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from qim.agents.writer.snapshot import CHECKPOINT_FORMAT, Checkpoint, CheckpointChunk
from qim.core.conversation import decode_snapshot as decode_writer_snapshot
from qim.core.fanout import FanoutConfig, FanoutState, VersionInfo
from qim.core.membership import GroupMembership
from qim.core.membership.snapshot import decode_snapshot as decode_membership_snapshot
from qim.schemas.frames.base import U128_ZERO

__all__ = ["complete_checkpoints", "seed_state"]

_CHUNK = msgspec.msgpack.Decoder(CheckpointChunk)
_CHECKPOINT = msgspec.msgpack.Decoder(Checkpoint)


def seed_state(checkpoint: Checkpoint, config: FanoutConfig) -> FanoutState:
    """The fanout state as of ``checkpoint.outbox_offset`` (module docstring)."""
    membership = GroupMembership.decode(
        checkpoint.membership,
        mailbox_shard_count=config.mailbox_shard_count,
        virtual_bucket_count=config.virtual_bucket_count,
    )
    heads = decode_writer_snapshot(checkpoint.writer).heads
    highest = {head.key: head.fencing_epoch for head in heads if head.last_message_id != U128_ZERO}
    current: list[tuple[tuple[str, str], int, VersionInfo]] = []
    epochs: list[tuple[tuple[str, str], int]] = []
    for snap in decode_membership_snapshot(checkpoint.membership).groups:
        key = (snap.tenant_id, snap.group_id)
        group = membership.group(*key)
        if group is None or group.version < 1:  # pragma: no cover - decode keeps every group
            continue
        epoch = highest.get(key)
        if epoch is not None:
            epochs.append((key, epoch))
        current.append((key, group.version, VersionInfo(tuple(group.shards()), epoch or 0)))
    return FanoutState.seeded(membership, current, epochs, config)


def complete_checkpoints(values: Iterable[bytes], partition: int) -> list[Checkpoint]:
    """Every checkpoint of ``partition`` whose chunks are all among ``values`` (log order).

    Chunks are grouped by their checkpoint's identity ``(outbox_offset, fencing_epoch)``; a
    later chunk of the same identity and index wins. Values that are not checkpoint chunks,
    checkpoints of a newer format or of another partition are skipped: this is a read-only use
    of another process's topic, and the caller falls back to replaying the outbox.
    """
    parts: dict[tuple[int, int], dict[int, CheckpointChunk]] = {}
    order: list[tuple[int, int]] = []
    for value in values:
        try:
            chunk = _CHUNK.decode(value)
        except msgspec.DecodeError:
            continue
        if chunk.identity not in parts:
            order.append(chunk.identity)
        parts.setdefault(chunk.identity, {})[chunk.chunk_index] = chunk
    found: list[Checkpoint] = []
    for identity in order:
        chunks = parts[identity]
        count = max(c.chunk_count for c in chunks.values())
        if any(i not in chunks for i in range(count)):
            continue
        try:
            checkpoint = _CHECKPOINT.decode(b"".join(chunks[i].data for i in range(count)))
        except msgspec.DecodeError:
            continue
        if checkpoint.format <= CHECKPOINT_FORMAT and checkpoint.partition == partition:
            found.append(checkpoint)
    return found
