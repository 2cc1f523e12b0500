"""Deterministic bytes of membership state: what is persisted, and what replay must reproduce.

Why only rows and counters: everything else in a ``GroupState`` (bitmaps, shard sets, sorted
search indexes, the MailboxShard of each row) is derived and rebuilt on decode, so two states
with the same members encode identically however they were built. Rows are sorted by user id,
groups by ``(tenant_id, group_id)``, pending create chunks by group then index; structs are
msgpack arrays (positional, compact) because this format is private to GroupMembership and
versioned with it -- the records on topics are the maps, this is a checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from qim.core.membership.group import GroupState, MemberRow
from qim.schemas.records.membership import MembershipCommitted

__all__ = [
    "GroupSnap",
    "RowSnap",
    "StateSnap",
    "decode_group",
    "decode_snapshot",
    "encode_group",
    "encode_snapshot",
    "restore_group",
    "snap_group",
]


class RowSnap(msgspec.Struct, array_like=True, frozen=True):
    """A MemberSlotMap row with its interval and role (the shard is derived)."""

    user_id: str
    slot_id: int
    role: str
    state: str
    joined_at: int
    left_at: int | None
    assigned_at: int
    released_at: int | None
    display_hint: str


class GroupSnap(msgspec.Struct, array_like=True, frozen=True):
    """One group: counters plus rows sorted by user id; ``dissolved`` and ``e2ee`` trail with
    defaults, so a checkpoint written before they existed still decodes."""

    tenant_id: str
    group_id: str
    version: int
    next_slot: int
    updated_at: int
    rows: tuple[RowSnap, ...]
    dissolved: bool = False
    e2ee: bool = False


class StateSnap(msgspec.Struct, array_like=True, frozen=True):
    """Every group plus the chunks of creates still in progress."""

    groups: tuple[GroupSnap, ...]
    pending: tuple[MembershipCommitted, ...]


_ENCODER = msgspec.msgpack.Encoder()
_STATE_DECODER = msgspec.msgpack.Decoder(StateSnap)
_GROUP_DECODER = msgspec.msgpack.Decoder(GroupSnap)


def snap_group(group: GroupState) -> GroupSnap:
    rows = tuple(_row_snap(group.rows[user]) for user in sorted(group.rows))
    return GroupSnap(
        group.tenant_id,
        group.group_id,
        group.version,
        group.next_slot,
        group.updated_at,
        rows,
        group.dissolved,
        group.e2ee,
    )


def restore_group(snap: GroupSnap, shard_of: Callable[[str], int]) -> GroupState:
    group = GroupState(snap.tenant_id, snap.group_id, shard_of)
    group.version = snap.version
    group.next_slot = snap.next_slot
    group.updated_at = snap.updated_at
    group.dissolved = snap.dissolved
    group.e2ee = snap.e2ee
    for row in snap.rows:
        group.rows[row.user_id] = _row_of(row, shard_of(row.user_id))
    group.reindex()
    return group


def encode_snapshot(snap: StateSnap) -> bytes:
    return _ENCODER.encode(snap)


def decode_snapshot(data: bytes) -> StateSnap:
    return _STATE_DECODER.decode(data)


def encode_group(group: GroupState) -> bytes:
    """One group's bytes, for a table keyed by ``(tenant_id, group_id)``."""
    return _ENCODER.encode(snap_group(group))


def decode_group(data: bytes, shard_of: Callable[[str], int]) -> GroupState:
    """Inverse of :func:`encode_group`; ``shard_of`` maps a user id to its MailboxShard."""
    return restore_group(_GROUP_DECODER.decode(data), shard_of)


def _row_snap(row: MemberRow) -> RowSnap:
    return RowSnap(
        row.user_id,
        row.slot_id,
        row.role,
        row.state,
        row.joined_at,
        row.left_at,
        row.assigned_at,
        row.released_at,
        row.display_hint,
    )


def _row_of(snap: RowSnap, shard: int) -> MemberRow:
    return MemberRow(
        user_id=snap.user_id,
        slot_id=snap.slot_id,
        role=snap.role,
        state=snap.state,
        joined_at=snap.joined_at,
        left_at=snap.left_at,
        assigned_at=snap.assigned_at,
        released_at=snap.released_at,
        display_hint=snap.display_hint,
        shard=shard,
    )
