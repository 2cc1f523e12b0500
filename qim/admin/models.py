"""The group admin HTTP API's bodies, as the server decodes and encodes them.

Why one set of ``msgspec`` structs: the handlers decode every request body with them (a wrong
type, a missing or empty field, an unknown field is a 400 naming it) and the OpenAPI document
(:mod:`qim.admin.openapi`) is generated from the same structs, so the document cannot drift from
what the server accepts.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias

import msgspec

__all__ = [
    "AddMembersBody",
    "AdminErrorBody",
    "CreateGroupBody",
    "GroupChangeReply",
    "PromoteRoomBody",
    "PromoteRoomReply",
    "SetRoleBody",
    "TransferOwnerBody",
]

NonEmpty: TypeAlias = Annotated[str, msgspec.Meta(min_length=1)]
Actor: TypeAlias = Annotated[
    NonEmpty | None,
    msgspec.Meta(
        description="Who made the change (recorded in the CONTROL message); default the "
        "X-Qim-Admin-Actor header, else `admin`."
    ),
]
AsMember: TypeAlias = Annotated[
    bool | None,
    msgspec.Meta(
        description="Make the change on behalf of the member `actor`: the spec 20.2.2 role "
        "table applies (refusal: 403 PERMISSION_DENIED). Default the X-Qim-Admin-As-Member "
        "header, else false (the trusted operator)."
    ),
]


class CreateGroupBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """``POST /v1/groups``: the owner joins as OWNER, the members as MEMBER."""

    tenant_id: NonEmpty
    group_id: NonEmpty
    owner_id: NonEmpty
    member_ids: list[NonEmpty] = []
    e2ee: Annotated[
        bool,
        msgspec.Meta(
            description="Create the group end-to-end encrypted (spec 22.1): fixed for its "
            "life, at most e2ee_max_members members."
        ),
    ] = False


class AddMembersBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """``POST /v1/groups/{group_id}/members``: GroupAdd."""

    tenant_id: NonEmpty
    member_ids: list[NonEmpty]
    actor: Actor = None
    as_member: AsMember = None


class SetRoleBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """``PUT /v1/groups/{group_id}/members/{user_id}/role``: grant or revoke ADMIN."""

    tenant_id: NonEmpty
    role: Literal["ADMIN", "MEMBER", "GUEST"]
    actor: Actor = None
    as_member: AsMember = None


class TransferOwnerBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """``POST /v1/groups/{group_id}/owner``: the old owner becomes a MEMBER."""

    tenant_id: NonEmpty
    new_owner_id: NonEmpty
    actor: Actor = None
    as_member: AsMember = None


class PromoteRoomBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """``POST /v1/rooms/{room_id}/promote``: the room's online members become the group (14.4)."""

    tenant_id: NonEmpty
    group_id: NonEmpty
    owner_id: NonEmpty


class GroupChangeReply(msgspec.Struct, kw_only=True, frozen=True):
    """``200`` of every group route: the membership version the change committed."""

    tenant_id: str
    group_id: str
    action: Literal["create", "add", "remove", "ban", "show", "set_role", "transfer", "dissolve"]
    membership_version: int
    member_count: int


class PromoteRoomReply(msgspec.Struct, kw_only=True, frozen=True):
    """``200`` of the promote route."""

    tenant_id: str
    group_id: str
    action: Literal["promote"]
    room_id: str
    online_members: list[str]
    membership_version: int
    member_count: int


class AdminErrorBody(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """Every error status: ``error`` is a word (``bad_request``, ``unauthorized``, ``timeout``,
    ``unavailable``) or the A.6 code's name; ``code`` its number."""

    error: str
    detail: str | None = None
    code: int | None = None
    retry_after_ms: int | None = None
