"""The membership check of the send path (spec 8.1 step 1) behind a small Protocol.

GroupMembership (``qim.core.membership``) is the only writer of group membership and lives in the
same conversation app, co-partitioned by conversation (direction.md section 4.3). The writer needs
three answers from it and nothing else, so it depends on :class:`MembershipView`, not on that
code; tests use an in-memory double.

* **Groups**: the sender must be an ACTIVE member (``is_member``). A group that does not exist and
  a group the sender is not in give the same answer (PERMISSION_DENIED, spec A.3 #22), so a probe
  learns nothing. The version current at commit is pinned into the record (spec 7.9: the committer
  freezes it before the outbox) together with its member count (the L3 fanout cost, spec 8.2).
* **Direct** conversations have no membership state: the id is derived from the two user ids
  (``ids.direct_conversation_id``), so the sender is a participant iff the id recomputed from
  (tenant, sender, named peer) matches. Version 0, member count = participants (2, or 1 for a
  note to self).

Tenant isolation: every question carries the tenant taken from the authenticated session; a user
of another tenant with the same user id is another user (the direct id hashes the tenant, and a
``MembershipView`` must key its answers by tenant).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from qim.core.conversation.ids import conversation_kind, direct_participants, is_direct_participant
from qim.schemas.records.outbox import DIRECT, GROUP, ConversationKind
from qim.schemas.records.requests import SendRequest

__all__ = ["MembershipView", "NoGroups", "Target", "resolve_target"]


class MembershipView(Protocol):
    """Read-only view of group membership at the writer's current log position."""

    def is_member(self, tenant_id: str, conversation_id: str, user_id: str) -> bool:
        """True iff ``user_id`` is an ACTIVE member of the group (False if no such group)."""
        ...

    def member_count(self, tenant_id: str, conversation_id: str) -> int:
        """Members of the current membership version (authoritative for fanout cost)."""
        ...

    def version(self, tenant_id: str, conversation_id: str) -> int:
        """The current ``membership_version``; the send pins it."""
        ...

    def role(self, tenant_id: str, conversation_id: str, user_id: str) -> str:
        """The member's role (``Role``); ``""`` if not an ACTIVE member (11.4.2 @all gate)."""
        ...

    def is_e2ee(self, tenant_id: str, conversation_id: str) -> bool:
        """True iff the group was created end-to-end encrypted (spec 22.1; False if none)."""
        ...


class NoGroups:
    """A ``MembershipView`` that knows no group: every group send is PERMISSION_DENIED."""

    def is_member(self, tenant_id: str, conversation_id: str, user_id: str) -> bool:
        return False

    def member_count(self, tenant_id: str, conversation_id: str) -> int:
        return 0

    def version(self, tenant_id: str, conversation_id: str) -> int:
        return 0

    def role(self, tenant_id: str, conversation_id: str, user_id: str) -> str:
        return ""

    def is_e2ee(self, tenant_id: str, conversation_id: str) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class Target:
    """A conversation the sender may write to, with what the record must pin.

    ``e2ee``: the conversation is end-to-end encrypted (spec 22.1): a group's creation flag
    here; a direct conversation's is set by the writer from its head (fixed by its first
    message, which takes the tenant's ``e2ee_direct_tenants``). The record's preview is then
    the E2EE placeholder, never derived from the body.
    """

    kind: ConversationKind
    participants: tuple[str, ...]
    member_count: int
    membership_version: int
    sender_role: str = ""
    """The sender's group role (``""`` in a direct conversation, which has none)."""
    e2ee: bool = False


def resolve_target(request: SendRequest, membership: MembershipView) -> Target | None:
    """The sender's conversation if they may send to it, else None (PERMISSION_DENIED)."""
    tenant, sender = request.tenant_id, request.sender_id
    conversation_id = request.message.conversation_id
    kind = conversation_kind(conversation_id)
    if kind == DIRECT:
        peer = request.peer_user_id
        if not is_direct_participant(tenant, conversation_id, sender, peer):
            return None
        participants = direct_participants(sender, peer)
        return Target(DIRECT, participants, len(participants), 0)
    if kind == GROUP:
        if not membership.is_member(tenant, conversation_id, sender):
            return None
        count = max(1, membership.member_count(tenant, conversation_id))
        version = membership.version(tenant, conversation_id)
        role = membership.role(tenant, conversation_id, sender)
        e2ee = membership.is_e2ee(tenant, conversation_id)
        return Target(GROUP, (), count, version, role, e2ee)
    return None
