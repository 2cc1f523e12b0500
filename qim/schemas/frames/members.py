"""Conversation-member frames, opcodes 0x0A00-0x0AFF (ADR-0021).

PULL_MEMBERS, MEMBER_LIST_BATCH, CREATE_GROUP, LEAVE_GROUP (= 0x0A04). MEMBER_LIST_BATCH answers
all three requests, correlated by the header's request_id.
"""

from __future__ import annotations

from qim.schemas.frames.base import U32, U64, Body

__all__ = ["CreateGroup", "LeaveGroup", "Member", "MemberListBatch", "PullMembers"]


class PullMembers(Body):
    """PULL_MEMBERS (A.3 #20): ``filter`` all|admin|banned|search; @-autocomplete uses search."""

    conversation_id: str = ""
    filter: str = "all"
    query: str = ""
    offset: U32 = 0
    limit: U32 = 0


class CreateGroup(Body):
    """CREATE_GROUP (A.3 #21): ``member_ids`` are invitees; the creator comes from the session.

    [ext] ``e2ee``: the group is end-to-end encrypted for its whole life (spec 22.1: fixed at
    creation, at most ``e2ee_max_members``); omitted when false, so older peers are unaffected.
    """

    group_id: str = ""
    member_ids: tuple[str, ...] = ()
    e2ee: bool = False


class LeaveGroup(Body):
    """LEAVE_GROUP (A.3 #22, 0x0A04): the leaver comes from the session, never the frame."""

    group_id: str = ""


class Member(Body):
    """One ``MEMBER_LIST_BATCH.members[]`` item; ``role`` OWNER|ADMIN|MEMBER|GUEST (§7.5)."""

    user_id: str = ""
    role: str = ""
    joined_at_conversation_seq: U64 = 0  # open lower bound of visibility (join seq - 1)
    display_hint: str = ""


class MemberListBatch(Body):
    """MEMBER_LIST_BATCH (A.4 #20): ``total_hint`` is an estimate for big groups."""

    members: tuple[Member, ...] = ()
    total_hint: U32 = 0
    next_offset: U32 = 0
    has_more: bool = False
