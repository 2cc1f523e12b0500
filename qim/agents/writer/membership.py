"""Membership requests: CREATE_GROUP, LEAVE_GROUP and the admin plane's create / add / remove /
set_role / transfer / dissolve (roles checked by ``qim.core.membership.roles``).

Each is one GroupMembership operation (``qim.core.membership``) whose records the partition
appends; applying them publishes the new version's member slices into the same plan. What the
shell adds is the CONTROL message's coordinates: a join, leave or removal is a message of the
conversation and consumes a ``conversation_seq`` exactly like a SEND_MESSAGE
(``next_coordinates``), so the next message never reuses it; a create occupies the group's
first seq too (its last chunk carries it: every member's MEMBERSHIP entry and a session row
from the creation on, 10.1.3 / 12.9).
A group id must have the group form (``g:``): the ``d:`` space is derived from user ids.
"""

from __future__ import annotations

from typing import Final

from qim.agents.writer.partition import PartitionWriter, Plan
from qim.agents.writer.replies import admin_reply, error_body
from qim.core.conversation import conversation_kind
from qim.core.membership import (
    DEFAULT_E2EE_MAX_MEMBERS,
    ControlStamp,
    MembershipRejected,
    add_members,
    create_group,
    dissolve_group,
    leave_group,
    leave_reply,
    remove_members,
    set_role,
    transfer_ownership,
)
from qim.schemas.frames.exceptions import ProtocolError
from qim.schemas.frames.members import MemberListBatch
from qim.schemas.records import GROUP, AdminGroupRequest, LeaveGroupRequest
from qim.schemas.records.membership import MembershipAction

__all__ = ["admin", "create", "leave"]


def create(
    pw: PartitionWriter,
    *,
    tenant_id: str,
    group_id: str,
    creator: str,
    invitees: tuple[str, ...],
    max_members: int,
    now_ms: int,
    plan: Plan,
    e2ee: bool = False,
    e2ee_max_members: int = DEFAULT_E2EE_MAX_MEMBERS,
) -> None:
    """Version 1 of a new group (one record per chunk of 4096 members); ``e2ee`` flags it
    end-to-end encrypted for good (spec 22.1)."""
    if conversation_kind(group_id) != GROUP:
        raise MembershipRejected("invalid_group_id")
    records = create_group(
        pw.membership,
        tenant_id=tenant_id,
        group_id=group_id,
        creator=creator,
        invitees=invitees,
        committed_at=pw.log_time_ms(now_ms),
        max_members=max_members,
        stamp=_stamp(pw, tenant_id, group_id, now_ms),
        e2ee=e2ee,
        e2ee_max_members=e2ee_max_members,
    )
    for record in records:
        pw.append(record, plan)


def leave(
    pw: PartitionWriter, request: LeaveGroupRequest, now_ms: int, plan: Plan
) -> MemberListBatch:
    """The session's user leaves; the reply body is the count after the leave (A.3 #22)."""
    tenant_id, group_id = request.tenant_id, request.message.group_id
    record = leave_group(
        pw.membership,
        tenant_id=tenant_id,
        group_id=group_id,
        user_id=request.user_id,
        stamp=_stamp(pw, tenant_id, group_id, now_ms),
    )
    pw.append(record, plan)
    return leave_reply(pw.membership.member_count(tenant_id, group_id))


ADMIN_SHOW: Final = "show"
"""The admin plane's read (`qim group show`); not a membership change, so not an ACTION."""


def admin(
    pw: PartitionWriter,
    request: AdminGroupRequest,
    *,
    max_members: int,
    now_ms: int,
    plan: Plan,
    e2ee_max_members: int = DEFAULT_E2EE_MAX_MEMBERS,
) -> None:
    """The trusted admin plane; answered on ``qim.admin-replies`` when it asked for a reply.

    ``add`` of members already in the group and ``remove`` of non-members change nothing and
    consume no seq; the reply then reports the unchanged version.
    """
    tenant_id, group_id, actor = request.tenant_id, request.group_id, request.actor
    try:
        if request.action == MembershipAction.CREATE:
            create(
                pw,
                tenant_id=tenant_id,
                group_id=group_id,
                creator=actor,
                invitees=request.member_ids,
                max_members=max_members,
                now_ms=now_ms,
                plan=plan,
                e2ee=request.e2ee,
                e2ee_max_members=e2ee_max_members,
            )
        elif request.action == MembershipAction.ADD:
            record = add_members(
                pw.membership,
                tenant_id=tenant_id,
                group_id=group_id,
                actor=actor,
                targets=request.member_ids,
                stamp=_stamp(pw, tenant_id, group_id, now_ms),
                max_members=max_members,
                as_member=request.as_member,
                e2ee_max_members=e2ee_max_members,
            )
            if record is not None:
                pw.append(record, plan)
        elif request.action == MembershipAction.REMOVE:
            record = remove_members(
                pw.membership,
                tenant_id=tenant_id,
                group_id=group_id,
                actor=actor,
                targets=request.member_ids,
                stamp=_stamp(pw, tenant_id, group_id, now_ms),
                ban=request.ban,
                as_member=request.as_member,
            )
            if record is not None:
                pw.append(record, plan)
        elif request.action == MembershipAction.SET_ROLE:
            record = set_role(
                pw.membership,
                tenant_id=tenant_id,
                group_id=group_id,
                actor=actor,
                targets=request.member_ids,
                role=request.role,
                stamp=_stamp(pw, tenant_id, group_id, now_ms),
                as_member=request.as_member,
            )
            if record is not None:
                pw.append(record, plan)
        elif request.action == MembershipAction.TRANSFER:
            if len(request.member_ids) != 1:
                raise MembershipRejected("transfer_needs_one_new_owner")
            record = transfer_ownership(
                pw.membership,
                tenant_id=tenant_id,
                group_id=group_id,
                actor=actor,
                new_owner=request.member_ids[0],
                stamp=_stamp(pw, tenant_id, group_id, now_ms),
                as_member=request.as_member,
            )
            pw.append(record, plan)
        elif request.action == MembershipAction.DISSOLVE:
            record = dissolve_group(
                pw.membership,
                tenant_id=tenant_id,
                group_id=group_id,
                actor=actor,
                stamp=_stamp(pw, tenant_id, group_id, now_ms),
                as_member=request.as_member,
            )
            pw.append(record, plan)
        elif request.action == ADMIN_SHOW:
            # Read-only: the reply carries the current version and count, nothing is appended.
            group = pw.membership.group(tenant_id, group_id)
            if group is None or group.dissolved:
                raise MembershipRejected("no_such_group")
        else:
            raise MembershipRejected(f"unknown_action:{request.action}")
    except ProtocolError as exc:
        admin_reply(request, plan, error=error_body(exc, 0))
        return
    admin_reply(request, plan, membership=pw.membership)


def _stamp(pw: PartitionWriter, tenant_id: str, group_id: str, now_ms: int) -> ControlStamp:
    """The CONTROL message's coordinates; nothing is reserved until its record is applied."""
    coords = pw.state.next_coordinates(tenant_id, group_id, now_ms)
    return ControlStamp(
        coords.conversation_seq,
        message_id=int.from_bytes(coords.message_id, "big"),
        last_activity_id=int.from_bytes(coords.last_activity_id, "big"),
        committed_at=coords.committed_at,
    )
