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

from typing import TypeAlias

import msgspec

from qim.schemas.frames.base import U32, U64
from qim.schemas.frames.connection import Error
from qim.schemas.frames.messaging import SendAck, SendMessage
from qim.schemas.hashing import hash_input, validate_identifier

__all__ = [
    "ConversationRequest",
    "GatewayRecord",
    "SendRequest",
    "WriterReply",
    "conversation_key",
    "decode_conversation_request",
    "decode_writer_reply",
    "encode_record",
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


ConversationRequest: TypeAlias = SendRequest
"""Every kind of the conversation-requests topic. Add a kind: a ``_Record`` subclass with its own
``tag`` here (``SendRequest | RecallRequest | ...``); old consumers reject an unknown tag, so
deploy consumers before producers."""


class WriterReply(_Record, tag="reply", kw_only=True, frozen=True):
    """A reply to one request, for the gateway owning ``connection_shard`` to write as a frame.

    Exactly one of ``send_ack`` / ``error`` is set (checked on construction and on decode).
    """

    tenant_id: str
    user_id: str
    device_id: str
    session_epoch: U64
    connection_shard: U32
    request_id: U32
    send_ack: SendAck | None = None
    error: Error | None = None

    def __post_init__(self) -> None:
        if (self.send_ack is None) == (self.error is None):
            raise ValueError("a WriterReply carries exactly one of send_ack and error")

    @property
    def key(self) -> bytes:
        return user_key(self.tenant_id, self.user_id)

    @property
    def partition(self) -> int:
        """The explicit to-gateway partition: the sender's ConnectionShard."""
        return self.connection_shard


GatewayRecord: TypeAlias = WriterReply
"""Every kind this module puts on ``qim.to-gateway``; the mailbox app's PushBatch is another."""

_REQUEST_DECODER: msgspec.msgpack.Decoder[ConversationRequest] = msgspec.msgpack.Decoder(
    ConversationRequest
)
_REPLY_DECODER: msgspec.msgpack.Decoder[GatewayRecord] = msgspec.msgpack.Decoder(GatewayRecord)
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
