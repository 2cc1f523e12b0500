"""The ConversationWriter's answers: a reply addressed like its request, ERROR from a refusal.

A ``WriterReply`` goes to ``qim.to-gateway`` at the requester's ConnectionShard with the
session fields of the request (``session_epoch`` lets the gateway drop a reply meant for a
replaced session); an ``AdminReply`` goes to ``qim.admin-replies`` under the admin endpoint's
node id, and only when the request asked for one. A refusal is a ``ProtocolError`` whose code
is the spec's (PERMISSION_DENIED when the core gives none); a request on the wrong partition is
answered SHARD_MOVED with a ``retry_after_ms``, since the gateway's routing will settle.
"""

from __future__ import annotations

from typing import Final, TypeAlias

from qim.agents.writer.partition import Plan
from qim.core.membership import GroupMembership
from qim.schemas.frames.connection import Error
from qim.schemas.frames.errors import ErrorCode
from qim.schemas.frames.exceptions import ProtocolError
from qim.schemas.frames.history import HistoryBatch
from qim.schemas.frames.members import MemberListBatch
from qim.schemas.frames.reactions import ReactionList
from qim.schemas.records import (
    AdminGroupRequest,
    AdminReply,
    AmendRequest,
    ConversationRequest,
    CreateGroupRequest,
    LeaveGroupRequest,
    PullHistoryRequest,
    PullMembersRequest,
    PullReactionsRequest,
    ReactRequest,
    RtcSignalRequest,
    SendRequest,
    TypingRequest,
    WriterReply,
)
from qim.schemas.records.requests import reply_for

__all__ = [
    "MISROUTED_RETRY_MS",
    "SessionRequest",
    "admin_reply",
    "error_body",
    "refuse",
    "reply_to",
]

MISROUTED_RETRY_MS: Final = 1000

SessionRequest: TypeAlias = (
    SendRequest
    | PullHistoryRequest
    | AmendRequest
    | PullMembersRequest
    | CreateGroupRequest
    | LeaveGroupRequest
    | ReactRequest
    | PullReactionsRequest
    | TypingRequest
    | RtcSignalRequest
)
"""The requests a client sent through a gateway session, answered on ``qim.to-gateway``."""


def reply_to(
    request: SessionRequest,
    *,
    error: Error | None = None,
    history: HistoryBatch | None = None,
    members: MemberListBatch | None = None,
    reaction_list: ReactionList | None = None,
) -> WriterReply:
    """The reply to ``request`` carrying exactly one of the bodies."""
    return reply_for(
        request, error=error, history=history, members=members, reaction_list=reaction_list
    )


def error_body(exc: ProtocolError, request_id: int, retry_after_ms: int | None = None) -> Error:
    code = exc.code or ErrorCode.PERMISSION_DENIED
    return Error(
        code=int(code), retry_after_ms=retry_after_ms, detail=exc.detail, request_id=request_id
    )


def refuse(
    request: ConversationRequest,
    exc: ProtocolError,
    plan: Plan,
    retry_after_ms: int | None = None,
) -> None:
    """Answer ``request`` with the ERROR of ``exc``; nothing else of it enters the plan."""
    if exc.code == ErrorCode.SHARD_MOVED and retry_after_ms is None:
        retry_after_ms = MISROUTED_RETRY_MS
    if isinstance(request, AdminGroupRequest):
        admin_reply(request, plan, error=error_body(exc, 0, retry_after_ms))
        return
    error = error_body(exc, request.request_id, retry_after_ms)
    plan.replies.append(reply_to(request, error=error))


def admin_reply(
    request: AdminGroupRequest,
    plan: Plan,
    *,
    error: Error | None = None,
    membership: GroupMembership | None = None,
) -> None:
    """The admin endpoint's answer: an error, or the group's version and count now."""
    if request.reply_to is None:
        return
    version = count = 0
    if membership is not None:
        version = membership.version(request.tenant_id, request.group_id)
        count = membership.member_count(request.tenant_id, request.group_id)
    plan.admin_replies.append(
        AdminReply(
            node_id=request.reply_to.node_id,
            correlation_id=request.reply_to.correlation_id,
            error=error,
            membership_version=version,
            member_count=count,
        )
    )
