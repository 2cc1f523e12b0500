"""Lane watermarks ``W[lane]``: per-lane contiguous visibility (spec 6.5.1, 9.2, 10.4.2).

The rule (9.2.2, seed 003 section 3.3): ``W[j]`` may pass ``S`` iff every mailbox_seq in
``(W_old[j], S]`` has no lane-j work or all of it is durable; "no work in lane j" equals "done".
In this core a batch's writes commit in one WriteBatch, so after a commit everything up to the
batch's last mailbox_seq is durable in every lane: a 10,000-member dispatch is never left
half-expanded behind an unrelated one-to-one user's message (seed 003 M-1). The only work that
outlives a commit is a dispatch waiting for its member slice (``P`` keys), a
:class:`LaneHold`. A hold keeps back the lanes it may write to; a pending-slice dispatch may
reach anyone on the shard (its members are what is missing), so today every hold is an
all-lanes hold. The lane-set form states the 9.2.2 rule in full, for holds with known lanes.

``min_j W[j]`` is internal (never sent to clients, I-9): a restarted or new owner resumes the
dispatch partition at :func:`resume_offset` = offset of ``min_j W[j]`` + 1, never at the
consumer group's committed offset (10.4.2 (1), M-2); records it reads again are skipped by the
fold. ``W_floor`` is the highest W ever committed; a lane whose recomputed W is below it is
refused (10.4.2 (2), M-3).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from qim.schemas.seqs import split_mailbox_seq

__all__ = [
    "LaneHold",
    "advance_watermarks",
    "lane_mask",
    "lanes_in_mask",
    "raise_floor",
    "refused_lanes",
    "resume_offset",
]


@dataclass(frozen=True, slots=True)
class LaneHold:
    """Work at ``mailbox_seq`` not yet durable in ``lanes`` (None: in every lane)."""

    mailbox_seq: int
    lanes: frozenset[int] | None = None

    def holds(self, lane: int) -> bool:
        return self.lanes is None or lane in self.lanes


def advance_watermarks(
    current: Sequence[int], durable_through: int, holds: Iterable[LaneHold]
) -> tuple[tuple[int, ...], int]:
    """New ``W[]`` once everything up to ``durable_through`` except ``holds`` is durable.

    Each lane moves to ``durable_through`` or to just below its lowest hold, whichever is
    lower, and never backwards (9.2.3): returns the vector and how many lanes a computation
    would have moved back (kept where they were; a non-zero count is an alert).
    """
    holds = list(holds)
    out: list[int] = []
    regressions = 0
    for lane, old in enumerate(current):
        target = durable_through
        for hold in holds:
            if hold.holds(lane):
                target = min(target, hold.mailbox_seq - 1)
        if target < old:  # only a hold below an already published W gets here: a bug upstream
            regressions += 1
            target = old
        out.append(target)
    return tuple(out), regressions


def raise_floor(floor: Sequence[int], watermarks: Sequence[int]) -> tuple[int, ...]:
    """``W_floor[j] = max(W_floor[j], W[j])``, written in the same batch as W (10.4.2 (2))."""
    return tuple(max(f, w) for f, w in zip(floor, watermarks, strict=True))


def refused_lanes(recomputed: Sequence[int], floor: Sequence[int]) -> list[int]:
    """Lanes whose recomputed W is below the published floor: refuse them (SHARD_MOVED) and
    raise a P1 -- storage lost data that replay cannot restore (10.4.2 (2), M-3)."""
    return [lane for lane, (w, f) in enumerate(zip(recomputed, floor, strict=True)) if w < f]


def resume_offset(watermarks: Sequence[int], shard_epoch: int) -> int:
    """The dispatch-partition offset a (re)starting owner consumes from (10.4.2 (1)).

    ``offset(min_j W[j]) + 1``. Zero when nothing was materialized, or when ``min W`` belongs
    to an older ``shard_epoch`` (the epoch moved because offsets were invalidated, direction.md
    4.5, so the new epoch's log is read from its start).
    """
    low = min(watermarks)
    if low == 0:
        return 0
    epoch, offset = split_mailbox_seq(low)
    if epoch < shard_epoch:
        return 0
    if epoch > shard_epoch:
        raise ValueError(f"watermarks are at shard_epoch {epoch}, ahead of {shard_epoch}")
    return offset + 1


def lane_mask(lanes: Iterable[int], lane_count: int) -> bytes:
    """Bit ``j`` of a big-endian ``lane_count``-bit string set iff lane ``j`` is in ``lanes``."""
    value = 0
    for lane in lanes:
        value |= 1 << lane
    return value.to_bytes(lane_count // 8 or 1, "big")


def lanes_in_mask(mask: bytes) -> list[int]:
    value = int.from_bytes(mask, "big")
    return [lane for lane in range(len(mask) * 8) if value >> lane & 1]
