"""PULL_MAILBOX -> MAILBOX_BATCH: the three ``covered_through_seq`` rules of spec 9.3.3, exactly.

Rule 1 (interval): ``after_seq`` is an open lower bound, ``up_to_seq`` a closed upper bound; the
entries returned lie in ``(after_seq, up_to_seq]``. ``up_to_seq = 0`` means "up to now": the
lane's current ``W[lane]`` (6.10.2, A.3 #2), echoed in ``lane_watermark`` either way.

Rule 2 (cut only at mailbox_seq boundaries): all entries of one mailbox_seq (an event group,
<= 8 entries and <= 8 KiB, 6.7) come in the same batch, so ``max_items=1`` still returns a
4-entry group whole (seed 003 M-4, 26.2.2). ``max_items`` / ``max_bytes`` are soft: like seed
003's ``cut_batch``, the batch stops at the first group boundary where a limit has been reached,
so it overshoots by less than one group. The only hard limit is ``max_frame_bytes``: a group
that would push the encoded frame past it waits for the next batch, and a first group too big
for any frame loses its bodies (``body_included=false``, A.4.1) instead - the reference part
alone always fits, so every batch makes progress. ``covered_through_seq`` is ``up_to_seq`` when
the scan reached it (also for an empty batch), else the last mailbox_seq returned whole. One
look-ahead group decides which, so ``has_more`` is exact: ``has_more = false`` iff
``covered_through_seq == up_to_seq`` (A.4 #2), and an empty batch that did not reach
``up_to_seq`` cannot be produced.

Rule 3 (holes): holes in ``(after_seq, covered_through_seq]`` may be skipped only if
``after_seq >= effective_trim(user)``; otherwise ERROR CURSOR_EXPIRED, never "empty +
has_more=false" (26.1.2 negative branch, 26.2.6). ``after_seq = 0`` is the new device's "never
applied anything" and is exempt (9.6.1, I-33): it gets whatever is still in retention.

Range errors are CURSOR_INVALID ("seq out of range", A.6): ``acked_seq > W`` (9.3.2, T29),
``up_to_seq > W``, ``after_seq > up_to_seq``. ``up_to_seq > W`` is refused rather than clamped:
a clamped batch would end at W below the requested bound, so ``has_more`` would stay true and
the next pull ``(W, up_to]`` would have to be an empty non-final batch, which Rule 2 forbids.
A legitimate client never asks for it, its bounds come only from AUTH_OK or an earlier
``MAILBOX_BATCH.lane_watermark`` and ``W[lane]`` never decreases (9.5.2, I-14).

Stateless on purpose: pipelining (``pull_mailbox_window`` = 4 sub-ranges in flight, 9.3.2) is
the client's business, each request is answered on its own, and the per-session coverage that
SYNC_COMPLETE needs lives in :class:`~qim.core.sync.progress.SyncProgress`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from qim.core.sync.errors import SyncInvariantError, cursor_expired, cursor_invalid
from qim.params import Settings
from qim.schemas.frames import Error, MailboxBatch, PullMailbox, SyncEntry, encode_body

__all__ = [
    "DEFAULT_PULL_LIMITS",
    "Group",
    "GroupReader",
    "PullLimits",
    "PullWindow",
    "cut_batch",
    "pull_mailbox",
    "resolve_pull",
    "strip_body",
]

Group = tuple[int, Sequence[SyncEntry]]
"""One event group: a mailbox_seq and all of the user's entries at it, in event_ordinal order."""

GroupReader = Callable[[int, int], Iterable[Group]]
"""``(after_seq, up_to_seq) -> groups`` ascending; e.g. ``MailboxReader.read_user_range``."""

_MAX_SEQ: Final = (1 << 63) - 1
# Everything of an encoded MAILBOX_BATCH that is not an entry: its three scalar fields at their
# widest, the "entries" key and the widest msgpack array header (5 octets; 1 is counted).
_ENVELOPE: Final = (
    len(
        encode_body(
            MailboxBatch(
                entries=(SyncEntry(),),
                covered_through_seq=_MAX_SEQ,
                lane_watermark=_MAX_SEQ,
                has_more=True,
            )
        )
    )
    - len(encode_body(SyncEntry()))
    + 4
)


@dataclass(frozen=True, slots=True)
class PullLimits:
    """B.3 ``pull_mailbox_max_items`` / ``pull_mailbox_max_bytes`` (default and cap per request)
    and B.5 ``max_frame_bytes`` (the hard limit)."""

    max_items: int = 500
    max_bytes: int = 512 * 1024
    max_frame_bytes: int = 4 * 1024 * 1024

    @classmethod
    def from_settings(cls, settings: Settings) -> PullLimits:
        return cls(
            max_items=settings.pull_mailbox_max_items,
            max_bytes=settings.pull_mailbox_max_bytes,
            max_frame_bytes=settings.max_frame_bytes,
        )


DEFAULT_PULL_LIMITS: Final = PullLimits()


@dataclass(frozen=True, slots=True)
class PullWindow:
    """A validated request: the range to scan and the soft limits that apply to it."""

    after_seq: int
    up_to_seq: int  # resolved: never 0 unless W[lane] is 0
    lane_watermark: int
    max_items: int
    max_bytes: int


def resolve_pull(
    request: PullMailbox,
    *,
    lane_watermark: int,
    trim_watermark: int,
    limits: PullLimits = DEFAULT_PULL_LIMITS,
) -> PullWindow | Error:
    """Check a PULL_MAILBOX against ``W[lane]`` and ``effective_trim`` before any storage read."""
    w = lane_watermark
    if request.acked_seq > w:
        return cursor_invalid(f"acked_seq {request.acked_seq} is above W[lane] {w}")
    up_to = request.up_to_seq or w
    if up_to > w:
        return cursor_invalid(f"up_to_seq {up_to} is above W[lane] {w}")
    if request.after_seq > up_to:
        return cursor_invalid(f"after_seq {request.after_seq} is above up_to_seq {up_to}")
    if 0 < request.after_seq < trim_watermark:
        return cursor_expired(trim_watermark)
    return PullWindow(
        after_seq=request.after_seq,
        up_to_seq=up_to,
        lane_watermark=w,
        max_items=min(request.max_items or limits.max_items, limits.max_items),
        max_bytes=min(request.max_bytes or limits.max_bytes, limits.max_bytes),
    )


def strip_body(entry: SyncEntry) -> SyncEntry:
    """The reference part only (A.4.1 ``body_included=false``); the client uses PULL_HISTORY."""
    return msgspec.structs.replace(
        entry,
        body_included=False,
        message_type=None,
        custom_type=None,
        schema_version=None,
        payload_or_ciphertext=None,
        media_metadata=None,
    )


def _sizes(group: Sequence[SyncEntry]) -> int:
    return sum(len(encode_body(entry)) for entry in group)


def _check_group(seq: int, group: Sequence[SyncEntry], previous: int, up_to: int) -> None:
    if not previous < seq <= up_to:
        raise SyncInvariantError(f"group {seq} outside ({previous}, {up_to}] or out of order")
    if not group or any(entry.mailbox_seq != seq for entry in group):
        raise SyncInvariantError(f"group {seq} is empty or holds entries of another mailbox_seq")


def cut_batch(groups: Iterable[Group], window: PullWindow, *, max_frame_bytes: int) -> MailboxBatch:
    """Rule 2 over ``groups`` (ascending, inside the window); reads at most one group too many."""
    budget = max_frame_bytes - _ENVELOPE
    entries: list[SyncEntry] = []
    items = size = 0
    previous = last_whole = window.after_seq
    covered = window.up_to_seq
    for seq, group in groups:
        _check_group(seq, group, previous, window.up_to_seq)
        previous = seq
        group_bytes = _sizes(group)
        if entries:
            limit_reached = items >= window.max_items or size >= window.max_bytes
            if limit_reached or size + group_bytes > budget:
                covered = last_whole
                break
        elif group_bytes > budget:
            group = [strip_body(entry) for entry in group]
            group_bytes = _sizes(group)
            if group_bytes > budget:
                raise SyncInvariantError(f"group {seq} exceeds max_frame_bytes without bodies")
        entries.extend(group)
        items += len(group)
        size += group_bytes
        last_whole = seq
    return MailboxBatch(
        entries=tuple(entries),
        covered_through_seq=covered,
        lane_watermark=window.lane_watermark,
        has_more=covered != window.up_to_seq,
    )


def pull_mailbox(
    read: GroupReader,
    request: PullMailbox,
    *,
    lane_watermark: int,
    trim_watermark: int,
    limits: PullLimits = DEFAULT_PULL_LIMITS,
    trim_after_scan: Callable[[], int] | None = None,
) -> MailboxBatch | Error:
    """Answer one PULL_MAILBOX; ``read`` is called only for a valid, unexpired request.

    ``trim_after_scan`` re-reads ``effective_trim`` once the groups are read: a trim that
    passed ``after_seq`` during the scan turns the batch into CURSOR_EXPIRED, so a bucket
    expiring mid-scan is never reported as an empty range (seed 003 RangeScan step 4).
    """
    window = resolve_pull(
        request, lane_watermark=lane_watermark, trim_watermark=trim_watermark, limits=limits
    )
    if isinstance(window, Error):
        return window
    groups: Iterable[Group] = ()
    if window.after_seq < window.up_to_seq:
        groups = read(window.after_seq, window.up_to_seq)
    batch = cut_batch(groups, window, max_frame_bytes=limits.max_frame_bytes)
    if trim_after_scan is not None:
        trim = trim_after_scan()
        if 0 < window.after_seq < trim:
            return cursor_expired(trim)
    return batch
