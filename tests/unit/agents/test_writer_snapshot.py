"""Checkpoint chunks on a compacted topic: the reader finds the newest whole checkpoint.

Invariant: whatever compaction left of older checkpoints, the newest record names the newest
checkpoint, and only chunks of that checkpoint are assembled.
"""

from __future__ import annotations

import os

import pytest

from qim.agents.writer.snapshot import (
    CHECKPOINT_FORMAT,
    Checkpoint,
    checkpoint_records,
    latest_checkpoint,
)


def checkpoint(offset: int, epoch: int = 1, size: int = 100) -> Checkpoint:
    return Checkpoint(
        format=CHECKPOINT_FORMAT,
        partition=5,
        outbox_offset=offset,
        fencing_epoch=epoch,
        writer=os.urandom(size),
        membership=b"m" * 10,
    )


def compact(records: list[tuple[bytes, bytes]]) -> list[bytes]:
    """What log compaction keeps: the newest record per key, in log order."""
    last = {key: i for i, (key, _) in enumerate(records)}
    return [value for i, (key, value) in enumerate(records) if last[key] == i]


def test_a_checkpoint_round_trips_through_chunks() -> None:
    small = checkpoint(10)
    assert latest_checkpoint([v for _, v in checkpoint_records(small)]).checkpoint == small
    big = checkpoint(20, size=5000)
    records = checkpoint_records(big, max_chunk_bytes=1000)
    assert len(records) == 6
    assert [k for k, _ in records] == [f"5:{i}".encode() for i in range(6)]
    assert latest_checkpoint([v for _, v in records]).checkpoint == big


def test_the_newest_checkpoint_wins_over_compaction_leftovers() -> None:
    older = checkpoint_records(checkpoint(10, size=5000), max_chunk_bytes=1000)
    newer_cp = checkpoint(30, epoch=2, size=1500)
    newer = checkpoint_records(newer_cp, max_chunk_bytes=1000)
    survivors = compact(older + newer)
    assert len(survivors) == 6, "chunks 2..5 of the older one survive compaction"
    assert latest_checkpoint(survivors).checkpoint == newer_cp


def test_a_window_that_misses_chunks_asks_for_a_wider_one() -> None:
    values = [v for _, v in checkpoint_records(checkpoint(10, size=3000), max_chunk_bytes=1000)]
    found = latest_checkpoint(values[1:])
    assert found.checkpoint is None and not found.complete
    empty = latest_checkpoint([])
    assert empty.checkpoint is None and empty.complete


def test_a_checkpoint_of_a_newer_format_is_refused() -> None:
    future = Checkpoint(CHECKPOINT_FORMAT + 1, 0, 1, 1, b"", b"")
    with pytest.raises(ValueError, match="newer"):
        latest_checkpoint([v for _, v in checkpoint_records(future)])
