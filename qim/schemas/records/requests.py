"""Conversation requests (gateway -> ConversationWriter) and the writer's replies (-> gateway).

Topics (direction.md section 3):

* ``qim.conversation-requests``: key :func:`conversation_key` ``(tenant, conversation_id)``,
  partitioned by key hash, so every request of one conversation reaches the one
  ConversationWriter that owns the conversation's partition (the single writer of spec 6.3).
* ``qim.to-gateway``: key :func:`user_key` ``(tenant, user_id)``, **explicit partition** =
  the sender's ``connection_shard``, so the reply reaches the gateway that owns the sender's
  ConnectionShard; ``session_epoch`` lets that gateway drop a reply meant for a session that
  has since been replaced (spec 15.2.2), and ``request_id`` correlates it with the frame.

Values are msgpack maps (msgspec), defaults omitted, unknown keys ignored on decode, exactly like
frame bodies (``qim.schemas.frames.base``), so either side may add fields (spec 27.2.1). Each
value is a *tagged* struct (``kind``) so a topic can carry more than one request or reply kind:
the tagged unions below are the extension point for RECALL, EDIT, PULL_HISTORY and PULL_MEMBERS.
Keys use the canonical multi-field encoding :func:`qim.schemas.hash_input`; its UTF-8 text with
NUL separators sorts byte-wise in (tenant, id) order.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import msgspec

from qim.schemas.frames.base import U32, U64
from qim.schemas.frames.connection import Error
from qim.schemas.frames.history import HistoryBatch, PullHistory
from qim.schemas.frames.members import (
    CreateGroup,
    LeaveGroup,
    MemberListBatch,
    PullMembers,
)
from qim.schemas.frames.messaging import SendAck, SendMessage
from qim.schemas.frames.reactions import ReactionList, ReactionUpdate
from qim.schemas.frames.rtc import RtcSignal
from qim.schemas.hashing import blake3_digest, hash_input, validate_identifier

__all__ = [
    "AdminGroupRequest",
    "AdminReply",
    "AdminReplyTo",
    "AmendRequest",
    "ConversationRequest",
    "CreateGroupRequest",
    "GatewayRecord",
    "LeaveGroupRequest",
    "PullHistoryRequest",
    "PullMembersRequest",
    "PullReactionsRequest",
    "ReactRequest",
    "RtcSignalRequest",
    "SendRequest",
    "TypingRequest",
    "WriterReply",
    "conversation_key",
    "conversation_partition",
    "decode_admin_reply",
    "decode_conversation_request",
    "decode_writer_reply",
    "encode_record",
    "reply_for",
    "user_key",
]


class _Record(
    msgspec.Struct,
    kw_only=True,
    omit_defaults=True,
    frozen=True,
    forbid_unknown_fields=False,
    tag_field="kind",
):
    """Base of the envelopes: a tagged msgpack map, defaults omitted."""


def conversation_key(tenant_id: str, conversation_id: str) -> bytes:
    """Kafka key of the conversation-requests and outbox topics: ``tenant 0x00 conversation``."""
    validate_identifier(tenant_id, "tenant_id")
    validate_identifier(conversation_id, "conversation_id")
    return hash_input(tenant_id, conversation_id)


def conversation_partition(tenant_id: str, conversation_id: str, partition_count: int) -> int:
    """The explicit partition of a conversation in conversation-requests and the outbox.

    ``be_u64(blake3(conversation_key)[0:8]) mod partition_count``: every producer (gateways, the
    admin endpoint, tests) computes the same partition with no client-library partitioner, and
    the ConversationWriter of partition p appends the conversation's outbox records to outbox
    partition p (both topics have the same count, direction.md section 3).
    """
    if partition_count <= 0:
        raise ValueError("partition_count must be positive")
    digest = blake3_digest(conversation_key(tenant_id, conversation_id))
    return int.from_bytes(digest[:8], "big") % partition_count


def user_key(tenant_id: str, user_id: str) -> bytes:
    """Kafka key of to-gateway records: ``tenant 0x00 user`` (same bytes as user routing)."""
    validate_identifier(tenant_id, "tenant_id")
    validate_identifier(user_id, "user_id")
    return hash_input(tenant_id, user_id)


class SendRequest(_Record, tag="send", kw_only=True, frozen=True):
    """SEND_MESSAGE as the gateway forwards it, with the identity taken from the session.

    ``sender_id`` / ``sender_device_id`` / ``tenant_id`` come from the authenticated connection,
    never from the frame (spec 20.1). ``message`` is the decoded frame body, unchanged.
    ``peer_user_id`` names the other participant of a one-to-one conversation: a direct
    conversation id is a one-way hash (``qim.core.conversation.ids``), so the writer checks
    membership by recomputing the id from (tenant, sender, peer); it is empty for groups.
    ``connection_shard`` / ``session_epoch`` / ``request_id`` address the reply.
    """

    tenant_id: str
    sender_id: str
    sender_device_id: str
    session_epoch: U64
    connection_shard: U32
    request_id: U32
    message: SendMessage
    peer_user_id: str = ""

    @property
    def key(self) -> bytes:
        return conversation_key(self.tenant_id, self.message.conversation_id)


class _FromSession(_Record, kw_only=True, frozen=True):
    """A client request forwarded by the gateway: who asked (from the authenticated session,
    never from the frame) and where the reply goes (the same fields as :class:`WriterReply`)."""

    tenant_id: str
    user_id: str
    device_id: str
    session_epoch: U64
    connection_shard: U32
    request_id: U32


class PullHistoryRequest(_FromSession, tag="pull_history", kw_only=True, frozen=True):
    """PULL_HISTORY, answered with ``WriterReply.history`` (spec A.3 #5)."""

    message: PullHistory

    @property
    def key(self) -> bytes:
        return conversation_key(self.tenant_id, self.message.conversation_id)


class AmendRequest(_FromSession, tag="amend", kw_only=True, frozen=True):
    """RECALL (``action="recall"``) or EDIT (``"edit"``, with ``new_payload``), spec 13.4.1 and
    A.3 #8/#9: the frame's fields, flattened (the two bodies are untagged frames); ``user_id``,
    the actor, comes from the session like every ``_FromSession``. Answered with
    ``WriterReply.send_ack`` of the CONTROL event (``client_message_id`` empty) or an ERROR."""

    action: Literal["recall", "edit"]
    conversation_id: str
    target_conversation_seq: U64
    new_payload: bytes = b""

    @property
    def key(self) -> bytes:
        return conversation_key(self.tenant_id, self.conversation_id)


class ReactRequest(_FromSession, tag="react", kw_only=True, frozen=True):
    """REACT (spec 13.6.2, A.3 #18), the frame's fields flattened; ``user_id`` from the session.

    Answered with ``WriterReply.reaction_update``: the message's absolute aggregate after the
    request (with the reactor's ``self_reaction_keys``), also when nothing changed, or ERROR.
    """

    conversation_id: str
    conversation_seq: U64
    reaction_key: str
    action: str

    @property
    def key(self) -> bytes:
        return conversation_key(self.tenant_id, self.conversation_id)


class PullReactionsRequest(_FromSession, tag="pull_reactions", kw_only=True, frozen=True):
    """PULL_REACTIONS (A.3 #19), answered with ``WriterReply.reaction_list`` (REACTION_LIST)."""

    conversation_id: str
    conversation_seq: U64
    reaction_key: str
    offset: U32 = 0
    limit: U32 = 0

    @property
    def key(self) -> bytes:
        return conversation_key(self.tenant_id, self.conversation_id)


class PullMembersRequest(_FromSession, tag="pull_members", kw_only=True, frozen=True):
    """PULL_MEMBERS, answered with ``WriterReply.members`` (spec A.3 #20)."""

    message: PullMembers

    @property
    def key(self) -> bytes:
        return conversation_key(self.tenant_id, self.message.conversation_id)


class CreateGroupRequest(_FromSession, tag="create_group", kw_only=True, frozen=True):
    """CREATE_GROUP: ``user_id`` is the creator; answered with ``WriterReply.members``."""

    message: CreateGroup

    @property
    def key(self) -> bytes:
        return conversation_key(self.tenant_id, self.message.group_id)


class LeaveGroupRequest(_FromSession, tag="leave_group", kw_only=True, frozen=True):
    """LEAVE_GROUP: ``user_id`` is the leaver; answered with ``WriterReply.members``."""

    message: LeaveGroup

    @property
    def key(self) -> bytes:
        return conversation_key(self.tenant_id, self.message.group_id)


class TypingRequest(_FromSession, tag="typing", kw_only=True, frozen=True):
    """TYPING uplink (A.3 #10, spec 13.2): decided by the writer, which knows the members.

    No reply when it is forwarded, merged or not forwarded (a large group); a non-member gets
    ``WriterReply.error`` (PERMISSION_DENIED). Nothing is appended to the outbox."""

    conversation_id: str

    @property
    def key(self) -> bytes:
        return conversation_key(self.tenant_id, self.conversation_id)


class RtcSignalRequest(_FromSession, tag="rtc_signal", kw_only=True, frozen=True):
    """RTC_SIGNAL (A.3 #16, spec 13.5): the writer checks that sender and target are members
    of the conversation and relays it to the target's ConnectionShard; no reply unless
    refused. Nothing is appended to the outbox."""

    message: RtcSignal

    @property
    def key(self) -> bytes:
        return conversation_key(self.tenant_id, self.message.conversation_id)


class AdminReplyTo(_Record, tag="admin_reply_to", kw_only=True, frozen=True):
    """Where an admin request's answer goes: ``qim.admin-replies``, key ``node_id``."""

    node_id: str
    correlation_id: str


class AdminGroupRequest(_Record, tag="admin_group", kw_only=True, frozen=True):
    """The trusted admin plane's GroupAdd / GroupRemove / create (spec A.3 #21-#22 notes).

    ``action`` is ``"create"``, ``"add"``, ``"remove"`` (``ban`` also bans), ``"set_role"``
    (``member_ids`` get ``role``), ``"transfer"`` (``member_ids`` = the new OWNER),
    ``"dissolve"`` or ``"show"``. ``actor`` is recorded in the CONTROL message: the operator
    itself, or with ``as_member`` the member on whose behalf the change is made, whose role
    must allow it (spec 20.2.2, ``qim.core.membership.roles``).
    """

    tenant_id: str
    group_id: str
    action: str
    actor: str
    member_ids: tuple[str, ...] = ()
    ban: bool = False
    reply_to: AdminReplyTo | None = None
    as_member: bool = False
    role: str = ""
    e2ee: bool = False
    """``create`` only: an end-to-end encrypted group (spec 22.1, fixed at creation)."""

    @property
    def key(self) -> bytes:
        return conversation_key(self.tenant_id, self.group_id)


ConversationRequest: TypeAlias = (
    SendRequest
    | PullHistoryRequest
    | AmendRequest
    | PullMembersRequest
    | CreateGroupRequest
    | LeaveGroupRequest
    | AdminGroupRequest
    | ReactRequest
    | PullReactionsRequest
    | TypingRequest
    | RtcSignalRequest
)
"""Every kind of the conversation-requests topic. Add a kind: a ``_Record`` subclass with its own
``tag`` here; old consumers reject an unknown tag, so deploy consumers before producers."""


class AdminReply(_Record, tag="admin_reply", kw_only=True, frozen=True):
    """The answer to an :class:`AdminGroupRequest`, on ``qim.admin-replies`` (key ``node_id``)."""

    node_id: str
    correlation_id: str
    error: Error | None = None
    membership_version: U64 = 0
    member_count: U32 = 0
    # A RoomWriter's answer to a room promotion (spec 14.4): the room's online members.
    member_ids: tuple[str, ...] = ()

    @property
    def key(self) -> bytes:
        return self.node_id.encode("utf-8")


class WriterReply(_Record, tag="reply", kw_only=True, frozen=True):
    """A reply to one request, for the gateway owning ``connection_shard`` to write as a frame.

    Exactly one of ``send_ack`` / ``error`` / ``history`` / ``members`` / ``reaction_update`` /
    ``reaction_list`` is set (checked on construction and on decode).
    """

    tenant_id: str
    user_id: str
    device_id: str
    session_epoch: U64
    connection_shard: U32
    request_id: U32
    send_ack: SendAck | None = None
    error: Error | None = None
    history: HistoryBatch | None = None
    members: MemberListBatch | None = None
    reaction_update: ReactionUpdate | None = None
    reaction_list: ReactionList | None = None

    def __post_init__(self) -> None:
        if sum(b is not None for b in self._bodies()) != 1:
            raise ValueError(
                "a WriterReply carries exactly one of send_ack, error, history, members,"
                " reaction_update and reaction_list"
            )

    def _bodies(
        self,
    ) -> tuple[
        SendAck | None,
        Error | None,
        HistoryBatch | None,
        MemberListBatch | None,
        ReactionUpdate | None,
        ReactionList | None,
    ]:
        return (
            self.send_ack,
            self.error,
            self.history,
            self.members,
            self.reaction_update,
            self.reaction_list,
        )

    @property
    def body(
        self,
    ) -> SendAck | Error | HistoryBatch | MemberListBatch | ReactionUpdate | ReactionList:
        """The frame body the gateway writes to the connection."""
        for b in self._bodies():
            if b is not None:
                return b
        raise AssertionError("unreachable: checked in __post_init__")

    @property
    def key(self) -> bytes:
        return user_key(self.tenant_id, self.user_id)

    @property
    def partition(self) -> int:
        """The explicit to-gateway partition: the sender's ConnectionShard."""
        return self.connection_shard


def reply_for(
    request: SendRequest | _FromSession,
    *,
    send_ack: SendAck | None = None,
    error: Error | None = None,
    history: HistoryBatch | None = None,
    members: MemberListBatch | None = None,
    reaction_update: ReactionUpdate | None = None,
    reaction_list: ReactionList | None = None,
) -> WriterReply:
    """The reply to ``request``, addressed to the connection that sent it (a send names its
    sender and device; a session request its session's user and device)."""
    if isinstance(request, SendRequest):
        user_id, device_id = request.sender_id, request.sender_device_id
    else:
        user_id, device_id = request.user_id, request.device_id
    return WriterReply(
        tenant_id=request.tenant_id,
        user_id=user_id,
        device_id=device_id,
        session_epoch=request.session_epoch,
        connection_shard=request.connection_shard,
        request_id=request.request_id,
        send_ack=send_ack,
        error=error,
        history=history,
        members=members,
        reaction_update=reaction_update,
        reaction_list=reaction_list,
    )


GatewayRecord: TypeAlias = WriterReply
"""Every kind this module puts on ``qim.to-gateway``; the mailbox app's PushBatch is another."""

_REQUEST_DECODER: msgspec.msgpack.Decoder[ConversationRequest] = msgspec.msgpack.Decoder(
    ConversationRequest
)
_REPLY_DECODER: msgspec.msgpack.Decoder[GatewayRecord] = msgspec.msgpack.Decoder(GatewayRecord)
_ADMIN_DECODER: msgspec.msgpack.Decoder[AdminReply] = msgspec.msgpack.Decoder(AdminReply)
_ENCODER = msgspec.msgpack.Encoder()


def encode_record(record: msgspec.Struct) -> bytes:
    """msgpack bytes of any record of this package (deterministic: struct field order)."""
    return _ENCODER.encode(record)


def decode_conversation_request(data: bytes) -> ConversationRequest:
    """Decode a conversation-requests value; raises ``msgspec.ValidationError`` if malformed."""
    return _REQUEST_DECODER.decode(data)


def decode_writer_reply(data: bytes) -> GatewayRecord:
    """Decode a to-gateway value written by the ConversationWriter."""
    return _REPLY_DECODER.decode(data)


def decode_admin_reply(data: bytes) -> AdminReply:
    """Decode a ``qim.admin-replies`` value."""
    return _ADMIN_DECODER.decode(data)
