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
actor), so members see creates, joins and leaves in history (an earlier chunk of a large create
has no seq and writes nothing).
A :class:`MessageAmended` (RECALL / EDIT / delete, spec 13.4.1) writes two rows: (a) its own
CONTROL message at its own seq (``custom_type = qim.amend.v1``, payload = the documented
:class:`AmendControl` map, sender = the actor), so REBUILD by seq finds it; (b) step 3, the
target rewritten with ``mark_recalled`` / ``mark_edited`` / ``mark_deleted`` at the event's
seq. (b) reads the target: first this batch's own writes, then the store (``read``); a target
that is gone (retention) or is another message (a foreign log) is left alone. Applied in log
order the result is a function of the log, so live, redelivered and replayed batches converge.

Reactions (spec 13.6, 7.15; layout in ``qim.core.reactions.store``): a :class:`MessageReacted`
writes the message's ``MessageReactionSummary`` (a blind put of the record's absolute result) and
puts or deletes the reactor's ``MessageReaction`` row; a RECALL / delete of a target physically
deletes its summary and every detail row (13.6.4), listing them with ``keys_under`` (this
batch's own rows first, then the store). A write with ``value`` None is a delete.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

import msgspec

from qim.core.history.keys import message_key
from qim.core.history.records import (
    MessageRecord,
    decode_message_record,
    encode_message_record,
    mark_deleted,
    mark_edited,
    mark_recalled,
)
from qim.core.history.store import OrderedWriter
from qim.core.reactions.store import reaction_writes, removal_writes
from qim.schemas.frames.base import U64, U128
from qim.schemas.records.membership import (
    MEMBERSHIP_CUSTOM_TYPE,
    MESSAGE_TYPE_CONTROL,
    MembershipCommitted,
    control_of,
    encode_control,
)
from qim.schemas.records.outbox import (
    AmendAction,
    MessageAmended,
    MessageCommitted,
    MessageReacted,
    OutboxRecord,
)
from qim.schemas.seqs import DEFAULT_MESSAGE_SEQ_BUCKET_WIDTH, seq_bucket

__all__ = [
    "AMEND_CUSTOM_TYPE",
    "AmendControl",
    "ArchiveWrite",
    "amend_control_record",
    "archive_batch",
    "control_message_record",
    "message_record",
    "write_all",
]


AMEND_CUSTOM_TYPE: Final = "qim.amend.v1"
"""``custom_type`` of a recall / edit / delete CONTROL message (``message_type`` 0xFF)."""


class AmendControl(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=False):
    """Payload of a ``qim.amend.v1`` CONTROL message: a msgpack map of these three keys.

    ``action`` is ``recall`` / ``edit`` / ``delete``; the target is named by both coordinates
    (an edit's new body is in the target's row, never copied here).
    """

    action: AmendAction
    target_conversation_seq: U64
    target_message_id: U128


_ENCODER = msgspec.msgpack.Encoder()

Reader = Callable[[bytes], bytes | None]
"""Point read of the MessageStore (the target row of an amend)."""

KeysUnder = Callable[[bytes], Iterable[bytes]]
"""The MessageStore's keys under a prefix (a recalled message's reaction rows)."""


@dataclass(frozen=True, slots=True)
class ArchiveWrite:
    """One blind put into the MessageStore, or a delete when ``value`` is None."""

    key: bytes
    value: bytes | None


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
        flags=msg.flags,
        schema_version=msg.schema_version or None,
    )


def control_message_record(
    record: MembershipCommitted, *, bucket_width: int = DEFAULT_MESSAGE_SEQ_BUCKET_WIDTH
) -> MessageRecord | None:
    """The CONTROL message of a membership change; None for an earlier create chunk (no seq)."""
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


def amend_control_record(
    record: MessageAmended, *, bucket_width: int = DEFAULT_MESSAGE_SEQ_BUCKET_WIDTH
) -> MessageRecord:
    """The CONTROL message of an amend, at its own seq (module docstring (a))."""
    control = AmendControl(
        action=record.action,
        target_conversation_seq=record.target_conversation_seq,
        target_message_id=record.target_message_id,
    )
    return MessageRecord(
        tenant_id=record.tenant_id,
        conversation_id=record.conversation_id,
        seq_bucket=seq_bucket(record.conversation_seq, bucket_width),
        conversation_seq=record.conversation_seq,
        message_id=record.message_id,
        last_activity_id=record.last_activity_id,
        sender_id=record.sender_id,
        sender_device_id=record.origin_device_id,
        message_type=MESSAGE_TYPE_CONTROL,
        custom_type=AMEND_CUSTOM_TYPE,
        payload_or_ciphertext=_ENCODER.encode(control),
        created_at=record.committed_at,
    )


def amended_target(record: MessageAmended, target: MessageRecord) -> MessageRecord:
    """Spec 13.4.1 step 3 on the target row (module docstring (b))."""
    seq = record.conversation_seq
    if record.action == "recall":
        return mark_recalled(target, seq)
    if record.action == "delete":
        return mark_deleted(target, seq)
    return mark_edited(target, seq, record.new_payload, record.last_activity_id)


def archive_batch(
    records: Iterable[OutboxRecord],
    *,
    read: Reader | None = None,
    keys_under: KeysUnder | None = None,
    bucket_width: int = DEFAULT_MESSAGE_SEQ_BUCKET_WIDTH,
) -> list[ArchiveWrite]:
    """The writes of one outbox batch, in log order (a later write of a key wins).

    ``read`` is the store the batch lands in, for the targets of amends (None: targets
    outside this batch are not rewritten; only tests and tools without a store pass None);
    ``keys_under`` lists its keys under a prefix, for the reaction rows a recall deletes.
    """
    writes: list[ArchiveWrite] = []
    written: dict[bytes, bytes | None] = {}

    def present(prefix: bytes) -> list[bytes]:
        stored = set(keys_under(prefix)) if keys_under is not None else set()
        for key, value in written.items():
            if key.startswith(prefix):
                if value is None:
                    stored.discard(key)
                else:
                    stored.add(key)
        return sorted(stored)

    def store(write: ArchiveWrite) -> None:
        writes.append(write)
        written[write.key] = write.value

    def put(stored: MessageRecord) -> None:
        key = message_key(stored.tenant_id, stored.conversation_id, stored.conversation_seq)
        value = encode_message_record(stored)
        store(ArchiveWrite(key, value))

    for record in records:
        if isinstance(record, MembershipCommitted):
            stored = control_message_record(record, bucket_width=bucket_width)
            if stored is not None:
                put(stored)
        elif isinstance(record, MessageAmended):
            put(amend_control_record(record, bucket_width=bucket_width))
            key = message_key(
                record.tenant_id, record.conversation_id, record.target_conversation_seq
            )
            raw = written.get(key)
            if raw is None and read is not None:
                raw = read(key)
            if raw is None:
                continue
            target = decode_message_record(raw)
            if target.message_id == record.target_message_id:
                put(amended_target(record, target))
                if record.action in ("recall", "delete"):  # 13.6.4: aggregate and detail go
                    seq = record.target_conversation_seq
                    for w in removal_writes(record.tenant_id, record.conversation_id, seq, present):
                        store(ArchiveWrite(w.key, w.value))
        elif isinstance(record, MessageReacted):
            for w in reaction_writes(record):
                store(ArchiveWrite(w.key, w.value))
        else:
            put(message_record(record, bucket_width=bucket_width))
    return writes


def write_all(store: OrderedWriter, writes: Iterable[ArchiveWrite]) -> None:
    """Apply writes in order (the agent does the same into one RocksDB WriteBatch)."""
    for write in writes:
        if write.value is None:
            store.delete(write.key)
        else:
            store.put(write.key, write.value)
