"""Checkpoint encoding of a writer partition's state: compact, deterministic msgpack.

The shell writes these bytes to a compacted topic (key: the outbox partition) in the same producer
transaction as the outbox appends they cover, and restores a partition with ``restore(snapshot)``
followed by ``apply()`` of the outbox records after it. Applying is idempotent (a record at or
below a head is skipped), so replaying from an earlier offset than the snapshot's is harmless.

Determinism: equal states encode to identical bytes. Rows are msgpack arrays (``array_like``);
heads are sorted by ``(tenant_id, conversation_id)``; dedup rows and admission cells keep their
commit order, which is part of the state (it is the eviction order) and itself a function of the
log. ``format`` versions the layout; a later version may only append fields with defaults
(``at_all_days`` was appended so, an older build reading it ignores the trailing field).
The writer's own incarnation (region, writer id, fencing epoch) is not state and is not stored.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import msgspec

from qim.core.conversation.admission import BucketKey
from qim.core.conversation.at_all import DailyKey
from qim.core.conversation.dedup import DedupEntry, DedupKey
from qim.core.conversation.head import ConversationHead
from qim.schemas.frames.base import U32, U64, U128

__all__ = [
    "SNAPSHOT_FORMAT",
    "BucketRow",
    "DailyRow",
    "DedupRow",
    "WriterSnapshot",
    "decode_snapshot",
    "encode_snapshot",
]

SNAPSHOT_FORMAT: Final = 1


class DedupRow(msgspec.Struct, frozen=True, array_like=True):
    tenant_id: str
    sender_id: str
    client_message_id: str
    conversation_id: str
    message_id: U128
    conversation_seq: U64
    last_activity_id: U128
    committed_at: U64

    def split(self) -> tuple[DedupKey, DedupEntry]:
        key = (self.tenant_id, self.sender_id, self.client_message_id)
        entry = DedupEntry(
            self.conversation_id,
            self.message_id,
            self.conversation_seq,
            self.last_activity_id,
            self.committed_at,
        )
        return key, entry


class BucketRow(msgspec.Struct, frozen=True, array_like=True):
    layer: str
    tenant_id: str
    conversation_id: str
    user_id: str
    tat_us: U64

    def split(self) -> tuple[BucketKey, int]:
        return (self.layer, self.tenant_id, self.conversation_id, self.user_id), self.tat_us


class DailyRow(msgspec.Struct, frozen=True, array_like=True):
    """One ``at_all.DailyQuota`` row: a sender's @alls on one UTC day."""

    tenant_id: str
    sender_id: str
    day: U64
    count: U32

    def split(self) -> tuple[DailyKey, int, int]:
        return (self.tenant_id, self.sender_id), self.day, self.count


class WriterSnapshot(msgspec.Struct, frozen=True, array_like=True):
    """Everything ``apply()`` builds: the highest id (the HLC), heads, dedup, admission cells,
    the @all daily counts."""

    format: int
    last_id: U128
    heads: tuple[ConversationHead, ...] = ()
    dedup: tuple[DedupRow, ...] = ()
    buckets: tuple[BucketRow, ...] = ()
    at_all_days: tuple[DailyRow, ...] = ()


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(WriterSnapshot)


def encode_snapshot(
    last_id: bytes,
    heads: Iterable[ConversationHead],
    dedup: Iterable[tuple[DedupKey, DedupEntry]],
    buckets: Iterable[tuple[BucketKey, int]],
    at_all_days: Iterable[tuple[DailyKey, int, int]] = (),
) -> bytes:
    """Serialize state parts; heads are sorted here, the other parts keep their given order."""
    snapshot = WriterSnapshot(
        format=SNAPSHOT_FORMAT,
        last_id=last_id,
        heads=tuple(sorted(heads, key=lambda head: head.key)),
        dedup=tuple(
            DedupRow(
                key[0],
                key[1],
                key[2],
                entry.conversation_id,
                entry.message_id,
                entry.conversation_seq,
                entry.last_activity_id,
                entry.committed_at,
            )
            for key, entry in dedup
        ),
        buckets=tuple(BucketRow(*key, tat) for key, tat in buckets),
        at_all_days=tuple(DailyRow(*key, day, count) for key, day, count in at_all_days),
    )
    return _ENCODER.encode(snapshot)


def decode_snapshot(data: bytes) -> WriterSnapshot:
    """Parse and check the format; ``ValueError`` for a format this build cannot read."""
    snapshot = _DECODER.decode(data)
    if snapshot.format > SNAPSHOT_FORMAT:
        raise ValueError(f"writer snapshot format {snapshot.format} is newer than this build")
    return snapshot
