"""GroupMembership: every group's membership as a pure function of its outbox records.

Why one ``apply`` for live and replay (style item 3, direction 4.7): the ConversationWriter
computes a :class:`MembershipCommitted` with ``qim.core.membership.operations``, commits it to
the outbox and applies it here; a rebuild applies the same records from the outbox. There is no
second code path, so "live == replay" (and identical :meth:`GroupMembership.encode` bytes) is a
property of this one method.

``apply`` is idempotent: a record whose version is not above the group's is a redelivery and is
ignored, and create chunks are kept per index until all ``chunk_count`` arrived, in any order.
A version gap or a record for an unknown group means the log is not ours: it raises.
"""

from __future__ import annotations

from dataclasses import dataclass

from qim.core.membership.errors import MembershipLogError
from qim.core.membership.group import GroupState
from qim.core.membership.snapshot import (
    StateSnap,
    decode_snapshot,
    encode_snapshot,
    restore_group,
    snap_group,
)
from qim.schemas.records.membership import (
    MembershipAction,
    MembershipCommitted,
    MembershipState,
    Role,
)
from qim.schemas.routing import (
    DEFAULT_MAILBOX_SHARD_COUNT,
    DEFAULT_VIRTUAL_BUCKET_COUNT,
    mailbox_shard_id,
    user_bucket,
)

__all__ = ["GroupMembership", "VersionPublished"]

GroupKey = tuple[str, str]

_RELEASE_STATE = {
    MembershipAction.REMOVE: MembershipState.REMOVED,
    MembershipAction.BAN: MembershipState.BANNED,
    MembershipAction.LEAVE: MembershipState.LEFT,
    # spec 7.5 has no DISSOLVED state: every member is REMOVED at the dissolve's seq J, so
    # history below J stays readable and nothing at or after J is delivered (ADR-0021 rule)
    MembershipAction.DISSOLVE: MembershipState.REMOVED,
}
_CHANGES_ROLES = frozenset({MembershipAction.SET_ROLE, MembershipAction.TRANSFER})


@dataclass(frozen=True, slots=True)
class VersionPublished:
    """A version that became current; its slices go to ``touched_shards`` and every shard
    that still has members (see ``qim.core.membership.slices``)."""

    tenant_id: str
    group_id: str
    membership_version: int
    touched_shards: tuple[int, ...]


class GroupMembership:
    """All groups of the partitions this worker owns; keys are ``(tenant_id, group_id)``."""

    def __init__(
        self,
        *,
        mailbox_shard_count: int = DEFAULT_MAILBOX_SHARD_COUNT,
        virtual_bucket_count: int = DEFAULT_VIRTUAL_BUCKET_COUNT,
    ) -> None:
        self.mailbox_shard_count = mailbox_shard_count
        self.virtual_bucket_count = virtual_bucket_count
        self._groups: dict[GroupKey, GroupState] = {}
        self._pending: dict[GroupKey, dict[int, MembershipCommitted]] = {}

    # -- the one mutator -------------------------------------------------------------------------

    def apply(self, record: MembershipCommitted) -> VersionPublished | None:
        """Fold one outbox record in; returns the version it completed, if any."""
        key = (record.tenant_id, record.group_id)
        if record.action == MembershipAction.CREATE:
            return self._apply_create(key, record)
        group = self._groups.get(key)
        if group is None:
            raise MembershipLogError(f"{record.action} for unknown group {key!r}")
        if record.membership_version <= group.version:
            return None
        if record.membership_version != group.version + 1:
            raise MembershipLogError(f"version gap at {key!r}: {group.version} -> {record}")
        known = record.action == MembershipAction.ADD or record.action in _RELEASE_STATE
        if not known and record.action not in _CHANGES_ROLES:
            raise MembershipLogError(f"unknown membership action {record.action!r}")
        if group.dissolved:
            raise MembershipLogError(f"{record.action} after the dissolve of {key!r}")
        if record.e2ee:
            # spec 22.1: fixed at creation; no later record sets (or clears) it
            raise MembershipLogError(f"only a create carries e2ee: {record}")
        if record.action in _CHANGES_ROLES:
            return self._publish(group, record, _change_roles(group, record))
        _check_change(group, record)
        if record.action == MembershipAction.DISSOLVE and record.member_count != 0:
            raise MembershipLogError(f"a dissolve must release every member: {record}")
        if record.action == MembershipAction.ADD:
            # spec 7.5: joined_at = the join event's own seq - 1, so the event itself is visible
            touched = self._join_all(group, record, record.first_slot, record.conversation_seq - 1)
        else:
            # spec 7.5 / A.3 LEAVE_GROUP: left_at = J, the CONTROL message's own seq
            state, seq = _RELEASE_STATE[record.action], record.conversation_seq
            touched = {group.release(u, state, seq, record.committed_at) for u in record.targets}
            group.dissolved = record.action == MembershipAction.DISSOLVE
        return self._publish(group, record, touched)

    def _apply_create(self, key: GroupKey, record: MembershipCommitted) -> VersionPublished | None:
        if key in self._groups:
            return None
        chunks = self._pending.setdefault(key, {})
        if any(c.chunk_count != record.chunk_count for c in chunks.values()):
            raise MembershipLogError(f"create chunks of {key!r} disagree on chunk_count")
        if any(c.e2ee != record.e2ee for c in chunks.values()):
            raise MembershipLogError(f"create chunks of {key!r} disagree on e2ee")
        if not 0 <= record.chunk_index < record.chunk_count:
            raise MembershipLogError(f"create chunk index out of range: {record}")
        chunks.setdefault(record.chunk_index, record)
        if len(chunks) < record.chunk_count:
            return None
        group = GroupState(key[0], key[1], self.shard_of(key[0]))
        group.e2ee = record.e2ee
        touched: set[int] = set()
        for index in range(record.chunk_count):
            chunk = chunks[index]
            first = chunk.first_slot
            if index == 0:
                at = chunk.committed_at
                touched.add(group.join(chunk.actor, first, Role.OWNER, 0, at, ""))
                first += 1
            touched |= self._join_all(group, chunk, first, 0)
        del self._pending[key]
        return self._publish(group, chunks[record.chunk_count - 1], touched)

    def _join_all(
        self, group: GroupState, record: MembershipCommitted, first_slot: int, joined_at: int
    ) -> set[int]:
        hints = record.display_hints or ("",) * len(record.targets)
        if len(hints) != len(record.targets):
            raise MembershipLogError("display_hints must be empty or parallel to targets")
        role = record.role or Role.MEMBER
        at = record.committed_at
        return {
            group.join(user, first_slot + i, role, joined_at, at, hint)
            for i, (user, hint) in enumerate(zip(record.targets, hints, strict=True))
        }

    def _publish(
        self, group: GroupState, record: MembershipCommitted, touched: set[int]
    ) -> VersionPublished:
        if group.member_count != record.member_count:
            raise MembershipLogError(
                f"member_count {record.member_count} != {group.member_count} after {record}"
            )
        group.version = record.membership_version
        group.updated_at = record.committed_at
        self._groups[(group.tenant_id, group.group_id)] = group
        return VersionPublished(
            group.tenant_id, group.group_id, group.version, tuple(sorted(touched))
        )

    def shard_of(self, tenant_id: str) -> _ShardOf:
        """user id -> MailboxShard for ``tenant_id`` under this routing (spec 5.2)."""
        return _ShardOf(tenant_id, self.virtual_bucket_count, self.mailbox_shard_count)

    # -- the membership check view ---------------------------------------------------------------

    def group(self, tenant_id: str, group_id: str) -> GroupState | None:
        """The group's state (read-only by convention), or None if it does not exist."""
        return self._groups.get((tenant_id, group_id))

    def has_pending_create(self, tenant_id: str, group_id: str) -> bool:
        """A chunked create has started but not completed: the id is taken."""
        return (tenant_id, group_id) in self._pending

    def is_member(self, tenant_id: str, conversation_id: str, user_id: str) -> bool:
        group = self._groups.get((tenant_id, conversation_id))
        return group is not None and group.is_member(user_id)

    def member_count(self, tenant_id: str, conversation_id: str) -> int:
        group = self._groups.get((tenant_id, conversation_id))
        return 0 if group is None else group.member_count

    def is_admin(self, tenant_id: str, conversation_id: str, user_id: str) -> bool:
        """An ACTIVE OWNER or ADMIN (spec 13.4.3: recalls any message, no window)."""
        group = self._groups.get((tenant_id, conversation_id))
        row = None if group is None else group.rows.get(user_id)
        return row is not None and row.active and row.role in (Role.OWNER, Role.ADMIN)

    def role(self, tenant_id: str, conversation_id: str, user_id: str) -> str:
        """An ACTIVE member's role; ``""`` for anyone else (the @all gate, 11.4.2)."""
        group = self._groups.get((tenant_id, conversation_id))
        row = None if group is None else group.rows.get(user_id)
        return row.role if row is not None and row.active else ""

    def is_e2ee(self, tenant_id: str, conversation_id: str) -> bool:
        """The group was created end-to-end encrypted (spec 22.1); False if no such group."""
        group = self._groups.get((tenant_id, conversation_id))
        return group is not None and group.e2ee

    def version(self, tenant_id: str, conversation_id: str) -> int:
        """Current membership_version; 0 = no such group."""
        group = self._groups.get((tenant_id, conversation_id))
        return 0 if group is None else group.version

    def visible_interval(
        self, tenant_id: str, conversation_id: str, user_id: str
    ) -> tuple[int, int | None] | None:
        """``(joined_at, left_at)`` of spec 7.5, both bounds open; None = never a member."""
        group = self._groups.get((tenant_id, conversation_id))
        row = None if group is None else group.rows.get(user_id)
        return None if row is None else (row.joined_at, row.left_at)

    # -- deterministic serialization -----------------------------------------------------------

    def encode(self) -> bytes:
        """Canonical bytes: groups, rows and pending chunks in sorted order."""
        groups = tuple(snap_group(g) for _, g in sorted(self._groups.items()))
        pending = tuple(
            chunk
            for _, chunks in sorted(self._pending.items())
            for _, chunk in sorted(chunks.items())
        )
        return encode_snapshot(StateSnap(groups, pending))

    @classmethod
    def decode(
        cls,
        data: bytes,
        *,
        mailbox_shard_count: int = DEFAULT_MAILBOX_SHARD_COUNT,
        virtual_bucket_count: int = DEFAULT_VIRTUAL_BUCKET_COUNT,
    ) -> GroupMembership:
        """Inverse of :meth:`encode`; shards are recomputed for the given routing."""
        state = cls(
            mailbox_shard_count=mailbox_shard_count, virtual_bucket_count=virtual_bucket_count
        )
        snap = decode_snapshot(data)
        for gs in snap.groups:
            group = restore_group(gs, state.shard_of(gs.tenant_id))
            state._groups[(gs.tenant_id, gs.group_id)] = group
        for chunk in snap.pending:
            chunks = state._pending.setdefault((chunk.tenant_id, chunk.group_id), {})
            chunks[chunk.chunk_index] = chunk
        return state


@dataclass(frozen=True, slots=True)
class _ShardOf:
    """user -> MailboxShard for one tenant (spec 5.2), computed once per member row."""

    tenant_id: str
    virtual_bucket_count: int
    mailbox_shard_count: int

    def __call__(self, user_id: str) -> int:
        bucket = user_bucket(self.tenant_id, user_id, self.virtual_bucket_count)
        return mailbox_shard_id(bucket, self.mailbox_shard_count)


def _change_roles(group: GroupState, record: MembershipCommitted) -> set[int]:
    """Validate then apply a set_role or transfer; returns the shards of the changed rows."""
    if record.conversation_seq < 1:
        raise MembershipLogError(f"{record.action} needs its CONTROL message seq: {record}")
    if len(set(record.targets)) != len(record.targets) or not record.targets:
        raise MembershipLogError(f"targets must be distinct and non-empty: {record}")
    if record.member_count != group.member_count:
        raise MembershipLogError(f"a role change keeps member_count: {record}")
    owner = group.owner()
    if any(not group.is_member(u) or u == owner for u in record.targets):
        raise MembershipLogError(f"targets must be members other than the owner: {record}")
    if record.role not in (Role.ADMIN, Role.MEMBER, Role.GUEST):
        raise MembershipLogError(f"role {record.role!r} cannot be set: {record}")
    if record.action == MembershipAction.SET_ROLE:
        return {group.set_role(u, record.role) for u in record.targets}
    if len(record.targets) != 1 or owner is None or record.previous_owner != owner:
        raise MembershipLogError(f"a transfer names the owner and one new owner: {record}")
    return {group.set_role(owner, record.role), group.set_role(record.targets[0], Role.OWNER)}


def _check_change(group: GroupState, record: MembershipCommitted) -> None:
    """Validate a whole add/remove/ban/leave before mutating, so a bad record changes nothing."""
    if record.conversation_seq < 1:
        raise MembershipLogError(f"{record.action} needs its CONTROL message seq: {record}")
    if len(set(record.targets)) != len(record.targets) or not record.targets:
        raise MembershipLogError(f"targets must be distinct and non-empty: {record}")
    joining = record.action == MembershipAction.ADD
    if any(group.is_member(user) == joining for user in record.targets):
        raise MembershipLogError(f"targets do not fit the member set: {record}")
    if joining and record.first_slot < group.next_slot:
        raise MembershipLogError(f"slot {record.first_slot} would be reused: {record}")
    delta = len(record.targets) if joining else -len(record.targets)
    if group.member_count + delta != record.member_count:
        raise MembershipLogError(f"member_count does not follow: {record}")
