"""PULL_MEMBERS paging and the MEMBER_LIST_BATCH replies of CREATE_GROUP and LEAVE_GROUP.

Order: every filter lists members by ascending slot id, i.e. in join order. Slots only grow
(spec 7.9), so a member who joins during a walk lands after every page already served and an
offset walk has no duplicates or omissions from joins (acceptance 26.3.9); a leave before the
offset shifts later members down by one, which the next walk settles. User-id order would put
a joiner anywhere. A page is a rank range of a Roaring bitmap, so the cost follows the page,
not the group size.

Filters (A.3 #20): ``all`` = active members; ``admin`` = OWNER and ADMIN; ``banned`` = banned
former members, on the slot they held; ``search`` = active members whose user id or
case-folded display hint starts with ``query``, through sorted indexes (no full scan). A
query shorter than ``member_search_min_prefix`` returns an empty page, which 26.3.9 allows.
An unknown filter (a newer client's word, spec 27.1.2) also returns an empty page.

Limit (B.6.1): 0 means ``member_page_limit`` (100); larger requests are clamped to
``member_page_hard_limit`` (200). A.3 writes ``limit <= member_page_limit``; B.6.1 names the
hard limit as the server's clamp, and we follow B.6.1. ``total_hint`` is exact here (the
conversation app holds the whole group); A.4 only promises an estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyroaring import BitMap

from qim.core.membership.errors import MembershipRejected
from qim.core.membership.group import GroupState
from qim.core.membership.state import GroupMembership
from qim.params import Settings
from qim.schemas.frames.members import Member, MemberListBatch, PullMembers

__all__ = ["MemberPageLimits", "create_reply", "leave_reply", "pull_members"]

_EMPTY = BitMap()


@dataclass(frozen=True, slots=True)
class MemberPageLimits:
    """B.6.1 ``member_page_limit``, ``member_page_hard_limit``, ``member_search_min_prefix``."""

    default_limit: int = 100
    hard_limit: int = 200
    search_min_prefix: int = 2

    @classmethod
    def from_settings(cls, settings: Settings) -> MemberPageLimits:
        return cls(
            default_limit=settings.member_page_limit,
            hard_limit=settings.member_page_hard_limit,
            search_min_prefix=settings.member_search_min_prefix,
        )

    def clamp(self, requested: int) -> int:
        """The page size served for a requested ``limit`` (0 = the default)."""
        return min(requested or self.default_limit, self.hard_limit)


def pull_members(
    membership: GroupMembership,
    *,
    tenant_id: str,
    requester: str,
    request: PullMembers,
    limits: MemberPageLimits | None = None,
) -> MemberListBatch:
    """Answer PULL_MEMBERS for an active member; anyone else gets PERMISSION_DENIED."""
    limits = limits or MemberPageLimits()
    group = membership.group(tenant_id, request.conversation_id)
    if group is None or not group.is_member(requester):
        raise MembershipRejected("not_a_member")
    selected = _select(group, request, limits)
    return _page(group, selected, request.offset, limits.clamp(request.limit))


def create_reply(
    membership: GroupMembership,
    *,
    tenant_id: str,
    group_id: str,
    creator: str,
    limits: MemberPageLimits | None = None,
) -> MemberListBatch:
    """CREATE_GROUP's reply: the first ``all`` page of the new group (A.3 #21)."""
    request = PullMembers(conversation_id=group_id)
    return pull_members(
        membership, tenant_id=tenant_id, requester=creator, request=request, limits=limits
    )


def leave_reply(member_count: int) -> MemberListBatch:
    """LEAVE_GROUP's reply: no members, ``total_hint`` = count after leaving (A.3 #22)."""
    return MemberListBatch(total_hint=member_count)


def _select(group: GroupState, request: PullMembers, limits: MemberPageLimits) -> BitMap:
    match request.filter:
        case "all":
            return group.active_slots
        case "admin":
            return group.admin_slots()
        case "banned":
            return group.banned_slots()
        case "search" if len(request.query) >= limits.search_min_prefix:
            return group.search(request.query)
        case _:
            return _EMPTY


def _page(group: GroupState, selected: BitMap, offset: int, limit: int) -> MemberListBatch:
    total = len(selected)
    page = selected[offset : offset + limit] if offset < total else _EMPTY
    members = tuple(_member(group, slot) for slot in page)
    next_offset = offset + len(members)
    return MemberListBatch(
        members=members,
        total_hint=total,
        next_offset=next_offset,
        has_more=next_offset < total,
    )


def _member(group: GroupState, slot: int) -> Member:
    row = group.user_at(slot)
    return Member(
        user_id=row.user_id,
        role=row.role,
        joined_at_conversation_seq=row.joined_at,
        display_hint=row.display_hint,
    )
