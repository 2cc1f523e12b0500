"""Chatroom records (spec 14): gateway <-> RoomWriter, the Room Log, room definitions.

Topics (``qim.streams.topics``):

* ``qim.room-requests`` (key ``(tenant, room_id)``, explicit partition = ``room_partition``):
  the ConnectionNode's :class:`RoomJoinRequest`, :class:`RoomReplayRequest`,
  :class:`RoomSendRequest` (a SEND_MESSAGE into an ``r:`` id) and :class:`RoomTargetRequest`
  (register / renew / deregister a ConnectionShard as a broadcast target);
* ``qim.to-gateway`` (explicit partition = the ConnectionShard): the RoomWriter's
  :class:`RoomReply` (to the connection that asked, by ``conn_id`` and ``session_epoch``) and
  :class:`RoomBroadcast` (one per ConnectionShard with a member, never one per connection);
* ``qim.room-log`` (same partitions as the requests, time retention
  ``room_log_retention_minutes``): every :class:`RoomRecord`, written before it is broadcast;
* ``qim.rooms`` (compacted, one partition): :class:`RoomDefinition` per room, a null value
  deletes it. A room exists iff it has a definition; who may enter is its policy.

Identity fields come from the authenticated session, never from a frame (20.1). Tagged
msgpack maps, defaults omitted, unknown fields ignored, like every other record.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import msgspec

from qim.schemas.frames.base import U8, U16, U32, U64, U128, U128_ZERO
from qim.schemas.frames.connection import Error
from qim.schemas.frames.messaging import SendAck, SendMessage
from qim.schemas.frames.room import RoomBatch, RoomEvent
from qim.schemas.hashing import hash_input
from qim.schemas.records.requests import AdminReplyTo

__all__ = [
    "ROOM_TO_GATEWAY_KINDS",
    "ReplyAction",
    "RoomBroadcast",
    "RoomDefinition",
    "RoomJoinRequest",
    "RoomPromoteRequest",
    "RoomRecord",
    "RoomReplayRequest",
    "RoomReply",
    "RoomRequest",
    "RoomSendRequest",
    "RoomTargetRequest",
    "decode_room_definition",
    "decode_room_record",
    "decode_room_request",
    "decode_room_to_gateway",
    "encode_room_record",
    "room_key",
]


def room_key(tenant_id: str, room_id: str) -> bytes:
    """Kafka key of the room topics: ``tenant 0x00 room_id``."""
    return hash_input(tenant_id, room_id)


class _Record(
    msgspec.Struct,
    kw_only=True,
    omit_defaults=True,
    frozen=True,
    forbid_unknown_fields=False,
    tag_field="kind",
):
    """Tagged msgpack map."""


class _FromConnection(_Record, kw_only=True, frozen=True):
    """Who asks (from the session) and where the answer goes."""

    tenant_id: str
    user_id: str
    device_id: str
    session_epoch: U64
    connection_shard: U32
    conn_id: str
    request_id: U32
    room_id: str

    @property
    def key(self) -> bytes:
        return room_key(self.tenant_id, self.room_id)


class RoomJoinRequest(_FromConnection, tag="room_join", kw_only=True, frozen=True):
    """ROOM_JOIN: check the room and the user, register the shard, answer the positions."""

    after_room_seq: U64 | None = None


class RoomReplayRequest(_FromConnection, tag="room_replay", kw_only=True, frozen=True):
    """ROOM_REPLAY{after_room_seq} of a connection that is a member (the gateway checked)."""

    after_room_seq: U64 = 0


class RoomSendRequest(_FromConnection, tag="room_send", kw_only=True, frozen=True):
    """A SEND_MESSAGE whose ``conversation_id`` is the room id; ``message`` unchanged.
    ``received_at_ms``: when the gateway read the frame (``room_msg_rate`` judges the client's
    pace, not the clumping of the pipeline behind it)."""

    message: SendMessage
    received_at_ms: U64 = 0


class RoomTargetRequest(_Record, tag="room_target", kw_only=True, frozen=True):
    """The ConnectionShard has members in the room (``present``: register / renew) or not."""

    tenant_id: str
    room_id: str
    connection_shard: U32
    present: bool = True
    user_ids: tuple[str, ...] = ()  # the users of the shard's member connections (all of them)

    @property
    def key(self) -> bytes:
        return room_key(self.tenant_id, self.room_id)


class RoomPromoteRequest(_Record, tag="room_promote", kw_only=True, frozen=True):
    """The admin plane promotes the room to ``group_id`` (14.4): the RoomWriter stops the
    room's ``room_seq`` allocation and answers its online members on ``qim.admin-replies``."""

    tenant_id: str
    room_id: str
    group_id: str
    reply_to: AdminReplyTo

    @property
    def key(self) -> bytes:
        return room_key(self.tenant_id, self.room_id)


RoomRequest: TypeAlias = (
    RoomJoinRequest | RoomReplayRequest | RoomSendRequest | RoomTargetRequest | RoomPromoteRequest
)

ReplyAction = Literal["join", "replay", "send"]


class RoomReply(_Record, tag="room_reply", kw_only=True, frozen=True):
    """The RoomWriter's answer to one request of one connection (exactly one body set)."""

    tenant_id: str
    user_id: str
    device_id: str
    session_epoch: U64
    connection_shard: U32
    conn_id: str
    request_id: U32
    room_id: str
    action: ReplyAction
    batch: RoomBatch | None = None
    send_ack: SendAck | None = None
    error: Error | None = None

    @property
    def body(self) -> RoomBatch | SendAck | Error:
        body = self.batch or self.send_ack or self.error
        if body is None:
            raise ValueError("RoomReply without a body")
        return body


class RoomBroadcast(_Record, tag="room_broadcast", kw_only=True, frozen=True):
    """New events of one room for one ConnectionShard, with the room's positions."""

    tenant_id: str
    room_id: str
    room_epoch: U16
    connection_shard: U32
    events: tuple[RoomEvent, ...]
    latest_room_seq: U64
    earliest_replay_room_seq: U64
    sent_at_ms: U64 = 0  # RoomWriter wall time at allocation (room_broadcast_latency, 24.1.10)


ROOM_TO_GATEWAY_KINDS = frozenset({"room_reply", "room_broadcast"})

RoomToGateway: TypeAlias = RoomReply | RoomBroadcast


class RoomRecord(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """The 7.12 RoomRecord as written to ``qim.room-log``."""

    tenant_id: str
    room_id: str
    room_epoch: U16
    room_seq: U64
    message_id: U128 = U128_ZERO
    sender_id: str = ""
    message_type: U8 = 0
    payload: bytes = b""
    created_at: U64 = 0
    client_message_id: str = ""


class RoomDefinition(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """A room of a tenant. ``allowed_users`` empty: every user of the tenant may enter;
    otherwise only those. ``banned_users`` may never enter (nor send)."""

    tenant_id: str
    room_id: str
    allowed_users: tuple[str, ...] = ()
    banned_users: tuple[str, ...] = ()

    @property
    def key(self) -> bytes:
        return room_key(self.tenant_id, self.room_id)

    def admits(self, user_id: str) -> bool:
        if user_id in self.banned_users:
            return False
        return not self.allowed_users or user_id in self.allowed_users


_REQUESTS: msgspec.msgpack.Decoder[RoomRequest] = msgspec.msgpack.Decoder(RoomRequest)
_TO_GATEWAY: msgspec.msgpack.Decoder[RoomToGateway] = msgspec.msgpack.Decoder(RoomToGateway)
_LOG = msgspec.msgpack.Decoder(RoomRecord)
_DEFS = msgspec.msgpack.Decoder(RoomDefinition)
_ENCODER = msgspec.msgpack.Encoder()


def encode_room_record(record: msgspec.Struct) -> bytes:
    """Any record of this module as its topic value."""
    return _ENCODER.encode(record)


def decode_room_request(data: bytes) -> RoomRequest:
    return _REQUESTS.decode(data)


def decode_room_to_gateway(data: bytes) -> RoomToGateway:
    return _TO_GATEWAY.decode(data)


def decode_room_record(data: bytes) -> RoomRecord:
    return _LOG.decode(data)


def decode_room_definition(data: bytes) -> RoomDefinition:
    return _DEFS.decode(data)
