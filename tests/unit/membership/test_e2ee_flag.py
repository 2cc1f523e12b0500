"""The E2EE flag in membership state (spec 22.1, AT-43, AT-44): fixed at creation, replayable.

The flag is carried by the create records only; every later record leaves it alone, a record
that tries to set it is a broken log, and ``e2ee_max_members`` bounds an E2EE group (never a
plaintext one) with ``PERMISSION_DENIED, detail=e2ee_member_limit``.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qim.core.membership import (
    E2EE_MEMBER_LIMIT,
    GroupMembership,
    MembershipLogError,
    MembershipRejected,
)
from qim.schemas.frames.errors import ErrorCode
from qim.schemas.records import decode_outbox_record, encode_outbox_record
from qim.schemas.records.membership import MembershipAction, control_of, decode_control
from tests.unit.membership.support import Harness

T = "t1"
G = "g:secret"


def _replayed(h: Harness) -> GroupMembership:
    state = GroupMembership(mailbox_shard_count=h.shards)
    for record in h.log:
        state.apply(decode_outbox_record(encode_outbox_record(record)))  # type: ignore[arg-type]
    return state


def test_a_group_created_e2ee_is_flagged_and_an_ordinary_one_is_not() -> None:
    h = Harness()
    h.create(T, G, "alice", ["bob"], e2ee=True)
    h.create(T, "g:plain", "alice", ["bob"])
    assert h.state.is_e2ee(T, G)
    assert not h.state.is_e2ee(T, "g:plain")
    assert not h.state.is_e2ee(T, "g:none")
    assert not h.state.is_e2ee("t2", G)  # tenant-scoped like every other answer
    create = h.log[0]
    assert create.e2ee
    # clients learn it from the create's CONTROL payload; an ordinary create omits the key
    assert decode_control(msgspec.msgpack.encode(control_of(create))).e2ee
    assert b"e2ee" not in msgspec.msgpack.encode(control_of(h.log[1]))
    assert b"e2ee" not in encode_outbox_record(h.log[1])  # older records' bytes unchanged


def test_the_flag_survives_every_later_change_and_replay_and_the_checkpoint() -> None:
    h = Harness()
    h.create(T, G, "alice", ["bob", "carol"], e2ee=True)
    h.add(T, G, ["dave"])
    h.remove(T, G, ["carol"])
    h.leave(T, G, "bob")
    h.set_role(T, G, ["dave"], "ADMIN")
    h.transfer(T, G, "dave")
    assert all(not r.e2ee for r in h.log[1:])
    assert h.state.is_e2ee(T, G)
    replayed = _replayed(h)
    assert replayed.is_e2ee(T, G)
    assert replayed.encode() == h.state.encode()
    restored = GroupMembership.decode(h.state.encode(), mailbox_shard_count=h.shards)
    assert restored.is_e2ee(T, G)
    assert restored.encode() == h.state.encode()


def test_a_later_record_cannot_set_the_flag() -> None:
    h = Harness()
    h.create(T, "g:plain", "alice", ["bob"])
    record = h.add(T, "g:plain", ["carol"])
    assert record is not None
    forged = msgspec.structs.replace(record, membership_version=record.membership_version + 1)
    forged = msgspec.structs.replace(forged, e2ee=True, targets=("dave",), member_count=4)
    with pytest.raises(MembershipLogError, match="only a create carries e2ee"):
        h.state.apply(forged)
    assert not h.state.is_e2ee(T, "g:plain")


def test_create_chunks_must_agree_on_the_flag() -> None:
    h = Harness(chunk_max_members=2)
    h.create(T, G, "alice", ["bob", "carol", "dave"], e2ee=True)
    assert len(h.log) == 2 and all(r.e2ee for r in h.log)
    state = GroupMembership(mailbox_shard_count=h.shards)
    state.apply(h.log[0])
    with pytest.raises(MembershipLogError, match="disagree on e2ee"):
        state.apply(msgspec.structs.replace(h.log[1], e2ee=False))


def test_AT43_an_add_past_e2ee_max_members_is_refused_and_the_group_stays_e2ee() -> None:
    h = Harness(e2ee_max_members=4)
    h.create(T, G, "alice", ["bob", "carol"], e2ee=True)
    h.add(T, G, ["dave"])  # the 4th member: exactly at the limit
    version = h.state.version(T, G)
    with pytest.raises(MembershipRejected) as refused:
        h.add(T, G, ["erin"])
    assert refused.value.code == ErrorCode.PERMISSION_DENIED
    assert refused.value.detail == E2EE_MEMBER_LIMIT
    assert h.state.version(T, G) == version  # nothing committed, no seq taken
    assert h.state.member_count(T, G) == 4
    assert h.state.is_e2ee(T, G)  # never a silent fall-back (22.1)
    # the same add to a plaintext group of the same size is fine: the limit is E2EE's only
    h.create(T, "g:plain", "alice", ["bob", "carol", "dave"])
    assert h.add(T, "g:plain", ["erin"]) is not None
    # and a leave makes room again
    h.leave(T, G, "dave")
    assert h.add(T, G, ["erin"]) is not None


def test_AT44_creating_an_e2ee_group_larger_than_the_limit_is_refused() -> None:
    h = Harness(e2ee_max_members=3)
    with pytest.raises(MembershipRejected) as refused:
        h.create(T, G, "alice", ["bob", "carol", "dave"], e2ee=True)
    assert refused.value.detail == E2EE_MEMBER_LIMIT
    assert h.state.group(T, G) is None and not h.log
    h.create(T, G, "alice", ["bob", "carol", "dave"])  # the same group in plaintext is allowed
    assert not h.state.is_e2ee(T, G)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(("add", "remove", "leave")),
            st.lists(st.sampled_from([f"u{i}" for i in range(8)]), min_size=1, max_size=3),
        ),
        max_size=25,
    )
)
def test_model_an_e2ee_group_never_exceeds_the_limit_and_replays_identically(
    program: list[tuple[str, list[str]]],
) -> None:
    limit = 5
    h = Harness(e2ee_max_members=limit)
    h.create(T, G, "owner", ["u0"], e2ee=True)
    members = {"owner", "u0"}
    for kind, users in program:
        try:
            if kind == "add":
                joining = set(users) - members
                record = h.add(T, G, users)
                assert len(members | joining) <= limit  # accepted only within the limit
                assert (record is None) == (not joining)
                members |= joining
            elif kind == "remove":
                h.remove(T, G, users)
                members -= set(users)
            else:
                h.leave(T, G, users[0])
                members.discard(users[0])
        except MembershipRejected as exc:
            if kind == "add":
                assert exc.detail == E2EE_MEMBER_LIMIT
                assert len(members | set(users)) > limit
        group = h.state.group(T, G)
        assert group is not None and group.e2ee
        assert group.member_count == len(members) <= limit
    assert all(r.e2ee == (r.action == MembershipAction.CREATE) for r in h.log)
    assert _replayed(h).encode() == h.state.encode()
