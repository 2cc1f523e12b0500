"""Group roles, ownership transfer and dissolve (spec 20.2.2 role table, 7.5, A.6).

A table-driven grid for the pure rules, a model-based state machine that drives the real
operations + ``apply`` with random actors against a ten-line reference model (and replays the
outbox after every step), and the concrete cases the issue names.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from qim.core.membership import (
    GroupMembership,
    GroupState,
    MembershipLogError,
    MembershipRejected,
    roles,
)
from qim.schemas.frames.errors import ErrorCode
from qim.schemas.records.membership import (
    MembershipAction,
    MembershipState,
    Role,
    control_of,
    decode_control,
    encode_control,
)
from tests.unit.membership.support import Harness

T, G = "t1", "g:team"
OW, A, M, GU = Role.OWNER, Role.ADMIN, Role.MEMBER, Role.GUEST
OP = roles.OPERATOR


def _allowed(check: object, *args: str) -> bool:
    try:
        check(*args)  # type: ignore[operator]
    except MembershipRejected as exc:
        assert exc.error_code == ErrorCode.PERMISSION_DENIED
        return False
    return True


# -- the table, cell by cell --------------------------------------------------------------------

_KICK = {  # (actor, target) -> allowed; the OWNER is never removable, peers neither
    (OP, OW): False, (OP, A): True, (OP, M): True, (OP, GU): True,
    (OW, A): True, (OW, M): True, (OW, GU): True,
    (A, OW): False, (A, A): False, (A, M): True, (A, GU): True,
    (M, OW): False, (M, A): False, (M, M): False, (M, GU): False,
    (GU, OW): False, (GU, A): False, (GU, M): False, (GU, GU): False,
}  # fmt: skip


@pytest.mark.parametrize(("actor", "target"), sorted(_KICK))
def test_20_2_2_kick_needs_admin_and_a_lower_ranked_target(actor: str, target: str) -> None:
    assert _allowed(roles.check_remove, actor, target) == _KICK[(actor, target)]


@pytest.mark.parametrize("actor", [OP, OW, A, M, GU])
@pytest.mark.parametrize("role", [A, M, GU])
def test_20_2_2_add_is_admin_and_up_and_granting_admin_is_the_owners(actor: str, role: str) -> None:
    expected = actor in (OP, OW) or (actor == A and role != A)
    assert _allowed(roles.check_add, actor, role) == expected


@pytest.mark.parametrize("actor", [OP, OW, A, M, GU])
def test_20_2_2_dissolve_transfer_and_set_role_are_the_owners_only(actor: str) -> None:
    owner_like = actor in (OP, OW)
    assert _allowed(roles.check_dissolve, actor) == owner_like
    assert _allowed(roles.check_transfer, actor, M) == owner_like
    assert _allowed(roles.check_set_role, actor, M, A) == owner_like
    assert _allowed(roles.check_set_role, actor, A, M) == owner_like


def test_20_2_2_member_add_and_kick_follow_the_group_setting() -> None:
    on = roles.GroupPolicy(member_may_manage=True)
    assert not _allowed(roles.check_add, M, M)
    roles.check_add(M, M, on)
    roles.check_remove(M, GU, on)
    with pytest.raises(MembershipRejected):
        roles.check_remove(M, M, on)  # a peer, even with the setting on
    with pytest.raises(MembershipRejected):
        roles.check_add(GU, M, on)


def test_owner_is_reachable_only_by_transfer() -> None:
    for check, args in (
        (roles.check_set_role, (OW, OW, OW)),
        (roles.check_set_role, (OW, M, OW)),
        (roles.check_add, (OW, OW)),
        (roles.check_transfer, (OW, OW)),
        (roles.check_leave, (OW,)),
    ):
        assert not _allowed(check, *args)
    for role in (A, M, GU):
        roles.check_leave(role)


# -- the operations on a real GroupMembership --------------------------------------------------


def _group_of(h: Harness) -> GroupState:
    group = h.state.group(T, G)
    assert group is not None
    return group


def test_transfer_then_the_old_owner_cannot_remove_an_admin() -> None:
    h = Harness()
    h.create(T, G, "alice", ("bob", "carol", "dave"))
    h.set_role(T, G, ["carol"], A, actor="alice", as_member=True)
    record = h.transfer(T, G, "bob", actor="alice", as_member=True)
    group = _group_of(h)
    assert (group.owner(), group.role_of("alice")) == ("bob", roles.PREVIOUS_OWNER_ROLE)
    control = decode_control(encode_control(control_of(record)))
    assert (control.action, control.targets, control.previous_owner, control.role) == (
        MembershipAction.TRANSFER,
        ("bob",),
        "alice",
        roles.PREVIOUS_OWNER_ROLE,
    )
    with pytest.raises(MembershipRejected) as refused:
        h.remove(T, G, ["carol"], actor="alice", as_member=True)
    assert refused.value.error_code == ErrorCode.PERMISSION_DENIED
    assert h.remove(T, G, ["carol"], actor="bob", as_member=True) is not None  # new owner can
    assert set(group.admin_slots()) == {group.rows["bob"].slot_id}


def test_a_non_admin_remove_is_permission_denied_and_commits_nothing() -> None:
    h = Harness()
    h.create(T, G, "alice", ("bob", "carol"))
    before = (h.state.encode(), len(h.log))
    with pytest.raises(MembershipRejected) as refused:
        h.remove(T, G, ["carol"], actor="bob", as_member=True)
    assert refused.value.error_code == ErrorCode.PERMISSION_DENIED
    with pytest.raises(MembershipRejected):
        h.remove(T, G, ["carol"], actor="mallory", as_member=True)  # not a member at all
    assert (h.state.encode(), len(h.log)) == before


def test_promoted_admin_removes_and_demoted_admin_cannot() -> None:
    h = Harness()
    h.create(T, G, "alice", ("bob", "carol", "dave"))
    h.set_role(T, G, ["bob"], A, actor="alice", as_member=True)
    assert h.remove(T, G, ["carol"], actor="bob", as_member=True) is not None
    h.set_role(T, G, ["bob"], M, actor="alice", as_member=True)
    with pytest.raises(MembershipRejected):
        h.remove(T, G, ["dave"], actor="bob", as_member=True)
    assert h.set_role(T, G, ["bob"], M, actor="alice", as_member=True) is None  # no change


def test_owner_cannot_leave_before_transferring() -> None:
    h = Harness()
    h.create(T, G, "alice", ("bob",))
    with pytest.raises(MembershipRejected):
        h.leave(T, G, "alice")
    h.transfer(T, G, "bob", actor="alice", as_member=True)
    h.leave(T, G, "alice")
    assert _group_of(h).owner() == "bob"


def test_dissolve_releases_everyone_at_its_seq_and_ends_the_group() -> None:
    h = Harness()
    h.create(T, G, "alice", ("bob", "carol"))
    last = h.send(T, G, 3)
    record = h.dissolve(T, G, actor="alice", as_member=True)
    assert record.targets == ("alice", "bob", "carol") and record.member_count == 0
    assert record.conversation_seq == last + 1
    group = _group_of(h)
    assert group.dissolved and group.member_count == 0 and group.owner() is None
    for user in ("alice", "bob", "carol"):
        row = group.rows[user]
        assert (row.state, row.left_at) == (MembershipState.REMOVED, record.conversation_seq)
        assert h.state.visible_interval(T, G, user) == (0, record.conversation_seq)
    for change in (
        lambda: h.add(T, G, ["dave"]),
        lambda: h.remove(T, G, ["bob"]),
        lambda: h.set_role(T, G, ["bob"], A),
        lambda: h.transfer(T, G, "bob"),
        lambda: h.dissolve(T, G),
        lambda: h.leave(T, G, "bob"),
        lambda: h.create(T, G, "alice", ()),
    ):
        with pytest.raises(MembershipRejected):
            change()
    assert h.replay().encode() == h.state.encode()
    restored = GroupMembership.decode(h.state.encode(), mailbox_shard_count=h.shards)
    restored_group = restored.group(T, G)
    assert restored_group is not None and restored_group.dissolved
    assert restored.encode() == h.state.encode()


def test_apply_refuses_a_log_that_breaks_the_role_rules() -> None:
    h = Harness()
    h.create(T, G, "alice", ("bob",))
    record = h.transfer(T, G, "bob", actor="alice", as_member=True)
    fresh = Harness()
    fresh.create(T, G, "alice", ("bob",))
    forged = msgspec.structs.replace(record, previous_owner="bob")
    with pytest.raises(MembershipLogError):
        fresh.state.apply(forged)


# -- model-based: random actors and operations against a reference model -------------------------

USERS = ("u0", "u1", "u2", "u3", "u4", "u5")
_rank = roles.rank


class RolesMachine(RuleBasedStateMachine):
    """The reference: ``model`` maps each active member to its role."""

    def __init__(self) -> None:
        super().__init__()
        self.h = Harness()
        self.h.create(T, G, "u0", ("u1", "u2"))
        self.model: dict[str, str] = {"u0": OW, "u1": M, "u2": M}
        self.dissolved = False

    def _actor(self, actor: str, as_member: bool) -> str | None:
        """The model's actor role; None = refused (not a member, or the group is gone)."""
        if self.dissolved:
            return None
        return self.model.get(actor) if as_member else OP

    def _expect(self, allowed: bool, run: object) -> object:
        if allowed:
            return run()  # type: ignore[operator]
        with pytest.raises(MembershipRejected) as refused:
            run()  # type: ignore[operator]
        assert refused.value.error_code == ErrorCode.PERMISSION_DENIED
        return None

    @rule(actor=st.sampled_from(USERS), as_member=st.booleans(), who=st.sampled_from(USERS))
    def add(self, actor: str, as_member: bool, who: str) -> None:
        role = self._actor(actor, as_member)
        ok = role is not None and _rank(role) >= _rank(A)
        self._expect(ok, lambda: self.h.add(T, G, [who], actor=actor, as_member=as_member))
        if ok:
            self.model.setdefault(who, M)

    @rule(actor=st.sampled_from(USERS), as_member=st.booleans(), who=st.sampled_from(USERS))
    def remove(self, actor: str, as_member: bool, who: str) -> None:
        role = self._actor(actor, as_member)
        victim = self.model.get(who)
        ok = role is not None and (
            victim is None
            or (_rank(role) >= _rank(A) and victim != OW and _rank(victim) < _rank(role))
        )
        self._expect(ok, lambda: self.h.remove(T, G, [who], actor=actor, as_member=as_member))
        if ok:
            self.model.pop(who, None)

    @rule(
        actor=st.sampled_from(USERS),
        as_member=st.booleans(),
        who=st.sampled_from(USERS),
        new=st.sampled_from((A, M, GU)),
    )
    def set_role(self, actor: str, as_member: bool, who: str, new: str) -> None:
        role, current = self._actor(actor, as_member), self.model.get(who)
        ok = role is not None and current not in (None, OW) and _rank(role) >= _rank(OW)
        self._expect(
            ok, lambda: self.h.set_role(T, G, [who], new, actor=actor, as_member=as_member)
        )
        if ok:
            self.model[who] = new

    @rule(actor=st.sampled_from(USERS), as_member=st.booleans(), who=st.sampled_from(USERS))
    def transfer(self, actor: str, as_member: bool, who: str) -> None:
        role, current = self._actor(actor, as_member), self.model.get(who)
        ok = role is not None and current not in (None, OW) and _rank(role) >= _rank(OW)
        self._expect(ok, lambda: self.h.transfer(T, G, who, actor=actor, as_member=as_member))
        if ok:
            owner = next(u for u, r in self.model.items() if r == OW)
            self.model[owner], self.model[who] = roles.PREVIOUS_OWNER_ROLE, OW

    @rule(user=st.sampled_from(USERS))
    def leave(self, user: str) -> None:
        ok = not self.dissolved and self.model.get(user) not in (None, OW)
        self._expect(ok, lambda: self.h.leave(T, G, user))
        if ok:
            del self.model[user]

    @rule(actor=st.sampled_from(USERS), as_member=st.booleans())
    def dissolve(self, actor: str, as_member: bool) -> None:
        role = self._actor(actor, as_member)
        ok = role is not None and _rank(role) >= _rank(OW)
        self._expect(ok, lambda: self.h.dissolve(T, G, actor=actor, as_member=as_member))
        if ok:
            self.model, self.dissolved = {}, True

    @invariant()
    def state_matches_the_model(self) -> None:
        group = _group_of(self.h)
        assert {u: group.role_of(u) for u in USERS if group.is_member(u)} == self.model
        owners = [u for u, r in self.model.items() if r == OW]
        assert len(owners) == (0 if self.dissolved else 1)
        assert group.owner() == (owners[0] if owners else None)
        admins = {group.rows[u].slot_id for u, r in self.model.items() if r in (OW, A)}
        assert set(group.admin_slots()) == admins
        assert group.dissolved == self.dissolved

    @invariant()
    def replay_equals_live(self) -> None:
        assert self.h.replay().encode() == self.h.state.encode()


RolesMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
test_roles_model = RolesMachine.TestCase
