"""``MessageRecord`` (spec 7.1, Part 2): the stored value under a message key, and its wire form.

Why a msgpack map with defaults omitted (like frame bodies): the record is written once by the
HistoryArchiver and rewritten only by recall/edit/delete (spec 13.4.1 step 3), so compactness
and forward compatibility (unknown keys skipped) matter more than anything else. Encoding is
deterministic (struct field order), so replaying the outbox rewrites identical bytes.

The state changes are pure functions returning a new record. RECALLED and DELETED records keep
their body in the store (governance, compliance hold) but :func:`to_history_message` never
serves it: the client renders "recalled" / the placeholder from ``state`` alone.
"""

from __future__ import annotations

from typing import Final

import msgspec

from qim.schemas.frames.base import U8, U32, U64, U128, U128_ZERO, EntryFlags
from qim.schemas.frames.history import HistoryMessage
from qim.schemas.frames.mailbox import MediaMetadata
from qim.schemas.records.outbox import MESSAGE_FLAGS

__all__ = [
    "DekId",
    "MessageRecord",
    "MessageState",
    "decode_message_record",
    "encode_message_record",
    "mark_deleted",
    "mark_edited",
    "mark_recalled",
    "on_timeline",
    "to_history_message",
]


class MessageState:
    """``MessageRecord.state`` words (spec Part 2)."""

    NORMAL: Final = "NORMAL"
    RECALLED: Final = "RECALLED"
    EDITED: Final = "EDITED"
    DELETED: Final = "DELETED"


_BODY_HIDDEN = frozenset({MessageState.RECALLED, MessageState.DELETED})


class DekId(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """``dek_id (key_scope, key_id, key_version)`` of spec 21.3."""

    key_scope: str
    key_id: str
    key_version: U32 = 0


class MessageRecord(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """One message of a conversation (spec 7.1); key ``(tenant, conversation, seq)``."""

    tenant_id: str
    conversation_id: str
    seq_bucket: U64 = 0
    conversation_seq: U64
    message_id: U128
    last_activity_id: U128 = U128_ZERO
    sender_id: str
    sender_device_id: str = ""
    client_message_id: str | None = None
    message_type: U8 = 0
    custom_type: str | None = None
    schema_version: U32 | None = None
    payload_or_ciphertext: bytes = b""
    media_metadata: MediaMetadata | None = None
    reply_to_conversation_seq: U64 | None = None
    mention_targets: tuple[str, ...] = ()
    state: str = MessageState.NORMAL
    recall_event_conversation_seq: U64 | None = None
    edited_at_activity_id: U128 | None = None
    created_at: U64 = 0
    retention_class: str = "default"
    dek_id: DekId | None = None
    flags: U8 = MESSAGE_FLAGS
    """A non-sender's entry flags of the message, from its commit record (spec 13.3): a
    ``timeline_visible=false`` message is stored but never served as history, and a recall's
    ``target_flags`` are these. Default omitted: rows of ordinary messages keep their bytes."""


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(MessageRecord)


def encode_message_record(record: MessageRecord) -> bytes:
    """The stored value bytes."""
    return _ENCODER.encode(record)


def decode_message_record(data: bytes) -> MessageRecord:
    """Inverse of :func:`encode_message_record`."""
    return _DECODER.decode(data)


def mark_recalled(record: MessageRecord, event_seq: int) -> MessageRecord:
    """Spec 13.4.1 step 3 for RECALL: state and the recall event's coordinate."""
    return msgspec.structs.replace(
        record, state=MessageState.RECALLED, recall_event_conversation_seq=event_seq
    )


def mark_deleted(record: MessageRecord, event_seq: int) -> MessageRecord:
    """Governance delete (spec 13.4.3): like a recall, rendered differently by clients."""
    return msgspec.structs.replace(
        record, state=MessageState.DELETED, recall_event_conversation_seq=event_seq
    )


def mark_edited(
    record: MessageRecord, event_seq: int, payload: bytes, edited_at_activity_id: bytes
) -> MessageRecord:
    """Spec 13.4.1 step 3 for EDIT: new payload, ``edited_at_activity_id``, the event seq.

    A recalled or deleted message stays so: an edit that lost the race changes nothing.
    """
    if record.state in _BODY_HIDDEN:
        return record
    return msgspec.structs.replace(
        record,
        state=MessageState.EDITED,
        recall_event_conversation_seq=event_seq,
        payload_or_ciphertext=payload,
        edited_at_activity_id=edited_at_activity_id,
    )


def on_timeline(record: MessageRecord) -> bool:
    """Whether PULL_HISTORY serves the row: not for a ``timeline_visible=false`` type (13.3)."""
    return bool(record.flags & EntryFlags.TIMELINE_VISIBLE)


def to_history_message(record: MessageRecord) -> HistoryMessage:
    """The HISTORY_BATCH item: server-only columns dropped, hidden bodies withheld."""
    hidden = record.state in _BODY_HIDDEN
    return HistoryMessage(
        conversation_seq=record.conversation_seq,
        message_id=record.message_id,
        last_activity_id=record.last_activity_id,
        sender_id=record.sender_id,
        sender_device_id=record.sender_device_id,
        client_message_id=record.client_message_id,
        message_type=record.message_type,
        custom_type=record.custom_type,
        schema_version=record.schema_version,
        payload_or_ciphertext=None if hidden else record.payload_or_ciphertext or None,
        media_metadata=None if hidden else record.media_metadata,
        reply_to_conversation_seq=record.reply_to_conversation_seq,
        mention_targets=record.mention_targets,
        state=record.state,
        recall_event_conversation_seq=record.recall_event_conversation_seq,
        edited_at_activity_id=record.edited_at_activity_id,
        created_at=record.created_at,
    )
