"""HistoryArchiver core: outbox records in, MessageStore writes out (ADR-0018, spec 7.1).

Why a pure function of the batch: the archiver consumes the outbox independently, writes a
whole batch (``history_archive_batch_max``) and only then commits its offset. After a crash it
re-reads the batch and writes the same bytes again -- every write is a blind put of a value that
depends only on the record, so at-least-once redelivery converges. Applied in log order, a
later recall/edit of a message (``mark_recalled`` / ``mark_edited``) always lands after the
message's own write, so a replayed suffix converges to the same state too.

Inputs: a :class:`MessageCommitted` becomes its MessageRecord; a
:class:`MembershipCommitted` with a seq becomes its CONTROL message (``custom_type =
qim.membership.v1``, payload = the documented :class:`MembershipControl` map, sender = the
actor), so members see joins and leaves in history. A create occupies no seq and writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from qim.core.history.keys import message_key
from qim.core.history.records import MessageRecord, encode_message_record
from qim.core.history.store import OrderedWriter
from qim.schemas.records.membership import (
    MEMBERSHIP_CUSTOM_TYPE,
    MESSAGE_TYPE_CONTROL,
    MembershipCommitted,
    control_of,
    encode_control,
)
from qim.schemas.records.outbox import MessageCommitted
from qim.schemas.seqs import DEFAULT_MESSAGE_SEQ_BUCKET_WIDTH, seq_bucket

__all__ = [
    "ArchiveWrite",
    "archive_batch",
    "control_message_record",
    "message_record",
    "write_all",
]


@dataclass(frozen=True, slots=True)
class ArchiveWrite:
    """One blind put into the MessageStore."""

    key: bytes
    value: bytes


def message_record(
    msg: MessageCommitted, *, bucket_width: int = DEFAULT_MESSAGE_SEQ_BUCKET_WIDTH
) -> MessageRecord:
    """The MessageRecord of a committed message; ``created_at`` is its ``committed_at``."""
    return MessageRecord(
        tenant_id=msg.tenant_id,
        conversation_id=msg.conversation_id,
        seq_bucket=seq_bucket(msg.conversation_seq, bucket_width),
        conversation_seq=msg.conversation_seq,
        message_id=msg.message_id,
        last_activity_id=msg.last_activity_id,
        sender_id=msg.sender_id,
        sender_device_id=msg.origin_device_id,
        client_message_id=msg.client_message_id or None,
        message_type=msg.message_type,
        custom_type=msg.custom_type or None,
        payload_or_ciphertext=msg.payload,
        reply_to_conversation_seq=msg.reply_to_conversation_seq,
        mention_targets=msg.mention_targets,
        created_at=msg.committed_at,
        retention_class=msg.retention_class,
    )


def control_message_record(
    record: MembershipCommitted, *, bucket_width: int = DEFAULT_MESSAGE_SEQ_BUCKET_WIDTH
) -> MessageRecord | None:
    """The CONTROL message of a membership change; None for a create (it uses no seq)."""
    if record.conversation_seq == 0:
        return None
    return MessageRecord(
        tenant_id=record.tenant_id,
        conversation_id=record.group_id,
        seq_bucket=seq_bucket(record.conversation_seq, bucket_width),
        conversation_seq=record.conversation_seq,
        message_id=record.message_id,
        last_activity_id=record.last_activity_id,
        sender_id=record.actor,
        message_type=MESSAGE_TYPE_CONTROL,
        custom_type=MEMBERSHIP_CUSTOM_TYPE,
        payload_or_ciphertext=encode_control(control_of(record)),
        created_at=record.committed_at,
    )


def archive_batch(
    records: Iterable[MessageCommitted | MembershipCommitted],
    *,
    bucket_width: int = DEFAULT_MESSAGE_SEQ_BUCKET_WIDTH,
) -> list[ArchiveWrite]:
    """The writes of one outbox batch, in log order (a later write of a key wins)."""
    writes: list[ArchiveWrite] = []
    for record in records:
        if isinstance(record, MembershipCommitted):
            stored = control_message_record(record, bucket_width=bucket_width)
            if stored is None:
                continue
        else:
            stored = message_record(record, bucket_width=bucket_width)
        key = message_key(stored.tenant_id, stored.conversation_id, stored.conversation_seq)
        writes.append(ArchiveWrite(key, encode_message_record(stored)))
    return writes


def write_all(store: OrderedWriter, writes: Iterable[ArchiveWrite]) -> None:
    """Apply writes in order (the agent does the same into one RocksDB WriteBatch)."""
    for write in writes:
        store.put(write.key, write.value)
