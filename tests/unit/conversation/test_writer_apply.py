"""ConversationWriterState allocation and apply: spec 6.2-6.4, 7.4, 8.3 crash, 19.2 fencing."""

from __future__ import annotations

import msgspec
import pytest

from qim.core.conversation import (
    Accepted,
    ApplyOutcome,
    ConversationWriterState,
    Duplicate,
    Rejected,
    WriterFencedError,
    placeholder_preview,
    replay,
)
from qim.schemas import (
    compose_message_id,
    message_id_to_bytes,
    split_message_id,
    unix_ms_to_hlc_ms,
)
from qim.schemas.frames import ErrorCode
from qim.schemas.message_types import MessageType
from qim.schemas.records.membership import MembershipCommitted

from .support import (
    NOW,
    REGION,
    WRITER,
    Groups,
    accepted,
    commit,
    config,
    contract,
    direct_request,
    send_request,
    typed_config,
    writer,
)


def _code(decision: object) -> ErrorCode:
    assert isinstance(decision, Rejected), decision
    return decision.code


def _id(data: bytes) -> int:
    return int.from_bytes(data, "big")


# -- 6.2-6.4 allocation and 7.4 head ------------------------------------------------------------


def test_6_3_6_4_seq_strictly_increasing_and_co_ordered_with_ids() -> None:
    state = writer()
    times = [0, 0, 0, 7, -1993, 12, 12, 912, -4000, 1912]  # steps back within tolerance
    records = []
    for i, dt in enumerate(times):
        sender, peer = ("alice", "bob") if i % 2 else ("bob", "alice")
        decision = commit(state, direct_request(sender, peer, f"c{i}"), NOW + dt)
        records.append(accepted(decision).record)
    assert [r.conversation_seq for r in records] == list(range(1, len(records) + 1))
    ids = [_id(r.message_id) for r in records]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(r.last_activity_id == r.message_id for r in records)
    assert all(split_message_id(i).writer_id == WRITER for i in ids)


def test_6_2_committed_at_is_the_writers_hlc_time() -> None:
    state = writer()
    first = accepted(commit(state, direct_request("alice", "bob", "a"), NOW)).record
    behind = accepted(commit(state, direct_request("alice", "bob", "b"), NOW - 3000)).record
    assert first.committed_at == NOW
    assert behind.committed_at == NOW  # the clock absorbed the step back
    assert split_message_id(_id(behind.message_id)).seq_in_ms == 1


def test_7_4_head_moves_forward_with_preview_sender_and_count() -> None:
    groups = Groups()
    groups.add("g:team", ["alice", "bob", "carol"], version=4)
    state = writer(typed_config(contract("card")))
    commit(state, send_request("alice", "g:team", "a"), NOW, groups)
    card = send_request("bob", "g:team", "b", message_type=MessageType.CUSTOM, custom_type="card")
    last = accepted(commit(state, card, NOW + 1, groups)).record
    head = state.head("acme", "g:team")
    assert head is not None
    assert (head.latest_conversation_seq, head.last_message_id, head.last_activity_id) == (
        2,
        last.message_id,
        last.last_activity_id,
    )
    assert head.last_sender_id == "bob" and head.member_count == 3 and head.head_version == 2
    assert (
        head.preview_or_placeholder
        == placeholder_preview(MessageType.CUSTOM, "card", "[card]")
        == (last.preview_or_placeholder)
    )
    assert last.membership_version == 4  # pinned before the outbox (7.9)
    assert state.apply(last) is ApplyOutcome.ALREADY_APPLIED
    assert state.head("acme", "g:team") == head


# -- 6.2 clock ----------------------------------------------------------------------------------


def test_6_2_clock_unsafe_beyond_tolerance_and_nothing_consumed() -> None:
    state = writer()
    commit(state, direct_request("alice", "bob", "a"), NOW)
    before = state.snapshot()
    unsafe = state.handle_send(direct_request("alice", "bob", "b"), NOW - 5001, Groups())
    assert _code(unsafe) is ErrorCode.CLOCK_UNSAFE
    assert isinstance(unsafe, Rejected) and unsafe.reply.error is not None
    assert unsafe.reply.error.retry_after_ms == 1
    assert state.snapshot() == before
    ok = accepted(commit(state, direct_request("alice", "bob", "b"), NOW - 5000))
    assert ok.record.conversation_seq == 2


@pytest.mark.parametrize("new_writer", [WRITER, WRITER + 1, 1])
def test_6_2_hlc_restored_from_replay_before_the_first_assignment(new_writer: int) -> None:
    state = writer()
    records = [
        accepted(commit(state, direct_request("alice", "bob", f"c{i}"), NOW)).record
        for i in range(5)
    ]
    rebuilt = replay(records, config(), region_id=REGION, writer_id=new_writer, fencing_epoch=2)
    assert rebuilt.last_hlc_ms == unix_ms_to_hlc_ms(NOW)
    nxt = accepted(commit(rebuilt, direct_request("alice", "bob", "n"), NOW - 4000)).record
    assert _id(nxt.message_id) > max(_id(r.message_id) for r in records)
    assert nxt.conversation_seq == 6


# -- crash between decision and apply; idempotent apply --------------------------------------


def test_8_3_crash_between_decision_and_append_leaves_no_trace() -> None:
    state = writer()
    commit(state, direct_request("alice", "bob", "a"))
    before = state.snapshot()
    lost = accepted(state.handle_send(direct_request("alice", "bob", "b"), NOW + 10, Groups()))
    assert state.snapshot() == before  # the shell crashed: never appended, never applied
    retry = accepted(state.handle_send(direct_request("alice", "bob", "b"), NOW + 10, Groups()))
    assert retry.record == lost.record  # same inputs, same decision
    later = accepted(state.handle_send(direct_request("alice", "bob", "b"), NOW + 99, Groups()))
    assert later.record.conversation_seq == lost.record.conversation_seq == 2
    assert _id(later.record.message_id) > _id(lost.record.message_id)  # only the ids differ


def test_apply_is_idempotent_per_record() -> None:
    state = writer()
    records = [
        accepted(commit(state, direct_request("alice", "bob", f"c{i}"))).record for i in range(3)
    ]
    before = state.snapshot()
    assert [state.apply(r) for r in records] == [ApplyOutcome.ALREADY_APPLIED] * 3
    assert state.snapshot() == before


# -- 19.2.1 fencing -----------------------------------------------------------------------------


def test_19_2_records_are_stamped_and_a_zombies_lower_epoch_is_dropped() -> None:
    new = writer(epoch=3)
    zombie = writer(epoch=2)
    mine = accepted(commit(new, direct_request("alice", "bob", "a"), NOW)).record
    stale = accepted(zombie.handle_send(direct_request("bob", "alice", "z"), NOW + 5, Groups()))
    assert (mine.fencing_epoch, stale.record.fencing_epoch) == (3, 2)
    before = new.snapshot()
    assert new.apply(stale.record) is ApplyOutcome.STALE_EPOCH
    assert new.snapshot() == before
    head = new.head("acme", mine.conversation_id)
    assert head is not None and head.fencing_epoch == 3


def test_19_2_a_writer_behind_the_logs_epoch_refuses_to_write() -> None:
    record = accepted(commit(writer(epoch=5), direct_request("alice", "bob"))).record
    old = replay([record], config(), region_id=REGION, writer_id=WRITER, fencing_epoch=4)
    with pytest.raises(WriterFencedError):
        old.handle_send(direct_request("alice", "bob", "x"), NOW + 1, Groups())
    with pytest.raises(ValueError):
        old.raise_fencing_epoch(3)
    old.raise_fencing_epoch(6)
    assert isinstance(
        old.handle_send(direct_request("alice", "bob", "x"), NOW + 1, Groups()), Accepted
    )


# -- other record kinds share the seq space --------------------------------------------------------


def test_membership_control_message_occupies_a_seq_the_next_message_skips() -> None:
    groups = Groups()
    groups.add("g:team", ["alice", "bob"])
    state = writer()
    commit(state, send_request("alice", "g:team", "a"), NOW, groups)
    stamp = state.next_coordinates("acme", "g:team", NOW + 1)
    assert stamp.conversation_seq == 2
    control = MembershipCommitted(
        tenant_id="acme",
        group_id="g:team",
        action="leave",
        actor="bob",
        targets=("bob",),
        membership_version=2,
        member_count=1,
        conversation_seq=stamp.conversation_seq,
        message_id=stamp.message_id,
        last_activity_id=stamp.last_activity_id,
        committed_at=stamp.committed_at,
    )
    assert state.apply(control) is ApplyOutcome.APPLIED
    assert state.apply(control) is ApplyOutcome.ALREADY_APPLIED
    nxt = accepted(commit(state, send_request("alice", "g:team", "b"), NOW + 1, groups)).record
    assert nxt.conversation_seq == 3 and _id(nxt.message_id) > _id(stamp.message_id)
    head = state.head("acme", "g:team")
    assert head is not None and head.last_message_id == nxt.message_id


def test_group_create_without_coordinates_is_unsequenced() -> None:
    create = MembershipCommitted(
        tenant_id="acme",
        group_id="g:team",
        action="create",
        actor="alice",
        membership_version=1,
        member_count=1,
    )
    state = writer()
    assert state.apply(create) is ApplyOutcome.UNSEQUENCED
    assert state.snapshot() == writer().snapshot()


def test_a_foreign_writers_id_in_the_same_ms_is_still_exceeded() -> None:
    foreign = message_id_to_bytes(compose_message_id(unix_ms_to_hlc_ms(NOW), REGION, 999, 3))
    other = accepted(writer().handle_send(direct_request("alice", "bob"), NOW, Groups())).record
    record = msgspec.structs.replace(other, message_id=foreign, last_activity_id=foreign)
    state = writer()
    state.apply(record)
    nxt = accepted(commit(state, direct_request("alice", "bob", "n"), NOW)).record
    assert _id(nxt.message_id) > _id(foreign)


def test_restored_state_is_equal_under_any_incarnation() -> None:
    state = writer()
    commit(state, direct_request("alice", "bob", "a"))
    snap = state.snapshot()
    again = ConversationWriterState.restore(
        snap, config(), region_id=9, writer_id=77, fencing_epoch=2
    )
    assert again.snapshot() == snap
    dup = again.handle_send(direct_request("alice", "bob", "a"), NOW, Groups())
    assert isinstance(dup, Duplicate)
