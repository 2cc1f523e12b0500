"""``OwnedPartition``: one transaction per batch, everything of the batch inside it.

Invariants (direction.md 4.6, spec 8.4): outbox appends, member slices, replies and the consumed
request offsets commit together; the MessageStore is written only after the commit; a failed
commit leaves nothing visible and propagates; a PULL_HISTORY after an append to the same
conversation is answered from a store that holds that append.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from qim.agents.writer.snapshot import latest_checkpoint
from qim.agents.writer.txn import CrashHook
from qim.schemas.records import ConversationRequest, decode_outbox_record, decode_writer_reply
from tests.unit.agents.support import (
    TOPICS,
    Consumed,
    FakeProducer,
    consumed,
    create,
    group_on,
    history,
    new_writer,
    owned,
    send,
    store_items,
)

P = 3


async def test_a_batch_is_one_transaction_with_its_request_offsets(tmp_path: Path) -> None:
    writer, producer = new_writer(tmp_path / "s", P), FakeProducer()
    group = group_on(P)
    part = owned(writer, producer)
    batch = [create("alice", group, ("bob",)), *(send("alice", group, f"m{i}") for i in range(3))]
    await part.process(consumed(batch, first=10))

    assert producer.transactions == 1
    outbox = [decode_outbox_record(s.value) for s in producer.on(TOPICS.outbox)]
    assert [r.conversation_seq for r in outbox] == [1, 2, 3, 4]  # the create is seq 1
    assert {s.partition for s in producer.on(TOPICS.outbox)} == {P}
    assert producer.on(TOPICS.dispatch), "the create's member slices ride the same transaction"
    replies = [decode_writer_reply(s.value) for s in producer.on(TOPICS.to_gateway)]
    assert [r.request_id for r in replies] == [r.request_id for r in batch]
    assert {s.partition for s in producer.on(TOPICS.to_gateway)} == {7}
    assert list(producer.group_offsets.values()) == [14]
    assert writer.store.applied_offset == 3


async def test_a_history_read_after_an_append_cuts_the_batch(tmp_path: Path) -> None:
    writer, producer = new_writer(tmp_path / "s", P), FakeProducer()
    group = group_on(P)
    part = owned(writer, producer)
    await part.process(consumed([create("alice", group, ("bob",))]))
    batch: list[ConversationRequest] = [
        send("alice", group, "fresh"),
        history("bob", group),
        send("bob", group, "later"),
    ]
    await part.process(consumed(batch, first=1))

    assert producer.transactions == 3
    replies = [decode_writer_reply(s.value) for s in producer.on(TOPICS.to_gateway)]
    read = replies[2].history
    assert read is not None  # the create's CONTROL message, then the message
    assert [m.client_message_id for m in read.messages] == [None, "fresh"]
    assert producer.group_offsets[next(iter(producer.group_offsets))] == 4


async def test_a_failed_commit_writes_nothing_and_propagates(tmp_path: Path) -> None:
    writer, producer = new_writer(tmp_path / "s", P), FakeProducer(fail_commit=True)
    group = group_on(P)
    with pytest.raises(RuntimeError, match="commit failed"):
        await owned(writer, producer).process(consumed([create("alice", group, ())]))
    assert producer.committed == [] and producer.aborted == 1
    assert store_items(writer.store) == [] and writer.store.applied_offset == -1


async def test_the_self_fence_refuses_the_commit(tmp_path: Path) -> None:
    writer, producer = new_writer(tmp_path / "s", P), FakeProducer()
    part = owned(writer, producer, lease=False)
    with pytest.raises(RuntimeError, match="lease"):
        await part.process(consumed([create("alice", group_on(P), ())]))
    assert producer.committed == []


async def test_a_checkpoint_commits_with_the_records_it_covers(tmp_path: Path) -> None:
    writer, producer = new_writer(tmp_path / "s", P), FakeProducer()
    group = group_on(P)
    part = owned(writer, producer, checkpoint_every=3)
    await part.process(consumed([create("alice", group, ()), send("alice", group, "a")]))
    assert producer.on(TOPICS.snapshots) == []
    await part.process(consumed([send("alice", group, "b")], first=2))
    snaps = producer.on(TOPICS.snapshots)
    assert snaps and {s.partition for s in snaps} == {P} and writer.debt == 0
    found = latest_checkpoint([s.value for s in snaps])
    assert found.checkpoint is not None and found.checkpoint.outbox_offset == 2
    assert found.checkpoint.writer == writer.state.snapshot()


async def test_a_reply_to_a_shard_that_does_not_exist_is_dropped(tmp_path: Path) -> None:
    writer, producer = new_writer(tmp_path / "s", P), FakeProducer()
    request = create("alice", group_on(P), ())
    broken = msgspec.structs.replace(request, connection_shard=9999)
    await owned(writer, producer).process(consumed([broken]))
    assert producer.on(TOPICS.to_gateway) == [] and len(producer.on(TOPICS.outbox)) == 1


async def test_an_undecodable_request_is_skipped_but_consumed(tmp_path: Path) -> None:
    writer, producer = new_writer(tmp_path / "s", P), FakeProducer()
    records = [Consumed(0, b"\xc1junk"), *consumed([create("alice", group_on(P), ())], first=1)]
    await owned(writer, producer).process(records)
    assert list(producer.group_offsets.values()) == [2]
    assert len(producer.on(TOPICS.outbox)) == 1


def test_the_crash_hook_is_armed_only_by_its_message() -> None:
    hook = CrashHook.from_env({"QIM_WRITER_CRASH_AT": "appended", "QIM_WRITER_CRASH_CMID": "x"})
    assert hook.armed([send("a", "g:x", "x")]) and not hook.armed([send("a", "g:x", "y")])
    assert not CrashHook.from_env({}).armed([send("a", "g:x", "")])
    with pytest.raises(ValueError, match="QIM_WRITER_CRASH_AT"):
        CrashHook.from_env({"QIM_WRITER_CRASH_AT": "somewhere"})
