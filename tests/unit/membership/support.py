"""A test harness that plays the ConversationWriter's part around the membership core.

It allocates the CONTROL message's seq only when an operation returns a record (as the writer
does), commits every record to an in-memory outbox ``log`` and applies it, so a test can
replay ``log`` into a fresh ``GroupMembership`` and compare.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from qim.core.membership import (
    ControlStamp,
    GroupMembership,
    VersionPublished,
    add_members,
    create_group,
    dissolve_group,
    leave_group,
    remove_members,
    set_role,
    transfer_ownership,
)
from qim.schemas.records.membership import MembershipCommitted, Role

SHARDS = 64
MAX_MEMBERS = 100_000


class Harness:
    """Live state + outbox log + per-conversation seq counters."""

    def __init__(
        self, *, shards: int = SHARDS, chunk_max_members: int = 4096, e2ee_max_members: int = 1000
    ) -> None:
        self.shards = shards
        self.e2ee_max_members = e2ee_max_members
        self.chunk = chunk_max_members
        self.state = GroupMembership(mailbox_shard_count=shards)
        self.log: list[MembershipCommitted] = []
        self.published: list[VersionPublished] = []
        self.seqs: dict[tuple[str, str], int] = {}
        self.clock = 1_700_000_000_000

    def _stamp(self, tenant: str, group: str) -> ControlStamp:
        seq = self.seqs.get((tenant, group), 0) + 1
        self.clock += 1
        return ControlStamp(
            seq,
            message_id=(self.clock << 80) | seq,
            last_activity_id=(self.clock << 80) | seq,
            committed_at=self.clock,
        )

    def _commit(self, records: Iterable[MembershipCommitted]) -> list[VersionPublished]:
        out = []
        for record in records:
            if record.conversation_seq:
                self.seqs[(record.tenant_id, record.group_id)] = record.conversation_seq
            self.log.append(record)
            published = self.state.apply(record)
            if published is not None:
                out.append(published)
                self.published.append(published)
        return out

    def send(self, tenant: str, group: str, count: int = 1) -> int:
        """Ordinary messages take seqs too; returns the last one."""
        seq = self.seqs.get((tenant, group), 0) + count
        self.seqs[(tenant, group)] = seq
        return seq

    def create(
        self,
        tenant: str,
        group: str,
        creator: str,
        invitees: Iterable[str],
        *,
        e2ee: bool = False,
    ) -> list[VersionPublished]:
        self.clock += 1
        records = create_group(
            self.state,
            tenant_id=tenant,
            group_id=group,
            creator=creator,
            invitees=invitees,
            committed_at=self.clock,
            max_members=MAX_MEMBERS,
            chunk_max_members=self.chunk,
            e2ee=e2ee,
            e2ee_max_members=self.e2ee_max_members,
        )
        return self._commit(records)

    def add(
        self,
        tenant: str,
        group: str,
        targets: Iterable[str],
        role: str = Role.MEMBER,
        hints: Mapping[str, str] | None = None,
        *,
        actor: str = "admin",
        as_member: bool = False,
    ) -> MembershipCommitted | None:
        record = add_members(
            self.state,
            tenant_id=tenant,
            group_id=group,
            actor=actor,
            as_member=as_member,
            targets=targets,
            stamp=self._stamp(tenant, group),
            max_members=MAX_MEMBERS,
            role=role,
            display_hints=hints,
            e2ee_max_members=self.e2ee_max_members,
        )
        self._commit([record] if record else [])
        return record

    def remove(
        self,
        tenant: str,
        group: str,
        targets: Iterable[str],
        *,
        ban: bool = False,
        actor: str = "admin",
        as_member: bool = False,
    ) -> MembershipCommitted | None:
        record = remove_members(
            self.state,
            tenant_id=tenant,
            group_id=group,
            actor=actor,
            as_member=as_member,
            targets=targets,
            stamp=self._stamp(tenant, group),
            ban=ban,
        )
        self._commit([record] if record else [])
        return record

    def leave(self, tenant: str, group: str, user: str) -> MembershipCommitted:
        record = leave_group(
            self.state,
            tenant_id=tenant,
            group_id=group,
            user_id=user,
            stamp=self._stamp(tenant, group),
        )
        self._commit([record])
        return record

    def set_role(
        self,
        tenant: str,
        group: str,
        targets: Iterable[str],
        role: str,
        *,
        actor: str = "admin",
        as_member: bool = False,
    ) -> MembershipCommitted | None:
        record = set_role(
            self.state,
            tenant_id=tenant,
            group_id=group,
            actor=actor,
            targets=targets,
            role=role,
            stamp=self._stamp(tenant, group),
            as_member=as_member,
        )
        self._commit([record] if record else [])
        return record

    def transfer(
        self,
        tenant: str,
        group: str,
        new_owner: str,
        *,
        actor: str = "admin",
        as_member: bool = False,
    ) -> MembershipCommitted:
        record = transfer_ownership(
            self.state,
            tenant_id=tenant,
            group_id=group,
            actor=actor,
            new_owner=new_owner,
            stamp=self._stamp(tenant, group),
            as_member=as_member,
        )
        self._commit([record])
        return record

    def dissolve(
        self, tenant: str, group: str, *, actor: str = "admin", as_member: bool = False
    ) -> MembershipCommitted:
        record = dissolve_group(
            self.state,
            tenant_id=tenant,
            group_id=group,
            actor=actor,
            stamp=self._stamp(tenant, group),
            as_member=as_member,
        )
        self._commit([record])
        return record

    def replay(self) -> GroupMembership:
        """A fresh state rebuilt from the outbox log alone."""
        state = GroupMembership(mailbox_shard_count=self.shards)
        for record in self.log:
            state.apply(record)
        return state
