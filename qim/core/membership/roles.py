"""Who may change a group: the role table of spec 20.2.2 as pure functions.

| operation                      | OWNER | ADMIN | MEMBER            | GUEST |
|--------------------------------|-------|-------|-------------------|-------|
| add / kick (remove, ban)       | yes   | yes   | per group setting | no    |
| grant / revoke ADMIN (role)    | yes   | no    | no                | no    |
| dissolve / transfer ownership  | yes   | no    | no                | no    |

Decisions where the spec is silent (written down here and in ``topology.md``):

* **Rank.** OWNER > ADMIN > MEMBER > GUEST. A kick or a role change only reaches a member of
  strictly lower rank than the actor: an ADMIN cannot remove another ADMIN, and nobody removes
  or re-roles the OWNER (ownership moves only by transfer, so a group never loses its owner).
* **The group setting** for MEMBER add / kick is :attr:`GroupPolicy.member_may_manage`, off by
  default (a MEMBER gets PERMISSION_DENIED); no path persists a per-group value yet.
* **Granting a role** on add or set_role is capped at ADMIN; OWNER moves only by transfer.
* **Transfer** makes the previous owner a MEMBER (:data:`PREVIOUS_OWNER_ROLE`, the convention
  of the big Chinese IM products); the new owner may grant ADMIN back.
* **The owner cannot leave** (LEAVE_GROUP) before transferring ownership or dissolving.
* **The operator** (:data:`OPERATOR`): the trusted admin plane acting as itself, not on a
  member's behalf, outranks every role; the structural rules (the OWNER is never removed, OWNER
  only by transfer) still hold for it.

Every refusal is ``MembershipRejected`` = ``ERROR{code=PERMISSION_DENIED}`` (20.2.2: not retried,
and "no permission" looks like "does not exist").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from qim.core.membership.errors import MembershipRejected
from qim.schemas.records.membership import Role

__all__ = [
    "OPERATOR",
    "PREVIOUS_OWNER_ROLE",
    "GroupPolicy",
    "check_add",
    "check_dissolve",
    "check_leave",
    "check_remove",
    "check_set_role",
    "check_transfer",
    "rank",
]

OPERATOR: Final = "OPERATOR"
"""Pseudo-role of the trusted admin plane acting as itself (never stored on a member row)."""

PREVIOUS_OWNER_ROLE: Final = Role.MEMBER
"""What a transfer makes of the previous owner."""

_RANK: Final = {Role.GUEST: 0, Role.MEMBER: 1, Role.ADMIN: 2, Role.OWNER: 3, OPERATOR: 4}
_SETTABLE: Final = frozenset({Role.ADMIN, Role.MEMBER, Role.GUEST})


@dataclass(frozen=True, slots=True)
class GroupPolicy:
    """The per-group settings the role table defers to (20.2.2 "per group setting")."""

    member_may_manage: bool = False


DEFAULT_POLICY: Final = GroupPolicy()


def rank(role: str) -> int:
    """Position in OWNER > ADMIN > MEMBER > GUEST (OPERATOR above all); unknown roles = -1."""
    return _RANK.get(role, -1)


def _may_manage(actor: str, policy: GroupPolicy) -> bool:
    if rank(actor) >= rank(Role.ADMIN):
        return True
    return actor == Role.MEMBER and policy.member_may_manage


def check_add(actor: str, role: str, policy: GroupPolicy = DEFAULT_POLICY) -> None:
    """Add members with ``role``: add/kick right, and granting ADMIN is the owner's."""
    if role not in _SETTABLE:
        raise MembershipRejected(f"role_not_grantable:{role}")
    if not _may_manage(actor, policy):
        raise MembershipRejected("role_may_not_add")
    if role == Role.ADMIN and rank(actor) < rank(Role.OWNER):
        raise MembershipRejected("role_may_not_grant_admin")


def check_remove(actor: str, target: str, policy: GroupPolicy = DEFAULT_POLICY) -> None:
    """Kick or ban a member whose role is ``target``."""
    if target == Role.OWNER:
        raise MembershipRejected("owner_not_removable")
    if not _may_manage(actor, policy):
        raise MembershipRejected("role_may_not_remove")
    if rank(target) >= rank(actor):
        raise MembershipRejected("role_may_not_remove_peer")


def check_set_role(actor: str, target: str, new_role: str) -> None:
    """Grant or revoke ADMIN (or make someone a GUEST): the owner's right only."""
    if new_role not in _SETTABLE:
        raise MembershipRejected(f"role_not_grantable:{new_role}")
    if target == Role.OWNER:
        raise MembershipRejected("owner_role_only_by_transfer")
    if rank(actor) < rank(Role.OWNER):
        raise MembershipRejected("role_may_not_set_role")


def check_transfer(actor: str, target: str) -> None:
    """Hand ownership to a member holding ``target`` (the owner cannot transfer to itself)."""
    if rank(actor) < rank(Role.OWNER):
        raise MembershipRejected("role_may_not_transfer")
    if target == Role.OWNER:
        raise MembershipRejected("already_owner")


def check_dissolve(actor: str) -> None:
    """End the group: the owner's right only."""
    if rank(actor) < rank(Role.OWNER):
        raise MembershipRejected("role_may_not_dissolve")


def check_leave(role: str) -> None:
    """Leave oneself: anyone but the owner, who must transfer or dissolve first."""
    if role == Role.OWNER:
        raise MembershipRejected("owner_must_transfer")
