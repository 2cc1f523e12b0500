"""UserConversationState (7.5): user actions, membership bounds, per-field merge (property 2)."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from qim.core.session_list import (
    ACTIVE,
    LEFT,
    REMOVED,
    ClearHistory,
    DeleteLocal,
    Join,
    Leave,
    MarkRead,
    MarkUnread,
    SetArchived,
    SetMuted,
    SetNotificationPolicy,
    SetPin,
    UserChange,
    UserConversationState,
    admit_conversation,
    apply_change,
    is_structural_change,
    merge,
)
from qim.schemas.frames import ErrorCode

BASE = UserConversationState(conversation_id="c")


def test_mark_read_only_moves_forward_and_clears_the_manual_mark() -> None:
    s = apply_change(BASE, MarkRead(10), activity_id=5)
    assert s.read_conversation_seq == 10 and s.state_version == 1
    assert apply_change(s, MarkRead(7), activity_id=6) is s  # stale read: no write
    marked = apply_change(s, MarkUnread(10), activity_id=7)
    assert marked.manual_unread_conversation_seq == 10  # set while read == latest (26.4.7 (1))
    still = apply_change(marked, MarkRead(9), activity_id=8)
    assert still.manual_unread_conversation_seq == 10
    cleared = apply_change(marked, MarkRead(10), activity_id=9)  # reaching U clears it
    assert cleared.manual_unread_conversation_seq is None
    assert cleared.read_conversation_seq == 10


def test_join_and_leave_write_sequence_bounds() -> None:
    joined = apply_change(BASE, Join(501), activity_id=1)
    assert joined.joined_at_conversation_seq == 500  # join event seq - 1 (7.5 example)
    assert not joined.visible(500) and joined.visible(501)
    left = apply_change(joined, Leave(600, REMOVED), activity_id=2)
    assert left.membership_state == REMOVED and left.left_at_conversation_seq == 600
    assert left.visible(599) and not left.visible(600) and not left.visible(601)
    assert apply_change(left, Join(550), activity_id=3) is left  # stale membership event
    back = apply_change(left, Join(700), activity_id=4)
    assert back.membership_state == ACTIVE and back.left_at_conversation_seq is None
    assert back.joined_at_conversation_seq == 699 and not back.visible(650)  # AT-48


def test_hide_and_delete_raise_the_lower_bound_and_the_base() -> None:
    s = apply_change(BASE, ClearHistory(40), activity_id=1)
    s = apply_change(s, DeleteLocal(30), activity_id=2)
    assert s.visible_lower == 40 and s.unread_base == 40
    assert s.deleted_before_conversation_seq == 30
    assert apply_change(s, ClearHistory(20), activity_id=3) is s


def test_structural_changes_are_pin_archive_and_membership() -> None:
    assert is_structural_change(BASE, apply_change(BASE, SetPin(1), activity_id=1))
    assert is_structural_change(BASE, apply_change(BASE, SetArchived(True), activity_id=1))
    assert is_structural_change(BASE, apply_change(BASE, Leave(3, LEFT), activity_id=1))
    assert not is_structural_change(BASE, apply_change(BASE, SetMuted(True), activity_id=1))
    assert not is_structural_change(BASE, apply_change(BASE, MarkRead(3), activity_id=1))


def test_conversation_quota() -> None:
    assert admit_conversation(4999, 5000) is None
    refused = admit_conversation(5000, 5000)
    assert refused is not None and refused.code == ErrorCode.PERMISSION_DENIED
    assert refused.detail == "conversation_quota_exhausted"


def test_per_field_winners_are_independent() -> None:
    """Device A pins at v1, device B mutes at v2 from the same base: both survive (26.4.5)."""
    a = apply_change(BASE, SetPin(2), activity_id=10)
    b = apply_change(
        apply_change(BASE, MarkRead(3), activity_id=11), SetMuted(True), activity_id=12
    )
    m = merge(a, b)
    assert (m.pin_rank, m.muted, m.read_conversation_seq) == (2, True, 3)
    newer_unpin = apply_change(b, SetPin(None), activity_id=13)  # v3 beats A's v1
    assert merge(a, newer_unpin).pin_rank is None


def test_manual_unread_merges_null_first_then_max() -> None:
    x = msgspec_replace(BASE, manual_unread_conversation_seq=5)
    y = msgspec_replace(BASE, manual_unread_conversation_seq=9)
    assert merge(x, y).manual_unread_conversation_seq == 9
    assert merge(x, BASE).manual_unread_conversation_seq is None


def msgspec_replace(state: UserConversationState, **fields: object) -> UserConversationState:
    return msgspec.structs.replace(state, **fields)


changes = st.one_of(
    st.builds(MarkRead, st.integers(0, 50)),
    st.builds(MarkUnread, st.integers(0, 50)),
    st.builds(ClearHistory, st.integers(0, 50)),
    st.builds(DeleteLocal, st.integers(0, 50)),
    st.builds(SetPin, st.none() | st.integers(0, 3)),
    st.builds(SetMuted, st.booleans()),
    st.builds(SetArchived, st.booleans()),
    st.builds(SetNotificationPolicy, st.sampled_from(("ALL", "MENTION_ONLY", "NONE"))),
    st.builds(Join, st.integers(1, 50)),
    st.builds(Leave, st.integers(1, 50), st.sampled_from((LEFT, REMOVED))),
)


@st.composite
def replicas(draw: st.DrawFn) -> UserConversationState:
    """A device's replica: a random history of changes from the shared base."""
    state = BASE
    for change in draw(st.lists(changes, max_size=8)):
        state = apply_change(state, change, activity_id=draw(st.integers(0, 1000)))
    return state


@given(replicas(), replicas(), replicas())
def test_merge_is_a_semilattice_join(
    a: UserConversationState, b: UserConversationState, c: UserConversationState
) -> None:
    """Property (2): commutative, associative, idempotent; watermarks never regress."""
    assert merge(a, b) == merge(b, a)
    assert merge(merge(a, b), c) == merge(a, merge(b, c))
    assert merge(a, a) == a
    m = merge(a, b)
    for field in (
        "read_conversation_seq",
        "hidden_before_conversation_seq",
        "deleted_before_conversation_seq",
        "membership_seq",
        "state_version",
    ):
        assert getattr(m, field) == max(getattr(a, field), getattr(b, field))
    assert m.pin_stamp == max(a.pin_stamp, b.pin_stamp)
    assert m.muted_stamp == max(a.muted_stamp, b.muted_stamp)


@given(st.lists(st.tuples(st.integers(0, 2), changes, st.integers(0, 1000)), max_size=20))
def test_devices_converge_whatever_the_merge_order(
    writes: list[tuple[int, UserChange, int]],
) -> None:
    """Three devices write concurrently; any merge order gives one state (26.4.5)."""
    devices = [BASE, BASE, BASE]
    for device, change, activity in writes:
        devices[device] = apply_change(devices[device], change, activity_id=activity)
    a, b, c = devices
    results = {
        merge(merge(a, b), c),
        merge(merge(c, a), b),
        merge(merge(b, c), a),
    }
    assert len({repr(r) for r in results}) == 1
