"""The encrypt point of spec 21.3.4: a record the writer core decided, sealed before it is
appended, so the outbox, the dispatch log, every MessageStore and every mailbox body store only
hold ciphertext (topology.md decision 44).

What is sealed: a message's ``payload`` (AAD seq = its own ``conversation_seq``) and its
session preview (``sealed_preview``, the body's first ``PREVIEW_BYTES``); an edit's
``new_payload`` (AAD seq = the *target's* seq: it becomes that message's body in every store)
and its ``preview_or_placeholder`` (the new text's preview). What is not: E2EE conversations
(decided by the conversation's E2EE flag, never by looking at the bytes: the client's
ciphertext passes through untouched), control maps (membership, recall / delete placeholders:
no body in them) and the head's :class:`PreviewPlaceholder` (a type, never a body fragment).
"""

from __future__ import annotations

from collections.abc import Collection

import msgspec

from qim.agents.keyring import BodyKeys
from qim.agents.writer.partition import PartitionWriter
from qim.core.conversation.ids import conversation_kind
from qim.core.mailbox.session_store import PREVIEW_BYTES
from qim.schemas.frames.history import HistoryBatch
from qim.schemas.message_types import MessageType
from qim.schemas.records import DIRECT, MessageAmended, MessageCommitted, OutboxRecord

__all__ = ["conversation_e2ee", "opened_history", "sealed_record"]


def conversation_e2ee(
    pw: PartitionWriter, e2ee_direct_tenants: Collection[str], tenant_id: str, conversation_id: str
) -> bool:
    """The conversation's E2EE flag as the writer state holds it (spec 22.1, decision 38)."""
    if conversation_kind(conversation_id) == DIRECT:
        head = pw.state.head(tenant_id, conversation_id)
        if head is not None:
            return bool(head.e2ee)
        return tenant_id in e2ee_direct_tenants
    group = pw.membership.group(tenant_id, conversation_id)
    return bool(group is not None and group.e2ee)


def sealed_record(keys: BodyKeys, record: OutboxRecord, *, e2ee: bool) -> OutboxRecord:
    """``record`` with its body fields sealed (module docstring); others unchanged."""
    if e2ee:
        return record
    if isinstance(record, MessageCommitted):
        if record.e2ee or not record.payload:
            return record
        t, c = record.tenant_id, record.conversation_id
        preview = b""
        if record.message_type != MessageType.CUSTOM:
            preview = keys.seal_preview(t, c, record.payload[:PREVIEW_BYTES])
        return msgspec.structs.replace(
            record,
            payload=keys.seal(t, c, record.conversation_seq, record.payload),
            sealed_preview=preview,
        )
    if isinstance(record, MessageAmended) and record.action == "edit" and record.new_payload:
        t, c = record.tenant_id, record.conversation_id
        return msgspec.structs.replace(
            record,
            new_payload=keys.seal(t, c, record.target_conversation_seq, record.new_payload),
            preview_or_placeholder=keys.seal_preview(t, c, record.new_payload[:PREVIEW_BYTES]),
        )
    return record


def opened_history(
    keys: BodyKeys, tenant_id: str, conversation_id: str, batch: HistoryBatch
) -> HistoryBatch:
    """The HISTORY_BATCH decrypt point (21.3.4): each sealed body opened at its own seq; a body
    whose key is gone reads as the expired placeholder, so the page is served regardless."""
    if not any(m.payload_or_ciphertext for m in batch.messages):
        return batch
    messages = tuple(
        msgspec.structs.replace(
            m,
            payload_or_ciphertext=keys.open(
                m.payload_or_ciphertext, tenant_id, conversation_id, (m.conversation_seq,)
            ),
        )
        if m.payload_or_ciphertext
        else m
        for m in batch.messages
    )
    return msgspec.structs.replace(batch, messages=messages)
