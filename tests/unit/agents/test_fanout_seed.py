"""Seeding the FanoutCoordinator from a ConversationWriter checkpoint (issue 5 recovery).

Invariant: a state seeded from the writer's checkpoint at offset C and fed the records after C
dispatches exactly what a state replayed from the first record dispatches -- including the
fencing epoch stamped on later CONTROL messages -- so recovery may start at any checkpoint
below the committed offset.
"""

from __future__ import annotations

from qim.agents.fanout.seed import complete_checkpoints, seed_state
from qim.agents.writer.snapshot import CHECKPOINT_FORMAT, Checkpoint, checkpoint_records
from qim.core.conversation import ConversationWriterState, WriterConfig
from qim.core.fanout import FanoutConfig, FanoutState, NotReady
from qim.core.membership import GroupMembership
from qim.params import Settings
from qim.schemas.records import MembershipCommitted
from tests.unit.fanout.support import Outbox, run

CONFIG = FanoutConfig()
WRITER_CONFIG = WriterConfig.from_settings(Settings.load(env={}))


def checkpoint_of(outbox: Outbox, upto: int, partition: int = 0, epoch: int = 1) -> Checkpoint:
    """What the ConversationWriter of ``partition`` checkpoints after ``outbox.log[upto]``."""
    writer = ConversationWriterState(WRITER_CONFIG, region_id=0, writer_id=partition)
    membership = GroupMembership(mailbox_shard_count=CONFIG.mailbox_shard_count)
    for record in outbox.log[: upto + 1]:
        writer.apply(record)
        if isinstance(record, MembershipCommitted):
            membership.apply(record)
    return Checkpoint(
        format=CHECKPOINT_FORMAT,
        partition=partition,
        outbox_offset=upto,
        fencing_epoch=epoch,
        writer=writer.snapshot(),
        membership=membership.encode(),
    )


def _story() -> Outbox:
    outbox = Outbox()
    outbox.create("g:a", "owner", [f"m{i}" for i in range(20)])
    outbox.create("g:b", "boss", ["x1", "x2"])
    outbox.send("g:a", "owner", fencing_epoch=3)
    outbox.send("g:b", "x1", fencing_epoch=2)
    outbox.direct("alice", "bob")
    outbox.add("g:a", ["n1", "n2"])
    outbox.send("g:a", "n1", fencing_epoch=3)
    outbox.leave("g:b", "x2")
    outbox.send("g:b", "boss", fencing_epoch=2)
    outbox.remove("g:a", ["m3"])
    outbox.send("g:a", "m4", fencing_epoch=4)
    return outbox


def test_seeded_state_dispatches_what_a_full_replay_dispatches_after_the_checkpoint() -> None:
    outbox = _story()
    for upto in range(len(outbox.log)):
        full = FanoutState(CONFIG)
        run(full, outbox.log[: upto + 1])
        seeded = seed_state(checkpoint_of(outbox, upto), CONFIG)
        rest = outbox.log[upto + 1 :]
        assert run(seeded, rest) == run(full, rest), f"seeded after record {upto}"


def test_a_seed_knows_only_current_versions_so_older_pins_are_not_ready() -> None:
    """Why recovery takes a checkpoint strictly below the resume offset."""
    outbox = Outbox()
    outbox.create("g:a", "owner", ["m1"])
    message = outbox.send("g:a", "m1")  # pins v1
    outbox.add("g:a", ["m2"])  # v2
    seeded = seed_state(checkpoint_of(outbox, len(outbox.log) - 1), CONFIG)
    assert isinstance(seeded.apply_outbox(message), NotReady)


def test_seeded_state_round_trips_through_its_encoding() -> None:
    seeded = seed_state(checkpoint_of(_story(), 8), CONFIG)
    assert FanoutState.decode(seeded.encode(), CONFIG).encode() == seeded.encode()
    assert seeded.membership.encode() == checkpoint_of(_story(), 8).membership


def test_complete_checkpoints_keeps_every_whole_one_and_skips_the_rest() -> None:
    outbox = _story()
    first, second, third = (checkpoint_of(outbox, n) for n in (2, 6, 9))
    other_partition = checkpoint_of(outbox, 7, partition=1)
    values = [v for _, v in checkpoint_records(first, max_chunk_bytes=64)]
    values += [b"not a chunk"]
    values += [v for _, v in checkpoint_records(second, max_chunk_bytes=64)]
    values += [v for _, v in checkpoint_records(other_partition, max_chunk_bytes=64)]
    values += [v for _, v in checkpoint_records(third, max_chunk_bytes=64)][1:]  # cut off
    assert complete_checkpoints(values, 0) == [first, second]
    assert complete_checkpoints(values[1:], 0) == [second]
