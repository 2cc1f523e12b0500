"""Group membership records: the CONTROL payload, the outbox commit and the dispatch-log slices.

Three records, three audiences (spec 7.9, 7.5, App. A.3 CREATE_GROUP / LEAVE_GROUP, ADR-0021):

* :class:`MembershipControl` -- the body of the CONTROL message a join, remove or leave commits
  (``message_type`` CONTROL, ``custom_type = "qim.membership.v1"``). Clients read it in history
  and in the subject's MEMBERSHIP entry, so it holds only what a client may see::

      map {
        "action":             str   create | add | remove | ban | leave | set_role |
                                    transfer | dissolve
        "group_id":           str
        "actor":              str   creator, admin-plane principal, or the leaver
        "targets":            [str] affected user ids, ascending, no duplicates
        "membership_version": u64   the version this change produced
        "member_count":       u32   members after the change
        "role":               str   set_role: the targets' new role; transfer: the
                                    previous owner's new role (omitted otherwise)
        "previous_owner":     str   transfer only: who was OWNER before
        "e2ee":               bool  create only: the group is end-to-end encrypted
                                    (spec 22.1; fixed at creation, omitted when false)
      }

* :class:`MembershipCommitted` -- the outbox record (tag ``kind = "membership"``), the
  extension of the outbox union for membership. It is the ONE atomic record of a change: the
  member set, the version and the ``(joined_at, left_at)`` intervals are a pure function of
  these records (``qim.core.membership.MembershipState.apply``), live and in replay. It also
  carries the CONTROL message envelope (seq, ids, time), so the HistoryArchiver stores the
  CONTROL message from it. A create is the group's first CONTROL message: its last chunk
  carries the seq and ids (12.9: create / join are MEMBERSHIP entries); the earlier chunks of
  a large create carry ``conversation_seq = 0`` and zero ids. A large create is split into
  ``chunk_count`` records that share one ``membership_version``; the version exists only once
  every chunk has been applied.

* :class:`MemberSliceRecord` -- one chunk of one version's member slice for one MailboxShard
  (tag ``kind = "member_slice"``), produced to dispatch partition ``mailbox_shard`` before any
  GroupDispatch pinned to that version (direction 4.3). A MailboxNode holds only its own
  shard's slices, so a slice carries the slot -> user mapping and ``joined_at`` of its slots,
  and the closed ``(joined_at, left_at)`` intervals of the shard's former members.
  The set of chunks of ``(tenant, group, version, shard)`` is complete when ``chunk_count``
  distinct ``chunk_index`` values arrived: that count is the completion marker, and it survives
  the in-partition reorder ADR-0017 allows (the last chunk need not arrive last).

Bitmaps are RoaringFormatSpec **portable** bytes (spec 7.9, ADR-0006), canonicalized by
``qim.core.membership.bitmaps`` so equal slot sets give equal bytes. u128 ids travel as 16-byte
big-endian bin, as in frames.
"""

from __future__ import annotations

from typing import Final

import msgspec

from qim.schemas.frames.base import U32, U64, U128, U128_ZERO

__all__ = [
    "ACTIONS",
    "MEMBERSHIP_CUSTOM_TYPE",
    "MESSAGE_TYPE_CONTROL",
    "ROLE_ACTIONS",
    "GroupMembershipVersion",
    "MemberSliceRecord",
    "MembershipAction",
    "MembershipCommitted",
    "MembershipControl",
    "MembershipState",
    "Role",
    "ShardBitmap",
    "control_of",
    "decode_control",
    "decode_member_slice",
    "decode_membership_committed",
    "encode_control",
    "encode_membership_record",
]

MEMBERSHIP_CUSTOM_TYPE: Final = "qim.membership.v1"

MESSAGE_TYPE_CONTROL: Final = 0xFF
"""``message_type`` of the membership CONTROL message (A.3 #22 ``MESSAGE_TYPE_CONTROL``). The
spec names the type but gives no number and the spec 13.3 registry does not exist yet: the top
u8 value is reserved for it here until that registry takes it over."""


class MembershipAction:
    """``action`` words; plain str (a newer peer's new word must still decode, spec 27.1.2)."""

    CREATE: Final = "create"
    ADD: Final = "add"
    REMOVE: Final = "remove"
    BAN: Final = "ban"
    LEAVE: Final = "leave"
    SET_ROLE: Final = "set_role"
    TRANSFER: Final = "transfer"
    DISSOLVE: Final = "dissolve"


ACTIONS: Final = frozenset(
    {
        MembershipAction.CREATE,
        MembershipAction.ADD,
        MembershipAction.REMOVE,
        MembershipAction.BAN,
        MembershipAction.LEAVE,
        MembershipAction.SET_ROLE,
        MembershipAction.TRANSFER,
        MembershipAction.DISSOLVE,
    }
)

ROLE_ACTIONS: Final = frozenset({MembershipAction.SET_ROLE, MembershipAction.TRANSFER})
"""Actions that change roles, never the member set (``role`` goes into the CONTROL payload)."""


class Role:
    """Member roles of spec 7.5 (``MEMBER_LIST_BATCH.members[].role``)."""

    OWNER: Final = "OWNER"
    ADMIN: Final = "ADMIN"
    MEMBER: Final = "MEMBER"
    GUEST: Final = "GUEST"


class MembershipState:
    """``membership_state`` of spec 7.5; a former member keeps its row and interval."""

    ACTIVE: Final = "ACTIVE"
    LEFT: Final = "LEFT"
    REMOVED: Final = "REMOVED"
    BANNED: Final = "BANNED"


class _Body(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """Untagged msgpack map, defaults omitted (the CONTROL payload is a message body)."""


class _Record(
    msgspec.Struct,
    kw_only=True,
    omit_defaults=True,
    frozen=True,
    forbid_unknown_fields=False,
    tag_field="kind",
):
    """Tagged like ``qim.schemas.records.requests`` so these join the topics' unions."""


class MembershipControl(_Body, kw_only=True, frozen=True):
    """CONTROL payload of ``qim.membership.v1`` (schema in the module docstring)."""

    action: str
    group_id: str
    actor: str
    targets: tuple[str, ...] = ()
    membership_version: U64
    member_count: U32
    role: str = ""
    previous_owner: str = ""
    e2ee: bool = False


class MembershipCommitted(_Record, tag="membership", kw_only=True, frozen=True):
    """One membership change (or one chunk of a create) as committed to the outbox.

    ``first_slot``: slot ids are assigned as ``first_slot + i`` -- on a create chunk 0 the
    creator takes ``first_slot`` and ``targets[i]`` takes ``first_slot + 1 + i`` -- so applying
    a record never depends on arrival order. ``role`` is granted to ``targets`` on create/add
    and set_role; on a transfer ``targets`` is the new OWNER, ``previous_owner`` the old one and
    ``role`` what the old one becomes. A dissolve lists every member as ``targets``.
    ``display_hints`` is empty or parallel to ``targets``. ``member_count`` is the whole group's
    count after the change (after the last chunk for a create). ``e2ee`` is set on every chunk
    of an end-to-end encrypted group's create and on no other record: the flag is fixed when
    the conversation is created (spec 22.1, B tenant-config ``e2ee_enabled``: irreversible).
    """

    tenant_id: str
    group_id: str
    action: str
    actor: str
    targets: tuple[str, ...] = ()
    membership_version: U64
    member_count: U32
    role: str = ""
    first_slot: U32 = 0
    display_hints: tuple[str, ...] = ()
    conversation_seq: U64 = 0
    message_id: U128 = U128_ZERO
    last_activity_id: U128 = U128_ZERO
    committed_at: U64 = 0
    chunk_index: U32 = 0
    chunk_count: U32 = 1
    previous_owner: str = ""
    e2ee: bool = False


class MemberSliceRecord(_Record, tag="member_slice", kw_only=True, frozen=True):
    """One chunk of a version's member slice for one MailboxShard (dispatch log).

    ``user_ids`` and ``joined_at`` are parallel to the ascending slot ids of ``slot_bitmap``.
    ``shard_member_count`` counts the shard's members over all chunks; ``member_count`` the
    whole group (authoritative for fanout cost, spec 7.9). An empty bitmap with
    ``shard_member_count = 0`` tells the shard the group has no member there any more.

    ``left_user_ids`` / ``left_joined_at`` / ``left_at`` (parallel, ascending by user id) are
    the shard's former members as of this version: each one's last closed interval
    ``(joined_at, left_at)`` (spec 7.5). An older version's slice cannot know a later leave,
    so the MailboxNode keeps these facts and applies ``left_at`` to dispatches pinned to any
    version that still lists the member with that ``joined_at`` (10.1 step 9, seed 003 M-5).
    """

    tenant_id: str
    group_id: str
    membership_version: U64
    mailbox_shard: U32
    chunk_index: U32 = 0
    chunk_count: U32 = 1
    slot_bitmap: bytes
    user_ids: tuple[str, ...] = ()
    joined_at: tuple[U64, ...] = ()
    shard_member_count: U32 = 0
    member_count: U32 = 0
    left_user_ids: tuple[str, ...] = ()
    left_joined_at: tuple[U64, ...] = ()
    left_at: tuple[U64, ...] = ()

    @property
    def partition(self) -> int:
        """The explicit dispatch partition: the target MailboxShard, never a key hash."""
        return self.mailbox_shard


class ShardBitmap(_Body, kw_only=True, frozen=True):
    """One ``(version, mailbox_shard)`` row of GroupMembershipVersion (spec Part 2)."""

    mailbox_shard: U32
    member_count: U32
    member_bitmap: bytes


class GroupMembershipVersion(_Body, kw_only=True, frozen=True):
    """The immutable per-version snapshot: one portable bitmap per populated shard."""

    tenant_id: str
    group_id: str
    membership_version: U64
    member_count: U32
    created_at: U64 = 0
    shards: tuple[ShardBitmap, ...] = ()


_ENCODER = msgspec.msgpack.Encoder()
_CONTROL_DECODER = msgspec.msgpack.Decoder(MembershipControl)
_COMMITTED_DECODER = msgspec.msgpack.Decoder(MembershipCommitted)
_SLICE_DECODER = msgspec.msgpack.Decoder(MemberSliceRecord)


def control_of(record: MembershipCommitted) -> MembershipControl:
    """The client-visible CONTROL payload of a committed change."""
    return MembershipControl(
        action=record.action,
        group_id=record.group_id,
        actor=record.actor,
        targets=record.targets,
        membership_version=record.membership_version,
        member_count=record.member_count,
        role=record.role if record.action in ROLE_ACTIONS else "",
        previous_owner=record.previous_owner,
        e2ee=record.e2ee,
    )


def encode_control(control: MembershipControl) -> bytes:
    """``payload`` bytes of the CONTROL message (custom_type ``qim.membership.v1``)."""
    return _ENCODER.encode(control)


def decode_control(data: bytes) -> MembershipControl:
    """Inverse of :func:`encode_control`; raises ``msgspec.ValidationError`` if malformed."""
    return _CONTROL_DECODER.decode(data)


def encode_membership_record(
    record: MembershipCommitted | MemberSliceRecord | GroupMembershipVersion,
) -> bytes:
    """Deterministic msgpack bytes (struct field order, defaults omitted)."""
    return _ENCODER.encode(record)


def decode_membership_committed(data: bytes) -> MembershipCommitted:
    """Decode an outbox value of kind ``membership``."""
    return _COMMITTED_DECODER.decode(data)


def decode_member_slice(data: bytes) -> MemberSliceRecord:
    """Decode a dispatch value of kind ``member_slice``."""
    return _SLICE_DECODER.decode(data)
