"""Membership operations: validate a request against the state, return the records to commit.

Each function is pure: it reads :class:`GroupMembership`, raises :class:`MembershipRejected` or
returns :class:`MembershipCommitted` records, and changes nothing. The ConversationWriter commits
the records to the outbox and then folds them in with ``GroupMembership.apply`` -- the function
a replay uses -- and publishes the resulting member slices (``qim.core.membership.slices``)
before any dispatch pinned to the new version (direction 4.3).

Seqs and ids come in a :class:`ControlStamp` the writer allocates for the CONTROL message
(``conversation_seq`` J, ``message_id``, ``last_activity_id``, ``committed_at``): a join
commits ``joined_at = J - 1`` and a leave/remove ``left_at = J`` (spec 7.5, ADR-0021). A
function that finds nothing to change returns None, so the writer allocates no seq for it.
A create is the group's first CONTROL message (12.9 "create conversation / join group: in
mailbox? yes (MEMBERSHIP)", 10.1.3): its last chunk carries the stamp (seq 1 of a new group), the
earlier chunks of a large create none; initial members get ``joined_at = 0`` (= J - 1).

Roles (``qim.core.membership.roles``, spec 20.2.2): the admin plane acts either as the trusted
operator (``as_member=False``, the default: the account system or an operator) or on behalf of
the member named ``actor`` (``as_member=True``), whose role must allow the change. A dissolved
group answers every later change like a group that does not exist.

E2EE (spec 22.1): ``create_group(e2ee=True)`` makes an end-to-end encrypted group; the flag is
on its create records only and never changes (no operation sets or clears it). Such a group
never grows past ``e2ee_max_members``: a create or an add that would is refused whole with
``PERMISSION_DENIED, detail=e2ee_member_limit`` (never a silent fall-back to plaintext).

Determinism: targets are de-duplicated and sorted by user id before slots are assigned, so the
order a client lists members in never changes slot ids or version bytes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import msgspec

from qim.core.membership import roles
from qim.core.membership.errors import MembershipRejected
from qim.core.membership.group import GroupState
from qim.core.membership.state import GroupMembership
from qim.schemas.frames.errors import ErrorCode
from qim.schemas.hashing import validate_identifier
from qim.schemas.ids import message_id_to_bytes
from qim.schemas.records.membership import MembershipAction, MembershipCommitted, Role

__all__ = [
    "DEFAULT_CHUNK_MAX_MEMBERS",
    "DEFAULT_E2EE_MAX_MEMBERS",
    "E2EE_MEMBER_LIMIT",
    "ControlStamp",
    "add_members",
    "create_group",
    "dissolve_group",
    "leave_group",
    "remove_members",
    "set_role",
    "transfer_ownership",
]

DEFAULT_CHUNK_MAX_MEMBERS: Final = 4096
"""Members per outbox record / slice chunk: 4096 ids stay far below Kafka's 1 MiB default."""

DEFAULT_E2EE_MAX_MEMBERS: Final = 1000
"""B.6.1 ``e2ee_max_members`` default; the writer passes the configured value."""

E2EE_MEMBER_LIMIT: Final = "e2ee_member_limit"
"""The ``detail`` of the spec 22.1 refusal (``PERMISSION_DENIED``)."""


@dataclass(frozen=True, slots=True)
class ControlStamp:
    """The CONTROL message's envelope, allocated by the ConversationWriter at commit."""

    conversation_seq: int
    message_id: int
    last_activity_id: int
    committed_at: int

    def __post_init__(self) -> None:
        if self.conversation_seq < 1:
            raise ValueError("a CONTROL message occupies a real conversation_seq (>= 1)")


def create_group(
    state: GroupMembership,
    *,
    tenant_id: str,
    group_id: str,
    creator: str,
    invitees: Iterable[str],
    committed_at: int,
    max_members: int,
    chunk_max_members: int = DEFAULT_CHUNK_MAX_MEMBERS,
    display_hints: Mapping[str, str] | None = None,
    stamp: ControlStamp | None = None,
    e2ee: bool = False,
    e2ee_max_members: int = DEFAULT_E2EE_MAX_MEMBERS,
) -> tuple[MembershipCommitted, ...]:
    """CREATE_GROUP: version 1 with the creator as OWNER and the invitees as MEMBERs.

    More than ``chunk_max_members`` members become several records of ONE logical version;
    ``GroupMembership.apply`` makes the group exist only when the last chunk is in. ``stamp``
    (the create's CONTROL message) goes on the last chunk, so the group's ConversationHead,
    history row and every member's MEMBERSHIP entry exist from its creation on. ``e2ee``
    flags the group end-to-end encrypted for its whole life (module docstring).
    """
    _ids(tenant_id=tenant_id, group_id=group_id, creator=creator)
    if state.group(tenant_id, group_id) is not None or state.has_pending_create(
        tenant_id, group_id
    ):
        raise MembershipRejected("group_exists")
    invited = [u for u in _targets(invitees) if u != creator]
    total = 1 + len(invited)
    if e2ee:
        _check_e2ee_size(total, e2ee_max_members)
    _check_size(total, max_members)
    if chunk_max_members < 2:
        raise ValueError("chunk_max_members must leave room for the creator")
    # chunk 0 holds the creator plus invitees; every chunk holds <= chunk_max_members members
    bounds = [0, chunk_max_members - 1]
    while bounds[-1] < len(invited):
        bounds.append(bounds[-1] + chunk_max_members)
    bounds[-1] = len(invited)
    count = len(bounds) - 1
    records = tuple(
        MembershipCommitted(
            tenant_id=tenant_id,
            group_id=group_id,
            action=MembershipAction.CREATE,
            actor=creator,
            targets=tuple(invited[lo:hi]),
            membership_version=1,
            member_count=total,
            role=Role.MEMBER,
            first_slot=0 if index == 0 else lo + 1,
            display_hints=_hints(invited[lo:hi], display_hints),
            committed_at=committed_at,
            chunk_index=index,
            chunk_count=count,
            e2ee=e2ee,
        )
        for index, (lo, hi) in enumerate(itertools.pairwise(bounds))
    )
    if stamp is None:
        return records
    last = msgspec.structs.replace(
        records[-1],
        conversation_seq=stamp.conversation_seq,
        message_id=message_id_to_bytes(stamp.message_id),
        last_activity_id=message_id_to_bytes(stamp.last_activity_id),
        committed_at=stamp.committed_at,
    )
    return (*records[:-1], last)


def add_members(
    state: GroupMembership,
    *,
    tenant_id: str,
    group_id: str,
    actor: str,
    targets: Iterable[str],
    stamp: ControlStamp,
    max_members: int,
    role: str = Role.MEMBER,
    chunk_max_members: int = DEFAULT_CHUNK_MAX_MEMBERS,
    display_hints: Mapping[str, str] | None = None,
    as_member: bool = False,
    e2ee_max_members: int = DEFAULT_E2EE_MAX_MEMBERS,
) -> MembershipCommitted | None:
    """Admin-plane GroupAdd: new members on fresh slots with ``joined_at = J - 1``.

    Targets already in the group are skipped; a former or banned member rejoins on a new slot
    (spec 7.9: slots are never reused) and its ``left_at`` is cleared (spec 12.10, AT-48).
    An E2EE group refuses an add past ``e2ee_max_members`` (AT-43); it stays E2EE.
    """
    group = _live_group(state, tenant_id, group_id, actor)
    roles.check_add(_actor_role(group, actor, as_member), role)
    joining = [u for u in _targets(targets) if not group.is_member(u)]
    if not joining:
        return None
    if len(joining) > chunk_max_members:
        raise MembershipRejected("too_many_targets", code=ErrorCode.PAYLOAD_TOO_LARGE)
    if group.e2ee:
        _check_e2ee_size(group.member_count + len(joining), e2ee_max_members)
    _check_size(group.member_count + len(joining), max_members)
    return _change(
        state,
        tenant_id,
        group_id,
        MembershipAction.ADD,
        actor,
        joining,
        stamp,
        role=role,
        first_slot=group.next_slot,
        display_hints=_hints(joining, display_hints),
    )


def remove_members(
    state: GroupMembership,
    *,
    tenant_id: str,
    group_id: str,
    actor: str,
    targets: Iterable[str],
    stamp: ControlStamp,
    ban: bool = False,
    chunk_max_members: int = DEFAULT_CHUNK_MAX_MEMBERS,
    as_member: bool = False,
) -> MembershipCommitted | None:
    """Admin-plane GroupRemove (REMOVED, or BANNED with ``ban``): ``left_at = J``.

    Only the trusted admin plane removes others; there is no owner-kick frame (A.3). Every
    target must be of lower rank than the actor, and the OWNER is never removed.
    """
    group = _live_group(state, tenant_id, group_id, actor)
    actor_role = _actor_role(group, actor, as_member)
    leaving = [u for u in _targets(targets) if group.is_member(u)]
    if not leaving:
        return None
    for user in leaving:
        roles.check_remove(actor_role, group.rows[user].role)
    if len(leaving) > chunk_max_members:
        raise MembershipRejected("too_many_targets", code=ErrorCode.PAYLOAD_TOO_LARGE)
    action = MembershipAction.BAN if ban else MembershipAction.REMOVE
    return _change(state, tenant_id, group_id, action, actor, leaving, stamp)


def leave_group(
    state: GroupMembership, *, tenant_id: str, group_id: str, user_id: str, stamp: ControlStamp
) -> MembershipCommitted:
    """LEAVE_GROUP (A.3, 0x0A04): the session's user leaves; ``left_at = J``.

    A non-member and a non-existent group are indistinguishable: both PERMISSION_DENIED with
    the same detail, so the frame cannot probe which groups exist.
    The OWNER cannot leave: it transfers ownership or dissolves the group first.
    """
    group = state.group(tenant_id, group_id)
    role = None if group is None else group.role_of(user_id)
    if role is None:
        raise MembershipRejected("not_a_member")
    roles.check_leave(role)
    return _change(state, tenant_id, group_id, MembershipAction.LEAVE, user_id, [user_id], stamp)


def set_role(
    state: GroupMembership,
    *,
    tenant_id: str,
    group_id: str,
    actor: str,
    targets: Iterable[str],
    role: str,
    stamp: ControlStamp,
    as_member: bool = False,
    chunk_max_members: int = DEFAULT_CHUNK_MAX_MEMBERS,
) -> MembershipCommitted | None:
    """Grant or revoke ADMIN (or GUEST): a new version, member set unchanged.

    Targets that already hold ``role`` are skipped (None when nothing changes); a non-member
    target refuses the whole request, like any other authorization failure.
    """
    group = _live_group(state, tenant_id, group_id, actor)
    actor_role = _actor_role(group, actor, as_member)
    users = _targets(targets)
    if len(users) > chunk_max_members:
        raise MembershipRejected("too_many_targets", code=ErrorCode.PAYLOAD_TOO_LARGE)
    changing = []
    for user in users:
        current = group.role_of(user)
        if current is None:
            raise MembershipRejected("not_a_member")
        roles.check_set_role(actor_role, current, role)
        if current != role:
            changing.append(user)
    if not changing:
        return None
    return _change(
        state, tenant_id, group_id, MembershipAction.SET_ROLE, actor, changing, stamp, role=role
    )


def transfer_ownership(
    state: GroupMembership,
    *,
    tenant_id: str,
    group_id: str,
    actor: str,
    new_owner: str,
    stamp: ControlStamp,
    as_member: bool = False,
) -> MembershipCommitted:
    """Make ``new_owner`` (an active member) the OWNER; the previous owner becomes
    :data:`~qim.core.membership.roles.PREVIOUS_OWNER_ROLE`."""
    group = _live_group(state, tenant_id, group_id, actor)
    actor_role = _actor_role(group, actor, as_member)
    _ids(user_id=new_owner)
    target_role = group.role_of(new_owner)
    owner = group.owner()
    if target_role is None or owner is None:
        raise MembershipRejected("not_a_member")
    roles.check_transfer(actor_role, target_role)
    record = _change(
        state,
        tenant_id,
        group_id,
        MembershipAction.TRANSFER,
        actor,
        [new_owner],
        stamp,
        role=roles.PREVIOUS_OWNER_ROLE,
    )
    return msgspec.structs.replace(record, previous_owner=owner)


def dissolve_group(
    state: GroupMembership,
    *,
    tenant_id: str,
    group_id: str,
    actor: str,
    stamp: ControlStamp,
    as_member: bool = False,
    chunk_max_members: int = DEFAULT_CHUNK_MAX_MEMBERS,
) -> MembershipCommitted:
    """End the group: every member is released at ``J`` and the id stays taken.

    The record lists every member (each one's MEMBERSHIP entry names it), so a group of more
    than ``chunk_max_members`` members is refused rather than split (not implemented).
    """
    group = _live_group(state, tenant_id, group_id, actor)
    roles.check_dissolve(_actor_role(group, actor, as_member))
    members = sorted(group.user_at(slot).user_id for slot in group.active_slots)
    if not members:
        raise MembershipRejected("no_such_group")
    if len(members) > chunk_max_members:
        raise MembershipRejected("too_many_members", code=ErrorCode.PAYLOAD_TOO_LARGE)
    return _change(state, tenant_id, group_id, MembershipAction.DISSOLVE, actor, members, stamp)


def _live_group(state: GroupMembership, tenant_id: str, group_id: str, actor: str) -> GroupState:
    """The group an admin-plane change targets; a dissolved group does not exist any more."""
    _ids(tenant_id=tenant_id, group_id=group_id, actor=actor)
    group = state.group(tenant_id, group_id)
    if group is None or group.dissolved:
        raise MembershipRejected("no_such_group")
    return group


def _actor_role(group: GroupState, actor: str, as_member: bool) -> str:
    """The role the change is authorized with: the operator's, or the acting member's."""
    if not as_member:
        return roles.OPERATOR
    role = group.role_of(actor)
    if role is None:
        raise MembershipRejected("not_a_member")
    return role


def _change(
    state: GroupMembership,
    tenant_id: str,
    group_id: str,
    action: str,
    actor: str,
    targets: list[str],
    stamp: ControlStamp,
    *,
    role: str = "",
    first_slot: int = 0,
    display_hints: tuple[str, ...] = (),
) -> MembershipCommitted:
    count = state.member_count(tenant_id, group_id)
    joining = action == MembershipAction.ADD
    if action in (MembershipAction.SET_ROLE, MembershipAction.TRANSFER):
        targets_delta = 0
    else:
        targets_delta = len(targets) if joining else -len(targets)
    return MembershipCommitted(
        tenant_id=tenant_id,
        group_id=group_id,
        action=action,
        actor=actor,
        targets=tuple(targets),
        membership_version=state.version(tenant_id, group_id) + 1,
        member_count=count + targets_delta,
        role=role,
        first_slot=first_slot,
        display_hints=display_hints,
        conversation_seq=stamp.conversation_seq,
        message_id=message_id_to_bytes(stamp.message_id),
        last_activity_id=message_id_to_bytes(stamp.last_activity_id),
        committed_at=stamp.committed_at,
    )


def _targets(users: Iterable[str]) -> list[str]:
    """Distinct, sorted, validated user ids (a str is rejected: it is not a list of ids)."""
    if isinstance(users, str):
        raise TypeError("targets must be an iterable of user ids, not a str")
    unique = set(users)
    for user in unique:
        _ids(user_id=user)
    return sorted(unique)


def _ids(**fields: str) -> None:
    for name, value in fields.items():
        try:
            validate_identifier(value, name)
        except (TypeError, ValueError) as exc:
            raise MembershipRejected(f"invalid_{name}") from exc


def _check_size(total: int, max_members: int) -> None:
    """B.6.1 ``max_members_per_group``: reject the whole request, never truncate."""
    if total > max_members:
        raise MembershipRejected("max_members_per_group")


def _check_e2ee_size(total: int, e2ee_max_members: int) -> None:
    """Spec 22.1: an E2EE group never exceeds ``e2ee_max_members`` and never falls back."""
    if total > e2ee_max_members:
        raise MembershipRejected(E2EE_MEMBER_LIMIT)


def _hints(users: list[str], hints: Mapping[str, str] | None) -> tuple[str, ...]:
    if not hints:
        return ()
    out = tuple(hints.get(u, "") for u in users)
    return out if any(out) else ()
