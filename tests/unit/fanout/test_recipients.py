"""Who receives, end to end: dispatches + slices + the MailboxNode rule vs an interval model.

Spec 10.1 step 9 (membership boundary filter), 7.5 (open intervals, ``joined_at = J - 1``,
``left_at = J``), 10.1.3 and 26.3.9 (membership events: the subject always, the others only in
small groups), 11.4.1 (mentions on the MESSAGE entry). The reference never sees a dispatch.
"""

from __future__ import annotations

from dataclasses import asdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qim.core.fanout import (
    Delivery,
    FanoutConfig,
    FanoutState,
    SliceMismatch,
    expand_dispatch,
)
from qim.core.membership import ShardSlice, SliceAssembler
from qim.schemas.events import EventType
from qim.schemas.frames.base import MentionType
from qim.schemas.records.dispatch import DispatchLogRecord
from qim.schemas.records.membership import MemberSliceRecord
from tests.unit.fanout.support import (
    IntervalModel,
    Outbox,
    T,
    after_create,
    delivered,
    pipeline,
    shard_of,
)

USERS = [f"u{i:02d}" for i in range(24)]
G = "g:e2e"

step = st.one_of(
    st.tuples(st.just("add"), st.sets(st.sampled_from(USERS), min_size=1, max_size=4)),
    st.tuples(st.just("remove"), st.sets(st.sampled_from(USERS), min_size=1, max_size=3)),
    st.tuples(st.just("ban"), st.sets(st.sampled_from(USERS), min_size=1, max_size=2)),
    st.tuples(st.just("leave"), st.sets(st.sampled_from(USERS), min_size=1, max_size=1)),
    st.tuples(st.just("send"), st.sets(st.sampled_from(USERS), max_size=2)),
)


def _slice_of(produced: list[DispatchLogRecord]) -> ShardSlice:
    assembler = SliceAssembler()
    done = [assembler.apply(r) for r in produced if isinstance(r, MemberSliceRecord)]
    (found,) = [d for d in done if d is not None]
    return found


def _play(outbox: Outbox, script: list[tuple[str, set[str]]]) -> None:
    for op, users in script:
        members = [u for u in sorted(users) if outbox.membership.is_member(T, G, u)]
        if op == "add":
            outbox.add(G, sorted(users))
        elif op in ("remove", "ban"):
            outbox.remove(G, members, ban=op == "ban")
        elif op == "leave" and members:
            outbox.leave(G, members[0])
        elif op == "send":
            outbox.send(G, "owner", mentions=tuple(sorted(users)))


def _compare(outbox: Outbox, shards: int, broadcast_max: int) -> None:
    config = FanoutConfig(
        mailbox_shard_count=shards, membership_event_broadcast_max_members=broadcast_max
    )
    got = delivered(pipeline(outbox, FanoutState(config)), shards)
    model = IntervalModel(broadcast_max)
    for record in outbox.log:
        model.fold(record)
    assert {m: e for m, e in model.expected.items() if e} == got


@settings(max_examples=80, deadline=None)
@given(
    shards=st.sampled_from([1, 4, 64]),
    initial=st.sets(st.sampled_from(USERS), max_size=10),
    script=st.lists(step, max_size=30),
    broadcast_max=st.sampled_from([0, 5, 500]),
)
def test_10_1_step9_receivers_match_the_interval_model_through_joins_leaves_and_rejoins(
    shards: int, initial: set[str], script: list[tuple[str, set[str]]], broadcast_max: int
) -> None:
    outbox = Outbox(shards=shards)
    outbox.create(G, "owner", sorted(initial))
    _play(outbox, script)
    _compare(outbox, shards, broadcast_max)


def test_26_3_4_leaver_gets_the_message_before_its_leave_and_nothing_from_it_on() -> None:
    outbox = Outbox()
    outbox.create(G, "owner", ["x", "y"])
    before = outbox.send(G, "owner")  # L - 1
    leave = outbox.leave(G, "x")  # L: the CONTROL message
    after = outbox.send(G, "owner")  # L + 1
    got = delivered(pipeline(outbox, FanoutState()), 64)
    assert Delivery("x", EventType.MESSAGE) in got[before.message_id]
    assert {d for d in got[leave.message_id] if d.user_id == "x"} == {
        Delivery("x", EventType.MEMBERSHIP)  # its own removal, nothing else
    }
    assert not any(d.user_id == "x" for d in got[after.message_id])
    assert Delivery("y", EventType.MESSAGE) in got[leave.message_id]  # small group: broadcast


def test_26_3_5_joiner_gets_one_membership_entry_and_nothing_from_before_its_join() -> None:
    outbox = Outbox()
    outbox.create(G, "owner", ["m1"])
    old = [outbox.send(G, "owner") for _ in range(3)]
    join = outbox.add(G, ["y"])
    assert join is not None
    new = outbox.send(G, "m1")
    got = delivered(pipeline(outbox, FanoutState()), 64)
    assert all(not any(d.user_id == "y" for d in got[m.message_id]) for m in old)
    assert [d for d in got[join.message_id] if d.user_id == "y"] == [
        Delivery("y", EventType.MEMBERSHIP)
    ]
    assert Delivery("y", EventType.MESSAGE) in got[new.message_id]


def test_26_3_9_big_group_membership_change_reaches_only_its_subject() -> None:
    outbox = Outbox()
    outbox.create(G, "owner", USERS)
    join = outbox.add(G, ["newcomer"])
    assert join is not None
    config = FanoutConfig(membership_event_broadcast_max_members=10)  # 26 members > 10
    produced = pipeline(outbox, FanoutState(config))
    dispatches = after_create(produced)
    assert [d.target_mailbox_shard for d in dispatches] == [shard_of("newcomer", 64)]
    assert dispatches[0].membership_version == 0  # no member expansion
    assert delivered(produced, 64)[join.message_id] == {Delivery("newcomer", EventType.MEMBERSHIP)}


def test_10_1_3_membership_event_flags_create_no_unread_and_move_the_session() -> None:
    outbox = Outbox()
    outbox.create(G, "owner", ["a"])
    outbox.leave(G, "a")
    produced = pipeline(outbox, FanoutState())
    (control,) = after_create(produced)[:1]
    template = control.event_template
    assert (template.counts_unread, template.affects_session_order, template.timeline_visible) == (
        False,
        True,
        True,
    )
    assert control.event_type == EventType.MEMBERSHIP and control.custom_type == "qim.membership.v1"


def test_11_4_1_mentions_ride_on_the_message_entry_unless_mention_entries_are_on() -> None:
    outbox = Outbox(shards=1)
    outbox.create(G, "owner", ["a", "b"])
    record = outbox.send(G, "owner", mentions=("a",))
    config = FanoutConfig(mailbox_shard_count=1)
    produced = pipeline(outbox, FanoutState(config))
    assert delivered(produced, 1)[record.message_id] == {
        Delivery("a", EventType.MESSAGE, MentionType.AT_ME),
        Delivery("b", EventType.MESSAGE),
        Delivery("owner", EventType.MESSAGE),
    }
    (dispatch,) = after_create(produced)
    tier = expand_dispatch(dispatch, _slice_of(produced), lambda u: 0, mention_entries=True)
    assert Delivery("a", EventType.MENTION, MentionType.AT_ME) in tier  # mention_only tier
    assert len(tier) == 4


def test_10_1_step9_slice_members_outside_the_interval_are_filtered_by_seq() -> None:
    """A slice may hold a member whose join is not below the seq (e.g. versions merged over
    ``membership_version_merge_window``, 7.9): ``joined_at < seq`` decides, not the bitmap."""
    outbox = Outbox(shards=1)
    outbox.create(G, "owner", ["a", "b", "c"])
    outbox.seqs[G] = 40
    record = outbox.send(G, "owner")  # seq 41
    produced = pipeline(outbox, FanoutState(FanoutConfig(mailbox_shard_count=1)))
    (dispatch,) = after_create(produced)
    full = _slice_of(produced)
    assert full.user_ids == ("owner", "a", "b", "c")  # slot order
    seq = record.conversation_seq
    shifted = ShardSlice(**{**asdict(full), "joined_at": (0, seq - 1, seq, seq + 5)})
    got = expand_dispatch(dispatch, shifted, lambda u: 0)
    assert [d.user_id for d in got] == ["a", "owner"]  # joined_at = seq and later: invisible


def test_10_1_expansion_refuses_a_slice_of_another_version() -> None:
    outbox = Outbox(shards=1)
    outbox.create(G, "owner", ["a"])
    record = outbox.send(G, "owner")
    (dispatch,) = after_create(pipeline(outbox, FanoutState(FanoutConfig(mailbox_shard_count=1))))
    assert record.membership_version == 1
    with pytest.raises(SliceMismatch):
        expand_dispatch(dispatch, None, lambda u: 0)
