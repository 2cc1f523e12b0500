"""The ConversationWriter's checkpoint on ``qim.writer-snapshots``: envelope and chunking.

What a checkpoint holds: the writer core's snapshot bytes (heads, ClientDedup, HLC, admission
cells), the GroupMembership bytes, the outbox offset the two include, and the fencing epoch of
the incarnation that wrote it. It is produced in the same Kafka transaction as the outbox appends
it covers, so a read_committed reader never sees a checkpoint ahead of the log. Restore is
"latest checkpoint, then apply the outbox after ``outbox_offset``" (``writer_restore``).

Why chunks: the state is bounded by the ClientDedup window (two hours of sends), which outgrows
Kafka's 1 MiB record limit long before it outgrows memory. A checkpoint is cut into chunks of at
most ``max_chunk_bytes``, keyed ``"<partition>:<index>"`` on the compacted topic. Compaction keeps
the newest record per key, so a newer checkpoint with fewer chunks leaves older high-index chunks
behind: each chunk carries its checkpoint's identity ``(outbox_offset, fencing_epoch)`` and the
chunk count, and the reader takes the newest record's checkpoint and only chunks of that identity.
All chunks of one checkpoint are committed in one transaction by one producer, so they are the
newest committed records of their keys and contiguous in the log.

Pure (msgspec only): ``writer_restore`` feeds it records read from Kafka.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import msgspec

from qim.schemas.log_identity import LogIdentity

__all__ = [
    "CHECKPOINT_FORMAT",
    "DEFAULT_MAX_CHUNK_BYTES",
    "Checkpoint",
    "CheckpointChunk",
    "LatestCheckpoint",
    "checkpoint_records",
    "chunk_key",
    "latest_checkpoint",
]

CHECKPOINT_FORMAT: Final = 2
"""2: ``outbox_identity`` binds the outbox offset to its log (17.2)."""
DEFAULT_MAX_CHUNK_BYTES: Final = 512 * 1024
"""Half of Kafka's default ``max.message.bytes``: room for the chunk header and batch framing."""


class Checkpoint(msgspec.Struct, frozen=True, array_like=True):
    """One partition's writer state as of ``outbox_offset`` (``-1``: before any record)."""

    format: int
    partition: int
    outbox_offset: int
    fencing_epoch: int
    writer: bytes
    membership: bytes
    outbox_identity: LogIdentity | None = None
    """The outbox log ``outbox_offset`` counts in; restore refuses any other (fail closed)."""


class CheckpointChunk(msgspec.Struct, frozen=True, array_like=True):
    """One slice of an encoded :class:`Checkpoint`."""

    outbox_offset: int
    fencing_epoch: int
    chunk_index: int
    chunk_count: int
    data: bytes

    @property
    def identity(self) -> tuple[int, int]:
        return (self.outbox_offset, self.fencing_epoch)


_ENCODER = msgspec.msgpack.Encoder()
_CHECKPOINT = msgspec.msgpack.Decoder(Checkpoint)
_CHUNK = msgspec.msgpack.Decoder(CheckpointChunk)


def chunk_key(partition: int, index: int) -> bytes:
    """``"<partition>:<index>"``: compaction keeps one record per chunk slot of a partition."""
    return f"{partition}:{index}".encode("ascii")


def checkpoint_records(
    checkpoint: Checkpoint, max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES
) -> list[tuple[bytes, bytes]]:
    """``(key, value)`` records of one checkpoint, in the order they must be produced."""
    if max_chunk_bytes < 1:
        raise ValueError("max_chunk_bytes must be positive")
    data = _ENCODER.encode(checkpoint)
    pieces = [data[i : i + max_chunk_bytes] for i in range(0, len(data), max_chunk_bytes)]
    return [
        (
            chunk_key(checkpoint.partition, index),
            _ENCODER.encode(
                CheckpointChunk(
                    checkpoint.outbox_offset, checkpoint.fencing_epoch, index, len(pieces), piece
                )
            ),
        )
        for index, piece in enumerate(pieces)
    ]


@dataclass(frozen=True, slots=True)
class LatestCheckpoint:
    """What the reader found in a window of the topic's tail."""

    checkpoint: Checkpoint | None
    complete: bool
    """False when the newest checkpoint's chunks reach further back than the window."""


def latest_checkpoint(values: Iterable[bytes]) -> LatestCheckpoint:
    """The newest checkpoint among ``values`` (record values of one partition, log order).

    Returns ``complete=False`` with no checkpoint when the newest one has chunks before the
    window; the caller then reads a wider window. Undecodable values are a foreign or corrupt
    topic and raise ``msgspec.DecodeError``.
    """
    chunks = [_CHUNK.decode(value) for value in values]
    if not chunks:
        return LatestCheckpoint(None, True)
    newest = chunks[-1]
    parts = {c.chunk_index: c.data for c in chunks if c.identity == newest.identity}
    if len(parts) < newest.chunk_count:
        return LatestCheckpoint(None, False)
    data = b"".join(parts[i] for i in range(newest.chunk_count))
    checkpoint = _CHECKPOINT.decode(data)
    if checkpoint.format > CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint format {checkpoint.format} is newer than this build")
    return LatestCheckpoint(checkpoint, True)
