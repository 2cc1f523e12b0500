"""PushBatch and PresenceStale: the two internal frames of online delivery, as Kafka records.

Neither ever reaches a client socket (spec 11.1, A.6; their opcodes are only reserved in
``frames.opcodes.INTERNAL_OPCODES``).

**PushBatch** (MailboxNode -> ConnectionNode, spec 11.1) on ``qim.to-gateway``, **explicit
partition = connection_shard**, tagged ``kind="push_batch"`` so it shares the topic with
:class:`~qim.schemas.records.requests.WriterReply` (``kind="reply"``); decode the topic with
:func:`decode_to_gateway`. Exactly one batch per (message, ConnectionShard) (I-19). The message
coordinates sit once at the top, the body is ``common_encoded_body``: the A.4.1 body part
(:class:`PushBody`) encoded ONCE per message by the MailboxNode and shared by every batch and
recipient of that message; ``recipients[]`` are the light per-device headers of spec 11.1,
addressed by the presence cache's ``connection_id`` / ``session_epoch`` (5.4). Kafka key:
``(tenant, conversation_id)`` -- a batch names many users, and the partition is explicit anyway.

Fields beyond the spec's 11.1 listing, and why:

* ``connection_shard`` / ``mailbox_shard``: the partition (like ``WriterReply``), and where a
  PRESENCE_STALE must go back -- echoing the sender's shard reaches the node holding the stale
  cache even while a split changes the bucket -> shard map (5.5);
* ``created_at``: the expansion of 11.1.1 writes it on every event, and it is per message;
* ``target_message_id`` / ``target_conversation_seq``: A.4.1 fields of CONTROL events that
  are the same for every recipient (the per-recipient ``target_*`` stay in the header);
* ``priority``: 11.1 makes the *channel* the priority (five MailboxNode -> ConnectionNode
  channels). direction.md 3 puts every batch on the one to-gateway topic, so the record has to
  carry it; the ConnectionNode needs it for the 11.3.3 drop order (large group before small
  group before 1:1). Values are ``frame_priority``'s own names.

No lane watermark rides along: PONG carries none (6.10.1, 15.1.1) and the only gap test is
``last_pushed_user_seq``, which is the recipient's own ``mailbox_seq``.

**PushEvidence** and **ConnClosed** (ConnectionNode -> MailboxNode, 16.1.2) ride
``qim.user-requests`` the same way and for the same reasons as PresenceStale below: they are
hints for the MailboxNode's second check, lost ones cost at most an extra push.

**PresenceStale** (ConnectionNode -> MailboxNode, 5.4.3 (1), 11.1.1) on ``qim.user-requests``
(explicit partition = the user's mailbox shard, delete policy, short retention), tagged
``kind="presence_stale"``. Not the presence topic: it is compacted by ``(tenant, user,
device)``, so a stale report there would replace that device's *newer* PresenceEntry on
compaction (a reconnect writes the new epoch first, the late report of the old one lands after
it) and a rebuild would read the device as offline -- the false negative 5.4.3 forbids -- and
every PresenceEntry reader would meet a second value type. Not the dispatch log either: that
is the mailbox store's changelog (direction.md 3, 4.2) and replay must not see cache hints.
user-requests already runs gateway -> the owning MailboxNode on the right partition, and a lost
report costs nothing durable (the 60 s reconcile and the lease catch it).

Values are msgpack maps, defaults omitted, unknown keys ignored (spec 27.2.1).
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

import msgspec

from qim.schemas.frames.base import U8, U32, U64, U128
from qim.schemas.frames.mailbox import MediaMetadata
from qim.schemas.hashing import hash_input, validate_identifier
from qim.schemas.records.requests import WriterReply, user_key

__all__ = [
    "STALE_EPOCH_MISMATCH",
    "STALE_UNKNOWN_CONNECTION",
    "ConnClosed",
    "DeviceEvidence",
    "FramePriority",
    "PresenceStale",
    "PushBatch",
    "PushBody",
    "PushEvidence",
    "PushRecipient",
    "ToGatewayRecord",
    "decode_presence_stale",
    "decode_push_body",
    "decode_to_gateway",
    "encode_push_body",
    "encode_push_record",
    "push_batch_key",
]

FramePriority: TypeAlias = Literal["direct", "small_group", "large_group"]
"""The push classes of ``frame_priority`` (B.5); control and chatroom never ride a PushBatch."""

STALE_UNKNOWN_CONNECTION: Final = "unknown_connection"  # 11.1.1 rule 1
STALE_EPOCH_MISMATCH: Final = "epoch_mismatch"  # 11.1.1 rule 2


class _Record(
    msgspec.Struct,
    kw_only=True,
    omit_defaults=True,
    frozen=True,
    forbid_unknown_fields=False,
    tag_field="kind",
):
    """Tagged msgpack map, like ``requests._Record``: one topic may carry several kinds."""


class PushBody(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """The A.4.1 read-time-joined body part, with SyncEntry's own field names.

    Its encoding is ``PushBatch.common_encoded_body``. The names match :class:`SyncEntry` so
    the ConnectionNode can splice these map pairs into each event without decoding them.
    """

    message_type: U8 | None = None
    custom_type: str | None = None
    schema_version: U32 | None = None
    payload_or_ciphertext: bytes | None = None
    media_metadata: MediaMetadata | None = None


class PushRecipient(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """One device's light header (spec 11.1 ``recipients[]``): where to write, what differs.

    ``client_message_id`` is set on the sender's own entry only (7.3 echo dedup);
    ``origin_device_id`` only on CONTROL events (7.3); ``target_*`` only on CONTROL events of
    recall / edit / moderation delete, computed per recipient (12.5.5). ``event_type`` is not
    carried: it equals ``event_ordinal`` (6.7, 11.1.1).
    """

    connection_id: str
    session_epoch: U64
    user_id: str
    device_id: str
    mailbox_seq: U64
    event_ordinal: U8 = 0
    event_id: U64 = 0
    flags: U8 = 0
    mention_type: U8 = 0
    visibility_floor_conversation_seq: U64 = 0
    client_message_id: str | None = None
    origin_device_id: str | None = None
    target_sender_id: str | None = None
    target_flags: U8 | None = None
    target_mention_type: U8 | None = None


class PushBatch(_Record, tag="push_batch", kw_only=True, frozen=True):
    """One message for every online device on one ConnectionShard (spec 11.1, I-19)."""

    tenant_id: str
    connection_shard: U32
    mailbox_shard: U32
    message_id: U128
    conversation_id: str
    conversation_seq: U64
    last_activity_id: U128
    sender_id: str
    created_at: U64
    priority: FramePriority = "direct"
    target_message_id: U128 | None = None
    target_conversation_seq: U64 | None = None
    body_included: bool = False
    common_encoded_body: bytes = b""
    recipients: tuple[PushRecipient, ...] = ()

    @property
    def key(self) -> bytes:
        return push_batch_key(self.tenant_id, self.conversation_id)

    @property
    def partition(self) -> int:
        """The explicit to-gateway partition: the target ConnectionShard."""
        return self.connection_shard


class PresenceStale(_Record, tag="presence_stale", kw_only=True, frozen=True):
    """PRESENCE_STALE: a recipient the ConnectionNode could not write to (5.4.3 (1), 11.1.1).

    ``observed_epoch`` is the session_epoch the PushBatch carried (5.4.3's name); the
    MailboxNode drops its cache entry for the device if that entry's epoch is <= it.
    ``reason`` is :data:`STALE_UNKNOWN_CONNECTION` or :data:`STALE_EPOCH_MISMATCH` (a plain
    string, so a newer reason still decodes). ``mailbox_shard`` is the batch's own.
    """

    tenant_id: str
    user_id: str
    device_id: str
    connection_id: str
    observed_epoch: U64
    reason: str
    mailbox_shard: U32

    @property
    def key(self) -> bytes:
        return user_key(self.tenant_id, self.user_id)

    @property
    def partition(self) -> int:
        """The explicit user-requests partition: the MailboxShard that sent the batch."""
        return self.mailbox_shard


class DeviceEvidence(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """One device's 16.1.2 evidence since the gateway's last report (maxima, never a list).

    ``pushed_seq``: the largest ``mailbox_seq`` whose PUSH_EVENTS frame left this connection's
    send buffer into the socket (PUSHED, "in the send buffer, not proof of arrival").
    ``applied_seq``: the largest ``PING.last_applied_mailbox_seq`` / ``PULL_MAILBOX.acked_seq``
    the device sent (APPLIED; cursors are per device, never borrowed from another one).
    ``delivered_seq``: the largest ``mailbox_seq`` PUSHED whose bytes the peer's TCP has since
    acknowledged (the kernel's send queue drained): 16.1.2's "the connection is still alive,
    the peer kernel acked the data", which lets the extended window end without a push.
    0 = nothing new of that kind."""

    user_id: str
    device_id: str
    session_epoch: U64
    pushed_seq: U64 = 0
    applied_seq: U64 = 0
    delivered_seq: U64 = 0


class PushEvidence(_Record, tag="push_evidence", kw_only=True, frozen=True):
    """PUSHED / APPLIED evidence (16.1.2) of one tenant's devices of one MailboxShard,
    coalesced by the ConnectionNode per flush (``push_evidence_flush_ms``): ConnectionNode ->
    MailboxNode on ``qim.user-requests`` at the explicit partition ``mailbox_shard``, like
    PRESENCE_STALE (the module doc says why not the presence topic nor the dispatch log)."""

    tenant_id: str
    mailbox_shard: U32
    devices: tuple[DeviceEvidence, ...]

    @property
    def key(self) -> bytes:
        return user_key(self.tenant_id, self.devices[0].user_id if self.devices else "-")

    @property
    def partition(self) -> int:
        return self.mailbox_shard


class ConnClosed(_Record, tag="conn_closed", kw_only=True, frozen=True):
    """CONN_CLOSED{device_id, session_epoch, last_pushed_user_seq} (16.1.2, INV-50): sent on
    every close path of an authenticated connection, clean or not. ``applied_seq`` is the
    device's last APPLIED evidence on this connection (the evidence still buffered for it rides
    here, so nothing is reordered behind the close); ``sync_to_seq`` is the login's
    AUTH_OK.sync_to_seq (entries up to it reached the device by its login pull, not by push);
    ``connection_id`` is informational."""

    tenant_id: str
    user_id: str
    device_id: str
    session_epoch: U64
    last_pushed_user_seq: U64
    applied_seq: U64 = 0
    sync_to_seq: U64 = 0
    connection_id: str = ""
    reason: str = ""
    mailbox_shard: U32

    @property
    def key(self) -> bytes:
        return user_key(self.tenant_id, self.user_id)

    @property
    def partition(self) -> int:
        return self.mailbox_shard


ToGatewayRecord: TypeAlias = WriterReply | PushBatch
"""Every kind on ``qim.to-gateway`` (requests.GatewayRecord plus the MailboxNode's PushBatch)."""

_ENCODER: Final = msgspec.msgpack.Encoder()
_TO_GATEWAY: msgspec.msgpack.Decoder[ToGatewayRecord] = msgspec.msgpack.Decoder(ToGatewayRecord)
_STALE: Final = msgspec.msgpack.Decoder(PresenceStale)
_BODY: Final = msgspec.msgpack.Decoder(PushBody)


def push_batch_key(tenant_id: str, conversation_id: str) -> bytes:
    """Kafka key of a PushBatch: ``tenant 0x00 conversation`` (metadata; the partition is
    explicit)."""
    validate_identifier(tenant_id, "tenant_id")
    validate_identifier(conversation_id, "conversation_id")
    return hash_input(tenant_id, conversation_id)


def encode_push_record(record: PushBatch | PresenceStale | PushEvidence | ConnClosed) -> bytes:
    return _ENCODER.encode(record)


def encode_push_body(body: PushBody) -> bytes:
    """The ``common_encoded_body`` bytes of one message (call it once per message, 10.3)."""
    return _ENCODER.encode(body)


def decode_push_body(data: bytes) -> PushBody:
    return _BODY.decode(data)


def decode_to_gateway(data: bytes) -> ToGatewayRecord:
    """Decode a ``qim.to-gateway`` value of either kind; raises ``msgspec.ValidationError``."""
    return _TO_GATEWAY.decode(data)


def decode_presence_stale(data: bytes) -> PresenceStale:
    return _STALE.decode(data)
