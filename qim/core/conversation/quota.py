"""``max_conversations_per_user`` at the ConversationWriter: who would join, and may they (I-26).

The cap is counted by each user's MailboxNode (``qim.core.mailbox.quota``), which publishes the
users at the cap on ``qim.user-quota``; the writer keeps that set in memory and refuses, before
anything is committed, a request that would make one of them join a conversation: the first
SEND_MESSAGE of a one-to-one conversation (no ConversationHead yet; the sender and the peer),
a CREATE_GROUP (creator and invitees) and the admin plane's create / add (the targets not
already members). Refused whole, like an over-limit create or join (B.6.1):
``ERROR{PERMISSION_DENIED, detail=conversation_quota_exhausted}``. Everything else, including a
send to an existing conversation, is never refused here.

Eventually consistent: the set lags the MailboxNode's count by one crossing record in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Final, TypeAlias

from qim.core.conversation.ids import direct_participants, is_direct_participant
from qim.schemas.records import (
    AdminGroupRequest,
    ConversationRequest,
    CreateGroupRequest,
    SendRequest,
)
from qim.schemas.records.membership import MembershipAction

__all__ = ["QUOTA_EXHAUSTED", "UserKey", "joining_users", "quota_refused"]

QUOTA_EXHAUSTED: Final = "conversation_quota_exhausted"

UserKey: TypeAlias = tuple[str, str]
"""``(tenant_id, user_id)``."""


def joining_users(
    request: ConversationRequest,
    *,
    exists: bool,
    is_member: Callable[[str], bool] = lambda _user: False,
) -> tuple[str, ...]:
    """The users ``request`` would add to a conversation they are not in yet.

    ``exists``: the conversation has a ConversationHead (one-to-one) or a group state / pending
    create (group); ``is_member`` answers for the request's group (admin add only).
    A send whose id is not the (sender, peer) conversation joins nobody: it is refused as
    ``not_a_member`` by the send path, which must keep answering that.
    """
    match request:
        case SendRequest():
            if exists:
                return ()
            tenant, sender, conv = request.tenant_id, request.sender_id, request.message
            if not is_direct_participant(
                tenant, conv.conversation_id, sender, request.peer_user_id
            ):
                return ()
            return direct_participants(sender, request.peer_user_id)
        case CreateGroupRequest():
            if exists:
                return ()
            return _unique((request.user_id, *request.message.member_ids))
        case AdminGroupRequest():
            if request.action == MembershipAction.CREATE and not exists:
                return _unique((request.actor, *request.member_ids))
            if request.action == MembershipAction.ADD and exists:
                return _unique(tuple(u for u in request.member_ids if not is_member(u)))
            return ()
        case _:
            return ()


def quota_refused(
    tenant_id: str, joining: Collection[str], exhausted: Collection[UserKey]
) -> tuple[str, ...]:
    """The joining users at their cap (sorted); any one refuses the whole request."""
    if not exhausted:
        return ()
    return tuple(sorted(u for u in joining if (tenant_id, u) in exhausted))


def _unique(users: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(users))
