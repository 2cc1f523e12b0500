"""Which business frames go to the ConversationWriter, as which envelope, on which partition.

Pure (style.md item 1): a decoded frame and the session's :class:`~qim.gateway.ports.AuthGrant`
in, a :class:`Routed` envelope or an ERROR body out. The I/O (the producer, the replies) lives
in ``forwarder`` and ``router``.

Rules:

* identity comes from the authenticated session, never from the frame (§20.1): ``tenant_id``,
  the user, the device, ``session_epoch``, and ``connection_shard`` (where the reply goes) are
  the session's; ``request_id`` is the frame header's (A.1 pairs request and reply by it). A body
  that carries other fields (unknown keys, a different body ``request_id``) changes none of it;
* the partition is explicit, ``conversation_partition(tenant, conversation, count)``, so every
  gateway and the admin endpoint pick the same ConversationWriter for a conversation with no
  client-library partitioner (direction.md §3);
* a conversation id must be a direct id (``d:`` + 32 hex) or a group id (``g:`` + name)
  (``qim.core.conversation.ids``); anything else is ``PERMISSION_DENIED`` with the very body the
  writer sends a non-member (empty detail), so a malformed id and a stranger's conversation are
  indistinguishable (§20.2.2, A.3 #22). It is answered here, without a Kafka round trip.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from qim.core.conversation.ids import conversation_kind
from qim.gateway.ports import AuthGrant
from qim.schemas.frames import (
    Body,
    CreateGroup,
    Edit,
    Error,
    ErrorCode,
    Frame,
    LeaveGroup,
    PullHistory,
    PullMembers,
    PullReactions,
    React,
    Recall,
    SendMessage,
)
from qim.schemas.frames.control import Typing
from qim.schemas.frames.rtc import RtcSignal
from qim.schemas.records.outbox import GROUP
from qim.schemas.records.requests import (
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
    conversation_partition,
    encode_record,
)

__all__ = ["ROUTED_FRAMES", "Routed", "denied", "request_kind", "route_frame"]

ROUTED_FRAMES: Final = (
    SendMessage,
    PullHistory,
    Recall,
    Edit,
    PullMembers,
    CreateGroup,
    LeaveGroup,
    React,
    PullReactions,
    Typing,
    RtcSignal,
)
"""The request frames the ConversationWriter decides (A.3 #4, #5, #8, #9, #10, #16, #18-#22);
TYPING and RTC_SIGNAL have no reply unless refused (13.2, 13.5), the writer relays them."""

_KINDS: Final[dict[type[Body], str]] = {
    SendMessage: "send",
    PullHistory: "pull_history",
    Recall: "recall",
    Edit: "edit",
    PullMembers: "pull_members",
    CreateGroup: "create_group",
    LeaveGroup: "leave_group",
    React: "react",
    PullReactions: "pull_reactions",
    Typing: "typing",
    RtcSignal: "rtc_signal",
}


def request_kind(body: Body) -> str:
    """The envelope tag a routed frame travels as (the ``kind`` label of the metrics)."""
    return _KINDS.get(type(body), "other")


@dataclass(frozen=True, slots=True)
class Routed:
    """One request for ``qim.conversation-requests``: the envelope, its key and partition."""

    request: ConversationRequest
    partition: int
    kind: str  # the envelope's tag: "send", "pull_history", ... (metrics label)

    @property
    def key(self) -> bytes:
        return self.request.key

    @property
    def value(self) -> bytes:
        return encode_record(self.request)


def denied(request_id: int) -> Error:
    """The writer's non-member answer, byte for byte (``error_reply``: no detail)."""
    return Error(code=int(ErrorCode.PERMISSION_DENIED), request_id=request_id)


def not_offered(frame: Frame) -> Error:
    """The answer to a well-formed client frame this server does not serve (issue 16): never
    silence, never a close. PERMISSION_DENIED, since A.6 has no "not implemented" code; the
    ``detail`` names the frame so a client (and its developer) can tell it from a refusal."""
    return Error(
        code=int(ErrorCode.PERMISSION_DENIED),
        request_id=frame.header.request_id,
        detail=f"{frame.name} is not offered by this server",
    )


def route_frame(
    frame: Frame, grant: AuthGrant, *, connection_shard: int, partition_count: int
) -> Routed | Error | None:
    """The envelope for ``frame``, ERROR{PERMISSION_DENIED} for a bad id, None if not ours."""
    body = frame.body
    rid = frame.header.request_id
    if not isinstance(body, ROUTED_FRAMES):
        return None
    if isinstance(
        body,
        SendMessage
        | PullHistory
        | PullMembers
        | Recall
        | Edit
        | React
        | PullReactions
        | Typing
        | RtcSignal,
    ):
        conversation = body.conversation_id
    else:
        conversation = body.group_id
    kind = conversation_kind(conversation)
    if kind is None or (isinstance(body, CreateGroup | LeaveGroup) and kind != GROUP):
        return denied(rid)
    try:
        partition = conversation_partition(grant.tenant_id, conversation, partition_count)
    except ValueError:  # an id the key encoding refuses: as malformed as any other
        return denied(rid)
    return Routed(_envelope(body, grant, connection_shard, rid), partition, request_kind(body))


def _envelope(
    body: SendMessage
    | PullHistory
    | Recall
    | Edit
    | PullMembers
    | CreateGroup
    | LeaveGroup
    | React
    | PullReactions
    | Typing
    | RtcSignal,
    grant: AuthGrant,
    shard: int,
    rid: int,
) -> ConversationRequest:
    """Every identity field from ``grant``; the frame contributes its body and request_id."""
    tenant, user, device, epoch = (
        grant.tenant_id,
        grant.user_id,
        grant.device_id,
        grant.session_epoch,
    )
    if isinstance(body, SendMessage):
        return SendRequest(
            tenant_id=tenant,
            sender_id=user,
            sender_device_id=device,
            session_epoch=epoch,
            connection_shard=shard,
            request_id=rid,
            message=body,
            peer_user_id=body.peer_user_id,
        )
    if isinstance(body, Recall | Edit):
        return AmendRequest(
            tenant_id=tenant,
            user_id=user,
            device_id=device,
            session_epoch=epoch,
            connection_shard=shard,
            request_id=rid,
            action="recall" if isinstance(body, Recall) else "edit",
            conversation_id=body.conversation_id,
            target_conversation_seq=body.target_conversation_seq,
            new_payload=body.new_payload if isinstance(body, Edit) else b"",
        )
    if isinstance(body, RtcSignal):
        return RtcSignalRequest(
            tenant_id=tenant,
            user_id=user,
            device_id=device,
            session_epoch=epoch,
            connection_shard=shard,
            request_id=rid,
            message=body,
        )
    if isinstance(body, Typing):
        return TypingRequest(
            tenant_id=tenant,
            user_id=user,
            device_id=device,
            session_epoch=epoch,
            connection_shard=shard,
            request_id=rid,
            conversation_id=body.conversation_id,
        )
    if isinstance(body, React):
        return ReactRequest(
            tenant_id=tenant,
            user_id=user,
            device_id=device,
            session_epoch=epoch,
            connection_shard=shard,
            request_id=rid,
            conversation_id=body.conversation_id,
            conversation_seq=body.conversation_seq,
            reaction_key=body.reaction_key,
            action=body.action,
        )
    if isinstance(body, PullReactions):
        return PullReactionsRequest(
            tenant_id=tenant,
            user_id=user,
            device_id=device,
            session_epoch=epoch,
            connection_shard=shard,
            request_id=rid,
            conversation_id=body.conversation_id,
            conversation_seq=body.conversation_seq,
            reaction_key=body.reaction_key,
            offset=body.offset,
            limit=body.limit,
        )
    envelope: type[PullHistoryRequest | PullMembersRequest | CreateGroupRequest | LeaveGroupRequest]
    if isinstance(body, PullHistory):
        envelope = PullHistoryRequest
    elif isinstance(body, PullMembers):
        envelope = PullMembersRequest
    elif isinstance(body, CreateGroup):
        envelope = CreateGroupRequest
    else:
        envelope = LeaveGroupRequest
    return envelope(
        tenant_id=tenant,
        user_id=user,
        device_id=device,
        session_epoch=epoch,
        connection_shard=shard,
        request_id=rid,
        message=body,  # type: ignore[arg-type]  # paired with its envelope just above
    )
