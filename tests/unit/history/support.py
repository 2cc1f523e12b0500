"""Build a MessageStore through the HistoryArchiver from real outbox records."""

from __future__ import annotations

from collections.abc import Iterable

from qim.core.history import MemoryOrderedStore, archive_batch, write_all
from qim.schemas.records.outbox import MessageCommitted

T = "t1"
C = "g:chat"


def committed(
    seq: int, *, tenant: str = T, conversation: str = C, payload: bytes = b"hi", sender: str = "u1"
) -> MessageCommitted:
    """A committed group message at ``seq`` (ids derived from the seq, time = seq)."""
    mid = ((1_000 + seq) << 80 | seq).to_bytes(16, "big")
    return MessageCommitted(
        tenant_id=tenant,
        conversation_id=conversation,
        conversation_kind="group",
        message_id=mid,
        conversation_seq=seq,
        last_activity_id=mid,
        sender_id=sender,
        origin_device_id="d1",
        payload=payload,
        member_count=3,
        committed_at=1_700_000_000_000 + seq,
    )


def store_with(seqs: Iterable[int], *, payload: bytes = b"hi") -> MemoryOrderedStore:
    store = MemoryOrderedStore()
    write_all(store, archive_batch(committed(s, payload=payload) for s in seqs))
    return store
