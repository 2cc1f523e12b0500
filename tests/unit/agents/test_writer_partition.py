"""``PartitionWriter``: the live path and the restore path build the same state (style item 3).

Invariant checked: applying a partition's outbox records through the live path (requests ->
append -> store after "commit") and replaying the same records at their offsets -- from empty,
or from a checkpoint taken midway -- give byte-identical writer snapshots, GroupMembership
bytes and MessageStore contents.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from qim.core.conversation import ApplyOutcome
from qim.schemas.records import MessageCommitted
from tests.unit.agents.support import (
    Log,
    admin,
    create,
    direct,
    group_on,
    leave,
    new_writer,
    partition_of,
    send,
    store_items,
)

P = 1


def script(log: Log) -> None:
    group = group_on(P)
    log.run(create("alice", group, ("bob", "carol")))
    log.run(*(send("alice", group, f"m{i}") for i in range(5)), send("bob", group, "m0"))
    log.run(send("mallory", group, "nope"), leave("carol", group))
    log.run(admin("add", group, ("dave", "erin")), send("dave", group, "hello"))
    log.run(admin("remove", group, ("erin",), reply=False), send("alice", group, "m0"))
    for n in range(40):  # a few direct conversations that land on this partition
        request = direct("alice", f"friend{n}", f"d{n}")
        if partition_of(request.message.conversation_id) == P:
            log.run(request, send("alice", request.message.conversation_id, "no-peer"))


@pytest.fixture
def live(tmp_path: Path) -> Log:
    log = Log(new_writer(tmp_path / "live", P))
    script(log)
    return log


def test_replay_from_empty_equals_the_live_state(live: Log, tmp_path: Path) -> None:
    replayed = new_writer(tmp_path / "replayed", P)
    for record, offset in live.records:
        replayed.replay(record, offset)
    replayed.flush_replay()
    assert replayed.state.snapshot() == live.writer.state.snapshot()
    assert replayed.membership.encode() == live.writer.membership.encode()
    assert store_items(replayed.store) == store_items(live.writer.store)
    assert replayed.applied_offset == live.writer.applied_offset == len(live.records) - 1
    assert replayed.store.applied_offset == replayed.applied_offset


def test_checkpoint_then_suffix_equals_the_live_state(live: Log, tmp_path: Path) -> None:
    half = len(live.records) // 2
    early = new_writer(tmp_path / "early", P)
    for record, offset in live.records[:half]:
        early.replay(record, offset)
    checkpoint = early.checkpoint(half - 1)

    # a new owner: checkpoint, then the whole log again (records it covers are no-ops)
    restored = new_writer(tmp_path / "restored", P, checkpoint)
    assert restored.debt == 0
    for record, offset in live.records:
        restored.replay(record, offset)
    restored.flush_replay()
    assert restored.debt == len(live.records) - half, "only the suffix is applied"
    assert restored.state.snapshot() == live.writer.state.snapshot()
    assert restored.membership.encode() == live.writer.membership.encode()
    assert store_items(restored.store) == store_items(live.writer.store)


def test_a_store_behind_the_state_catches_up_without_reapplying(live: Log, tmp_path: Path) -> None:
    checkpoint = live.writer.checkpoint(live.writer.applied_offset)
    wiped = new_writer(tmp_path / "wiped", P, checkpoint)
    assert wiped.store.applied_offset == -1
    for record, offset in live.records:
        wiped.replay(record, offset)
    wiped.flush_replay()
    assert wiped.debt == 0
    assert store_items(wiped.store) == store_items(live.writer.store)


def test_the_store_survives_a_reopen_with_its_offset(live: Log, tmp_path: Path) -> None:
    items = store_items(live.writer.store)
    live.writer.close()
    reopened = new_writer(tmp_path / "live", P)
    assert reopened.store.applied_offset == len(live.records) - 1
    assert store_items(reopened.store) == items


def test_take_over_raises_the_fencing_epoch_above_every_head(live: Log, tmp_path: Path) -> None:
    first = live.writer.take_over()
    assert first == 1
    log = Log(live.writer)
    log.records = list(live.records)
    log.run(send("alice", group_on(P), "after-takeover"))
    record = log.records[-1][0]
    assert isinstance(record, MessageCommitted) and record.fencing_epoch == 1

    # a restore from a checkpoint of epoch 1 plus the log lands above it
    again = new_writer(tmp_path / "again", P, live.writer.checkpoint(log.records[-1][1]))
    assert again.take_over() == 2
    assert again.take_over() == 3


def test_a_record_of_an_older_epoch_is_neither_applied_nor_archived(
    live: Log, tmp_path: Path
) -> None:
    live.writer.take_over()
    live.writer.take_over()
    log = Log(live.writer)
    log.records = list(live.records)
    log.run(send("alice", group_on(P), "epoch-2"))
    last, offset = log.records[-1]
    assert isinstance(last, MessageCommitted)
    import msgspec

    stale = msgspec.structs.replace(
        last,
        fencing_epoch=1,
        conversation_seq=last.conversation_seq + 1,
        message_id=b"\xff" * 16,
        last_activity_id=b"\xff" * 16,
        client_message_id="zombie",
    )
    before = store_items(live.writer.store)
    assert live.writer.apply(stale)[0] is ApplyOutcome.STALE_EPOCH
    live.writer.replay(stale, offset + 1)
    live.writer.flush_replay()
    assert store_items(live.writer.store) == before
