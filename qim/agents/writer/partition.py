"""One outbox partition's ConversationWriter state, and the one way it changes: ``apply``.

A :class:`PartitionWriter` bundles what the writer of partition p keeps: the writer core's state
(heads, ClientDedup, HLC, admission), GroupMembership, the MessageStore, and the last outbox
offset folded into the first two. Both the live path and the restore path go through
:meth:`PartitionWriter.apply`, so "live == replayed" is a property of one method (style item 3):

* live: a request handler appends a record to the open transaction and applies it at once, so
  the next request of the same batch is decided on top of it (``Plan``); the MessageStore is
  written only after the transaction committed (:meth:`stored`). If the transaction fails the
  in-memory state is ahead of the log and the shell throws this object away and restores.
* restore: :meth:`replay` applies committed outbox records in log order from the checkpoint's
  offset on, and archives into the store those it has not applied yet.

Ids: every partition is its own HLC writer (``writer_id`` = the partition number), so message
ids of two partitions never collide; a new owner of p resumes p's clock from the highest id in
its log. The fencing epoch is raised on every takeover (:meth:`take_over`): above every epoch the
log has shown, so the new owner's records always win the per-conversation filter.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from qim.agents.writer.snapshot import CHECKPOINT_FORMAT, Checkpoint
from qim.core.conversation import ApplyOutcome, ConversationWriterState, WriterConfig
from qim.core.history import archive_batch
from qim.core.membership import GroupMembership, member_slices
from qim.core.reactions.store import reaction_writes
from qim.schemas.ids import hlc_ms_to_unix_ms
from qim.schemas.log_identity import LogIdentity
from qim.schemas.records import (
    DIRECT,
    AdminReply,
    MembershipCommitted,
    MemberSliceRecord,
    MessageCommitted,
    MessageReacted,
    OutboxRecord,
    WriterReply,
)
from qim.schemas.records.transient import TransientRelay
from qim.tables.message_store import NO_OFFSET, MessageStore

__all__ = ["PartitionWriter", "Plan", "conversation_of"]

_REPLAY_FLUSH = 2000
"""Records per MessageStore WriteBatch while replaying."""

_LIVE = frozenset({ApplyOutcome.APPLIED, ApplyOutcome.UNSEQUENCED})
_NOT_ARCHIVED = frozenset({ApplyOutcome.STALE_EPOCH, ApplyOutcome.OUT_OF_ORDER})


def conversation_of(record: OutboxRecord) -> tuple[str, str]:
    """``(tenant_id, conversation_id)`` of an outbox record (a group's id is its conversation)."""
    if isinstance(record, MembershipCommitted):
        return record.tenant_id, record.group_id
    return record.tenant_id, record.conversation_id


@dataclass
class Plan:
    """Everything one transaction will produce, in decision order."""

    outbox: list[OutboxRecord] = field(default_factory=list)
    slices: list[MemberSliceRecord] = field(default_factory=list)
    replies: list[WriterReply] = field(default_factory=list)
    admin_replies: list[AdminReply] = field(default_factory=list)
    transient: list[TransientRelay] = field(default_factory=list)
    """To-gateway records that are no state (13.2 TYPING, 13.3 ephemeral messages, 13.5 RTC),
    sent with the replies."""
    touched: set[tuple[str, str]] = field(default_factory=set)
    """Conversations with an append in this plan (a PULL_HISTORY of one cuts the batch)."""
    sequenced: set[tuple[str, str]] = field(default_factory=set)
    """Conversations with an append other than a reaction (a REACT on one cuts the batch)."""
    reaction_writes: dict[bytes, bytes | None] = field(default_factory=dict)
    """The MessageStore writes of this plan's reactions (None: a delete), which the next REACT
    of the batch reads through (``writer_requests``) before the store has them."""
    reactions: list[MessageReacted] = field(default_factory=list)
    """This plan's reactions, pushed to online members after the commit (``push``)."""


class PartitionWriter:
    """State of one owned partition; see the module docstring."""

    def __init__(
        self,
        partition: int,
        state: ConversationWriterState,
        membership: GroupMembership,
        store: MessageStore,
        *,
        applied_offset: int = NO_OFFSET,
    ) -> None:
        self.partition = partition
        self.state = state
        self.membership = membership
        self.store = store
        self.applied_offset = applied_offset
        self.closed = False
        self.checkpoint_offset: int | None = None
        """The offset of the checkpoint this state was restored from (None: none)."""
        self.outbox_identity: LogIdentity | None = None
        """The outbox's identity, set by restore; written into every checkpoint (17.2)."""
        self.debt = 0
        """Records applied since the newest checkpoint: what a takeover would replay."""
        self._pending: list[tuple[OutboxRecord, int]] = []

    @classmethod
    def restored(
        cls,
        partition: int,
        checkpoint: Checkpoint | None,
        store: MessageStore,
        *,
        config: WriterConfig,
        region_id: int,
        mailbox_shard_count: int,
    ) -> PartitionWriter:
        """From the latest checkpoint (or empty); the caller then replays the outbox after it."""
        if checkpoint is None:
            state = ConversationWriterState(config, region_id=region_id, writer_id=partition)
            membership = GroupMembership(mailbox_shard_count=mailbox_shard_count)
            return cls(partition, state, membership, store)
        if checkpoint.partition != partition:
            raise ValueError(f"checkpoint of partition {checkpoint.partition}, not {partition}")
        state = ConversationWriterState.restore(
            checkpoint.writer,
            config,
            region_id=region_id,
            writer_id=partition,
            fencing_epoch=checkpoint.fencing_epoch,
        )
        membership = GroupMembership.decode(
            checkpoint.membership, mailbox_shard_count=mailbox_shard_count
        )
        writer = cls(partition, state, membership, store, applied_offset=checkpoint.outbox_offset)
        writer.checkpoint_offset = checkpoint.outbox_offset
        return writer

    # -- the one mutator -----------------------------------------------------------------------

    def apply(
        self, record: OutboxRecord, *, slices: bool = True
    ) -> tuple[ApplyOutcome, tuple[MemberSliceRecord, ...]]:
        """Fold one outbox record into the writer state and GroupMembership (log order).

        Returns the writer core's outcome and, when the record completed a membership version
        and ``slices`` is set, that version's member slices (to publish before any dispatch
        pinned to it; a replay does not publish again).
        """
        outcome = self.state.apply(record)
        self.debt += 1
        if not isinstance(record, MembershipCommitted):
            return outcome, ()
        published = self.membership.apply(record)
        if published is None or not slices:
            return outcome, ()
        group = self.membership.group(published.tenant_id, published.group_id)
        assert group is not None, "a published version belongs to an existing group"
        return outcome, member_slices(group, published)

    def append(self, record: OutboxRecord, plan: Plan) -> None:
        """Live path: put ``record`` in the open transaction and apply it at once."""
        outcome, slices = self.apply(record)
        if outcome not in _LIVE:
            raise RuntimeError(f"a record the writer just decided was not applied: {outcome}")
        plan.outbox.append(record)
        plan.slices.extend(slices)
        plan.touched.add(conversation_of(record))
        if isinstance(record, MessageReacted):
            plan.reactions.append(record)
            for write in reaction_writes(record):
                plan.reaction_writes[write.key] = write.value
        else:
            plan.sequenced.add(conversation_of(record))

    def replay(self, record: OutboxRecord, offset: int) -> None:
        """Restore path: one committed record at ``offset`` (ascending; repeats are no-ops)."""
        if offset > self.applied_offset:
            outcome, _ = self.apply(record, slices=False)  # published when it was committed
            self.applied_offset = offset
            if outcome in _NOT_ARCHIVED:
                return
        if offset > self.store.applied_offset:
            self._pending.append((record, offset))
            if len(self._pending) >= _REPLAY_FLUSH:
                self.flush_replay()

    def flush_replay(self) -> None:
        """Write what :meth:`replay` buffered for the store (also at the end of a replay)."""
        if self._pending:
            pending, self._pending = self._pending, []
            self._store(pending)

    def stored(self, appended: Iterable[tuple[OutboxRecord, int]]) -> None:
        """Live path, after the commit: archive the transaction's records with their offsets."""
        rows = list(appended)
        if rows:
            self.applied_offset = max(self.applied_offset, rows[-1][1])
            self._store(rows)

    def _store(self, rows: list[tuple[OutboxRecord, int]]) -> None:
        rows = [(r, o) for r, o in rows if o > self.store.applied_offset]
        if not rows:
            return
        participants = [
            (r.tenant_id, r.conversation_id, r.participants)
            for r, _ in rows
            if isinstance(r, MessageCommitted) and r.conversation_kind == DIRECT
        ]
        writes = archive_batch(
            (r for r, _ in rows), read=self.store.get, keys_under=self.store.keys_under
        )
        self.store.commit(writes, participants, rows[-1][1])

    # -- incarnation ---------------------------------------------------------------------------

    def take_over(self) -> int:
        """Raise the fencing epoch above every epoch in the state; returns the new epoch.

        Derived from the log (the checkpoint's epoch and every head's), not from the producer
        epoch: aiokafka keeps that private and Kafka resets it with a new producer id when it
        overflows, while the log-derived counter only grows.
        """
        highest = max((head.fencing_epoch for head in self.state.heads()), default=0)
        epoch = max(self.state.fencing_epoch, highest) + 1
        self.state.raise_fencing_epoch(epoch)
        return epoch

    def log_time_ms(self, now_ms: int) -> int:
        """The wall clock, never below the HLC: time stamps of seq-less records (a create)."""
        return max(now_ms, hlc_ms_to_unix_ms(self.state.last_hlc_ms))

    def checkpoint(self, covers: int) -> Checkpoint:
        """The in-memory state, which includes the outbox up to offset ``covers``.

        Live, that is the last record of the open transaction (its offset is known once the
        broker acknowledged the append); the checkpoint commits in the same transaction.
        """
        return Checkpoint(
            format=CHECKPOINT_FORMAT,
            partition=self.partition,
            outbox_offset=covers,
            fencing_epoch=self.state.fencing_epoch,
            writer=self.state.snapshot(),
            membership=self.membership.encode(),
            outbox_identity=self.outbox_identity,
        )

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.store.close()
