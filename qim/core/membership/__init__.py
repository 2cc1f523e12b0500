"""GroupMembership core: member sets, slots, versions, intervals and slices (spec 7.5, 7.9).

Pure (no I/O, no clock, no randomness). The ConversationWriter calls an operation
(:func:`create_group`, :func:`add_members`, :func:`remove_members`, :func:`leave_group`,
:func:`set_role`, :func:`transfer_ownership`, :func:`dissolve_group`; roles in
``qim.core.membership.roles``), commits
the returned :class:`~qim.schemas.records.membership.MembershipCommitted` records to the outbox,
folds them in with :meth:`GroupMembership.apply` (the same call a replay makes) and produces
:func:`member_slices` of the published version to each shard's dispatch partition before any
dispatch pinned to it. MailboxNodes reassemble slices with :class:`SliceAssembler`.
"""

from qim.core.membership.bitmaps import bitmap_bytes, bitmap_from_bytes, canonical_bitmap
from qim.core.membership.errors import MembershipLogError, MembershipRejected
from qim.core.membership.group import GroupState, MemberRow
from qim.core.membership.members_page import (
    MemberPageLimits,
    create_reply,
    leave_reply,
    pull_members,
)
from qim.core.membership.operations import (
    DEFAULT_CHUNK_MAX_MEMBERS,
    DEFAULT_E2EE_MAX_MEMBERS,
    E2EE_MEMBER_LIMIT,
    ControlStamp,
    add_members,
    create_group,
    dissolve_group,
    leave_group,
    remove_members,
    set_role,
    transfer_ownership,
)
from qim.core.membership.roles import OPERATOR, PREVIOUS_OWNER_ROLE, GroupPolicy
from qim.core.membership.slices import (
    Departures,
    ShardSlice,
    SliceAssembler,
    audit_slices,
    member_slices,
    version_snapshot,
)
from qim.core.membership.snapshot import decode_group, encode_group
from qim.core.membership.state import GroupMembership, VersionPublished

__all__ = [
    "DEFAULT_CHUNK_MAX_MEMBERS",
    "DEFAULT_E2EE_MAX_MEMBERS",
    "E2EE_MEMBER_LIMIT",
    "OPERATOR",
    "PREVIOUS_OWNER_ROLE",
    "ControlStamp",
    "Departures",
    "GroupMembership",
    "GroupPolicy",
    "GroupState",
    "MemberPageLimits",
    "MemberRow",
    "MembershipLogError",
    "MembershipRejected",
    "ShardSlice",
    "SliceAssembler",
    "VersionPublished",
    "add_members",
    "audit_slices",
    "bitmap_bytes",
    "bitmap_from_bytes",
    "canonical_bitmap",
    "create_group",
    "create_reply",
    "decode_group",
    "dissolve_group",
    "encode_group",
    "leave_group",
    "leave_reply",
    "member_slices",
    "pull_members",
    "remove_members",
    "set_role",
    "transfer_ownership",
    "version_snapshot",
]
