"""Target shards: exactly one GroupDispatch per target MailboxShard (spec 7.8, 10.1 steps 3-5)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qim.core.fanout import FanoutConfig, FanoutLogError, FanoutState, NotReady, NotReadyReason
from qim.schemas import dispatch_id
from qim.schemas.ids import message_id_from_bytes
from qim.schemas.records.dispatch import GroupDispatch, ReactionSummary
from qim.schemas.records.membership import MemberSliceRecord
from qim.schemas.records.outbox import MessageCommitted, MessageReacted
from tests.unit.fanout.support import Outbox, T, pipeline, run, shard_of

USERS = [f"user-{i:03d}" for i in range(60)]


def _dispatches(records: object) -> list[GroupDispatch]:
    assert isinstance(records, list)
    return [r for r in records if isinstance(r, GroupDispatch)]


def _member_shards(outbox: Outbox, group: str, shards: int) -> set[int]:
    state = outbox.membership.group(T, group)
    assert state is not None
    return {shard_of(u, shards) for u, row in state.rows.items() if row.active}


ops = st.lists(
    st.tuples(st.sampled_from(["add", "remove", "leave", "send"]), st.sets(st.sampled_from(USERS))),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(
    shards=st.sampled_from([1, 2, 4, 8, 64, 256]),
    initial=st.sets(st.sampled_from(USERS), max_size=30),
    script=ops,
)
def test_7_8_exactly_one_dispatch_per_target_shard_of_the_pinned_version(
    shards: int, initial: set[str], script: list[tuple[str, set[str]]]
) -> None:
    outbox = Outbox(shards=shards)
    outbox.create("g:prop", "owner", sorted(initial))
    state = FanoutState(FanoutConfig(mailbox_shard_count=shards))
    for op, users in script:
        if op == "add":
            outbox.add("g:prop", sorted(users | {"x"}))
        elif op == "remove":
            outbox.remove("g:prop", sorted(users))
        elif op == "leave":  # the OWNER cannot leave (20.2.2): members in ``users`` do
            for user in sorted(u for u in users if outbox.membership.is_member(T, "g:prop", u)):
                outbox.leave("g:prop", user)
        elif op == "send" and outbox.membership.member_count(T, "g:prop"):
            expected = _member_shards(outbox, "g:prop", shards)  # members' shards, at send time
            run(state, outbox.log)
            outbox.log.clear()
            record = outbox.send("g:prop", "owner")
            dispatches = _dispatches(state.apply_outbox(outbox.log.pop()))
            targets = [d.target_mailbox_shard for d in dispatches]
            assert sorted(targets) == sorted(expected)  # every member shard once, no other
            assert len(targets) == len(set(targets))
            mid = message_id_from_bytes(record.message_id)
            assert all(
                d.dispatch_id == dispatch_id(mid, d.target_mailbox_shard) for d in dispatches
            )
            assert all(d.partition == d.target_mailbox_shard < shards for d in dispatches)
            assert all(d.membership_version == record.membership_version for d in dispatches)
    run(state, outbox.log)


def test_10_1_direct_chat_with_both_users_on_one_shard_gets_one_dispatch() -> None:
    shards = 4
    a = "alice"
    b = next(u for u in USERS if shard_of(u, shards) == shard_of(a, shards))
    outbox = Outbox(shards=shards)
    record = outbox.direct(a, b)
    (only,) = _dispatches(
        FanoutState(FanoutConfig(mailbox_shard_count=shards)).apply_outbox(record)
    )
    assert only.target_mailbox_shard == shard_of(a, shards)
    assert only.participants == record.participants and len(record.participants) == 2


def test_10_1_direct_chat_across_two_shards_gets_two_dispatches_and_a_note_to_self_one() -> None:
    shards = 64
    a = "alice"
    b = next(u for u in USERS if shard_of(u, shards) != shard_of(a, shards))
    outbox = Outbox(shards=shards)
    state = FanoutState(FanoutConfig(mailbox_shard_count=shards))
    two = _dispatches(state.apply_outbox(outbox.direct(a, b)))
    assert [d.target_mailbox_shard for d in two] == sorted({shard_of(a, 64), shard_of(b, 64)})
    assert len(_dispatches(state.apply_outbox(outbox.direct(a, a)))) == 1


def test_7_8_dispatch_copies_every_commit_time_decision() -> None:
    outbox = Outbox()
    outbox.create("g:copy", "owner", ["m1", "m2"])
    record = outbox.send("g:copy", "owner", mentions=("m1",), inline=True, fencing_epoch=3)
    state = FanoutState()
    run(state, outbox.log[:-1])
    for d in _dispatches(state.apply_outbox(record)):
        assert (d.message_id, d.conversation_seq, d.last_activity_id) == (
            record.message_id,
            record.conversation_seq,
            record.last_activity_id,
        )
        assert (d.sender_id, d.origin_device_id, d.client_message_id) == (
            record.sender_id,
            record.origin_device_id,
            record.client_message_id,
        )
        assert (d.committed_at, d.fencing_epoch, d.inline_body) == (record.committed_at, 3, True)
        assert d.payload == record.payload  # the body always rides along (direction 4.4)
        assert d.event_template.mention_targets == ("m1",) and d.event_template.counts_unread


def test_7_9_message_pinned_to_an_unknown_version_is_not_ready_and_changes_nothing() -> None:
    outbox = Outbox()
    outbox.create("g:late", "owner", ["m1"])
    outbox.add("g:late", ["m2"])
    record = outbox.send("g:late", "owner")  # pins v2
    state = FanoutState()
    run(state, outbox.log[:1])  # only v1 applied
    before = state.encode()
    result = state.apply_outbox(record)
    assert isinstance(result, NotReady)
    assert (result.reason, result.membership_version, result.known_version) == (
        NotReadyReason.VERSION_UNKNOWN,
        2,
        1,
    )
    assert state.encode() == before
    run(state, outbox.log[1:-1])
    assert not isinstance(state.apply_outbox(record), NotReady)


def test_7_9_message_to_a_group_whose_chunked_create_is_incomplete_is_not_ready() -> None:
    outbox = Outbox()
    outbox.create("g:chunks", "owner", USERS[:10], chunk=4)
    record = outbox.send("g:chunks", "owner")
    state = FanoutState()
    produced = [state.apply_outbox(r) for r in outbox.log[:2]]
    assert produced == [[], []]  # no slice before the version exists
    result = state.apply_outbox(record)
    assert isinstance(result, NotReady) and result.reason is NotReadyReason.VERSION_UNKNOWN


def test_10_4_3_redelivered_message_of_a_retired_version_is_reported_not_guessed() -> None:
    outbox = Outbox()
    outbox.create("g:old", "owner", ["m1"])
    old = outbox.send("g:old", "owner")
    for user in ("m2", "m3", "m4"):
        outbox.add("g:old", [user])
    state = FanoutState(FanoutConfig(max_retained_versions=2))
    run(state, outbox.log)
    result = state.apply_outbox(old)
    assert isinstance(result, NotReady) and result.reason is NotReadyReason.VERSION_RETIRED


def test_direction_4_3_slices_are_the_writers_and_precede_every_dispatch_pinned_to_them() -> None:
    outbox = Outbox()
    outbox.create("g:order", "owner", USERS[:20])
    outbox.add("g:order", ["late"])
    outbox.send("g:order", "late")
    coordinator = run(FanoutState(), outbox.log)
    assert not any(isinstance(r, MemberSliceRecord) for r in coordinator)  # never published twice
    produced = pipeline(outbox, FanoutState())  # writer's transaction, then the coordinator
    first_dispatch: dict[tuple[int, int], int] = {}
    last_slice: dict[tuple[int, int], int] = {}
    for position, record in enumerate(produced):
        if isinstance(record, MemberSliceRecord):
            last_slice[(record.membership_version, record.partition)] = position
        elif isinstance(record, GroupDispatch) and record.membership_version:
            key = (record.membership_version, record.partition)
            first_dispatch.setdefault(key, position)
    assert first_dispatch
    assert all(last_slice[key] < position for key, position in first_dispatch.items())


def test_10_1_direct_message_without_participants_is_a_log_error() -> None:
    record = Outbox().direct("a", "b")
    broken = MessageCommitted(
        **{f: getattr(record, f) for f in record.__struct_fields__ if f != "participants"}
    )
    with pytest.raises(FanoutLogError):
        FanoutState().apply_outbox(broken)


def test_7_9_membership_change_ahead_of_the_state_is_not_ready_and_changes_nothing() -> None:
    outbox = Outbox()
    outbox.create("g:gap", "owner", ["m1"])
    outbox.add("g:gap", ["m2"])
    outbox.add("g:gap", ["m3"])
    state = FanoutState()
    assert isinstance(state.apply_outbox(outbox.log[1]), NotReady)  # no create yet
    run(state, outbox.log[:1])
    before = state.encode()
    result = state.apply_outbox(outbox.log[2])  # v3 while at v1
    assert isinstance(result, NotReady) and (result.membership_version, result.known_version) == (
        3,
        1,
    )
    assert state.encode() == before


def _reaction(message: MessageCommitted, version: int, counts: dict[str, int]) -> MessageReacted:
    return MessageReacted(
        tenant_id=T,
        conversation_id=message.conversation_id,
        conversation_kind=message.conversation_kind,
        participants=message.participants,
        target_conversation_seq=message.conversation_seq,
        target_message_id=message.message_id,
        user_id="user-001",
        reaction_key="like",
        action="add",
        counts=counts,
        summary_version=version,
        membership_version=message.membership_version,
        member_count=3,
        committed_at=message.committed_at + version,
    )


def test_13_6_a_reaction_sends_one_summary_per_target_shard_and_no_dispatch() -> None:
    shards = 8
    outbox = Outbox(shards=shards)
    outbox.create("g:react", "owner", USERS[:30])
    message = outbox.send("g:react", "owner")
    state = FanoutState(FanoutConfig(mailbox_shard_count=shards))
    delivered = _dispatches(run(state, outbox.log))
    out = run(state, [_reaction(message, 2, {"like": 1, "+1": 1})])
    assert all(isinstance(r, ReactionSummary) for r in out)
    targets = sorted(
        d.target_mailbox_shard for d in delivered if d.message_id == message.message_id
    )
    assert [r.partition for r in out] == targets and len(targets) > 1
    first = out[0]
    assert isinstance(first, ReactionSummary)
    assert (first.message_id, first.conversation_seq) == (
        message.message_id,
        message.conversation_seq,
    )
    assert (first.counts, first.summary_version) == ({"+1": 1, "like": 1}, 2)
    assert list(first.counts) == ["+1", "like"]  # sorted: the bytes never follow arrival order


def test_13_6_a_direct_reaction_goes_to_the_participants_shards() -> None:
    shards = 64
    outbox = Outbox(shards=shards)
    message = outbox.direct("alice", "bob")
    state = FanoutState(FanoutConfig(mailbox_shard_count=shards))
    out = run(state, [message, _reaction(message, 1, {"like": 1})])
    summaries = [r for r in out if isinstance(r, ReactionSummary)]
    assert sorted(r.partition for r in summaries) == sorted(
        {shard_of("alice", shards), shard_of("bob", shards)}
    )
