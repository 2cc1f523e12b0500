"""GroupMembership rules: slots, versions, intervals, permissions, tenants (spec 7.5, 7.9, A.3)."""

from __future__ import annotations

import msgspec
import pytest

from qim.core.conversation.membership import MembershipView
from qim.core.membership import (
    ControlStamp,
    GroupMembership,
    GroupState,
    MembershipLogError,
    MembershipRejected,
    add_members,
    create_group,
    leave_group,
)
from qim.schemas.frames.errors import ErrorCode
from qim.schemas.frames.exceptions import ProtocolError
from qim.schemas.records import decode_outbox_record, encode_outbox_record
from qim.schemas.records.membership import (
    MEMBERSHIP_CUSTOM_TYPE,
    MembershipAction,
    MembershipState,
    Role,
    control_of,
    decode_control,
    encode_control,
)
from tests.unit.membership.support import Harness

T = "t1"
G = "g:team"


def _group(h: Harness, tenant: str = T) -> GroupState:
    group = h.state.group(tenant, G)
    assert group is not None
    return group


def _harness_with_group(members: tuple[str, ...] = ("bob", "carol")) -> Harness:
    h = Harness()
    h.create(T, G, "alice", members)
    return h


def test_7_9_slot_ids_never_reused_across_leave_join_cycles() -> None:
    h = _harness_with_group()
    seen: dict[int, str] = {}
    for row in _group(h).rows.values():
        seen[row.slot_id] = row.user_id
    for _ in range(5):
        h.leave(T, G, "bob")
        h.add(T, G, ["bob", "dave"])
        h.remove(T, G, ["dave"])
        group = h.state.group(T, G)
        assert group is not None
        for row in group.rows.values():
            assert seen.setdefault(row.slot_id, row.user_id) == row.user_id
    group = h.state.group(T, G)
    assert group is not None
    assert len(seen) == group.next_slot  # every slot id handed out exactly once
    assert group.rows["bob"].slot_id == group.next_slot - 2  # the latest join's fresh slot


def test_7_9_membership_version_increments_once_per_committed_change() -> None:
    h = _harness_with_group()
    assert h.state.version(T, G) == 1
    h.add(T, G, ["dave"])
    assert h.state.version(T, G) == 2
    h.remove(T, G, ["dave"])
    assert h.state.version(T, G) == 3
    h.leave(T, G, "carol")
    assert h.state.version(T, G) == 4
    assert h.add(T, G, ["bob"]) is None  # already a member: nothing to commit, no seq used
    assert h.remove(T, G, ["nobody"]) is None
    assert h.state.version(T, G) == 4
    assert [p.membership_version for p in h.published] == [1, 2, 3, 4]


def test_A3_create_group_initial_members_joined_at_zero_and_no_seq() -> None:
    h = _harness_with_group()
    (record,) = h.log
    assert record.action == MembershipAction.CREATE
    assert record.conversation_seq == 0 and record.message_id == bytes(16)
    assert record.targets == ("bob", "carol")  # creator is the actor, not a target
    for user in ("alice", "bob", "carol"):
        assert h.state.visible_interval(T, G, user) == (0, None)
    group = h.state.group(T, G)
    assert group is not None
    assert group.rows["alice"].role == Role.OWNER and group.rows["bob"].role == Role.MEMBER


def test_7_5_join_event_at_seq_501_sets_joined_at_500() -> None:
    h = _harness_with_group()
    h.send(T, G, 500)
    record = h.add(T, G, ["dave"])
    assert record is not None and record.conversation_seq == 501
    assert h.state.visible_interval(T, G, "dave") == (500, None)


def test_12_10_leave_at_J_sets_left_at_J_and_rejoin_clears_it_AT48() -> None:
    h = _harness_with_group()
    h.send(T, G, 199)
    record = h.leave(T, G, "bob")
    assert record.conversation_seq == 200
    assert h.state.visible_interval(T, G, "bob") == (0, 200)
    assert not h.state.is_member(T, G, "bob")
    assert _group(h).rows["bob"].state == MembershipState.LEFT
    h.send(T, G, 50)
    h.add(T, G, ["bob"])  # rejoin at 251
    assert h.state.visible_interval(T, G, "bob") == (250, None)


def test_A3_leave_non_member_and_unknown_group_are_indistinguishable() -> None:
    h = _harness_with_group()
    stamp = ControlStamp(9, 1, 1, 1)
    errors = []
    for group, user in ((G, "mallory"), ("g:nope", "alice")):
        with pytest.raises(MembershipRejected) as info:
            leave_group(h.state, tenant_id=T, group_id=group, user_id=user, stamp=stamp)
        errors.append(info.value)
    frames = [e.to_error_frame() for e in errors]
    assert frames[0] == frames[1]
    assert errors[0].code == ErrorCode.PERMISSION_DENIED
    assert isinstance(errors[0], ProtocolError) and not errors[0].close


def test_tenant_isolation_group_ids_are_scoped_by_tenant() -> None:
    h = _harness_with_group()
    assert not h.state.is_member("t2", G, "alice")
    h.create("t2", G, "zed", ["bob"])  # same group id, other tenant: another group
    assert h.state.is_member("t2", G, "bob") and not h.state.is_member("t2", G, "carol")
    h.leave("t2", G, "bob")
    assert h.state.is_member(T, G, "bob")
    assert h.state.member_count(T, G) == 3 and h.state.member_count("t2", G) == 1


def test_B61_max_members_per_group_rejects_whole_request() -> None:
    state = GroupMembership()
    with pytest.raises(MembershipRejected, match="max_members_per_group"):
        create_group(
            state,
            tenant_id=T,
            group_id=G,
            creator="a",
            invitees=["b", "c"],
            committed_at=1,
            max_members=2,
        )
    for record in create_group(
        state, tenant_id=T, group_id=G, creator="a", invitees=["b"], committed_at=1, max_members=3
    ):
        state.apply(record)
    before = state.encode()
    with pytest.raises(MembershipRejected, match="max_members_per_group"):
        stamp = ControlStamp(1, 1, 1, 1)
        add_members(
            state,
            tenant_id=T,
            group_id=G,
            actor="x",
            targets=["c", "d"],
            stamp=stamp,
            max_members=3,
        )
    assert state.encode() == before


def test_7_9_slot_compaction_triggers_only_past_the_ratio() -> None:
    h = _harness_with_group(("bob",))
    for i in range(12):
        h.add(T, G, [f"temp{i}"])
        h.remove(T, G, [f"temp{i}"])
    h.add(T, G, ["last"])  # slots 0, 1 and 14 in use: max 14 > 3 x 4
    assert _group(h).needs_slot_compaction(4)
    assert not _group(h).needs_slot_compaction(5)


def test_A3_create_group_only_creates_a_non_existent_group() -> None:
    h = _harness_with_group()
    with pytest.raises(MembershipRejected, match="group_exists"):
        h.create(T, G, "mallory", [])


def test_invalid_ids_and_roles_are_refused_not_crashed() -> None:
    h = _harness_with_group()
    with pytest.raises(MembershipRejected):
        h.add(T, G, ["ok", ""])
    with pytest.raises(MembershipRejected):
        h.add(T, G, ["x\x00y"])
    with pytest.raises(MembershipRejected, match="role_not_grantable"):
        h.add(T, G, ["dave"], role=Role.OWNER)
    with pytest.raises(MembershipRejected, match="no_such_group"):
        h.add(T, "g:nope", ["dave"])


def test_A3_20_ban_moves_member_to_banned_and_an_add_unbans() -> None:
    h = _harness_with_group()
    h.remove(T, G, ["bob"], ban=True)
    group = h.state.group(T, G)
    assert group is not None
    assert group.rows["bob"].state == MembershipState.BANNED
    assert list(group.banned_slots()) == [group.rows["bob"].slot_id]
    h.add(T, G, ["bob"])
    assert list(group.banned_slots()) == [] and group.is_member("bob")


def test_apply_ignores_redelivered_records_and_rejects_gaps() -> None:
    h = _harness_with_group()
    h.add(T, G, ["dave"])
    h.leave(T, G, "dave")
    before = h.state.encode()
    for record in h.log:  # at-least-once redelivery of the whole log
        assert h.state.apply(record) is None
    assert h.state.encode() == before
    gap = msgspec.structs.replace(h.log[-1], membership_version=9)
    with pytest.raises(MembershipLogError, match="version gap"):
        h.state.apply(gap)
    unknown = msgspec.structs.replace(h.log[-1], group_id="g:ghost")
    with pytest.raises(MembershipLogError):
        h.state.apply(unknown)
    bad_count = msgspec.structs.replace(
        h.log[-2], membership_version=4, first_slot=4, member_count=9
    )
    with pytest.raises(MembershipLogError, match="member_count does not follow"):
        h.state.apply(bad_count)
    assert h.state.encode() == before  # a refused record changes nothing


def test_A3_control_payload_is_the_documented_msgpack_map() -> None:
    h = _harness_with_group()
    h.send(T, G, 41)
    record = h.leave(T, G, "bob")
    payload = encode_control(control_of(record))
    assert msgspec.msgpack.decode(payload) == {
        "action": "leave",
        "group_id": G,
        "actor": "bob",
        "targets": ["bob"],
        "membership_version": 2,
        "member_count": 2,
    }
    assert decode_control(payload) == control_of(record)
    assert MEMBERSHIP_CUSTOM_TYPE == "qim.membership.v1"


def test_membership_record_rides_the_outbox_union_byte_exact() -> None:
    h = _harness_with_group()
    h.add(T, G, ["dave"])
    for record in h.log:
        data = encode_outbox_record(record)
        assert decode_outbox_record(data) == record
        assert encode_outbox_record(decode_outbox_record(data)) == data


def test_group_membership_is_the_writers_membership_view() -> None:
    h = _harness_with_group()
    view: MembershipView = h.state  # the ConversationWriter's Protocol, checked by mypy
    assert view.is_member(T, G, "alice") and view.version(T, G) == 1
    assert view.member_count(T, G) == 3
    assert not view.is_member(T, "g:nope", "alice") and view.version(T, "g:nope") == 0
