"""PULL_HISTORY -> HISTORY_BATCH over an ordered reader, clipped to the member's visible interval.

Bounds, exactly (spec 7.5, 9.5.3, 12.10, A.3 #5):

* Visibility: ``visible(u, c) = (joined_at, left_at)``, BOTH ends open. A message with seq
  ``== joined_at`` is hidden (the join event itself, at ``joined_at + 1``, is shown); a leaver
  with ``left_at = J`` still reads every seq ``< J`` and nothing ``>= J``, not even the leave
  CONTROL message itself. ``earliest_available`` (retention) is a closed lower bound.
* Anchor, always exclusive, so a client that pages from the last seq it holds never gets it
  again and a ``limit = 1`` walk always advances:
  ``older``: seqs ``< anchor``, newest first; ``anchor = 0`` means "from the newest", i.e. the
  latest page INCLUDING ``latest_conversation_seq`` -- send 0 (not the latest seq, as the 9.5.3
  table does) to open a conversation. ``newer``: seqs ``> anchor``, oldest first; 0 = from the
  start. Messages are returned in ascending seq order in both directions.
* ``limit``: 0 = :attr:`HistoryLimits.default_limit` (50, the spec 2.4 SLO page), clamped to
  ``max_limit``. ``max_bytes``: 0 = ``max_bytes_cap``, clamped to it; the size counted is each
  item's encoded msgpack size. The first message is always returned even if it alone exceeds
  ``max_bytes`` (a soft cap, like MAILBOX_BATCH's): otherwise one large message would block
  paging forever; the frame layer still enforces ``max_frame_bytes``.
* Types declared ``timeline_visible=false`` (spec 13.3) are never returned; paging skips them.
* ``has_more`` is exact: True iff another visible message exists beyond the page in the paging
  direction (one look-ahead read), never a guess from ``len == limit``.
* ``latest_conversation_seq`` / ``earliest_available_conversation_seq`` are the head's values
  clipped to the interval: a leaver's head stops at ``left_at - 1`` (its history and head are
  invisible from J on, A.3 #22), a joiner's floor starts at ``joined_at + 1``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import msgspec

from qim.core.history.keys import MAX_SEQ, conversation_prefix, seq_bytes, seq_from_key
from qim.core.history.records import decode_message_record, on_timeline, to_history_message
from qim.core.history.store import OrderedReader
from qim.schemas.frames.errors import ErrorCode
from qim.schemas.frames.exceptions import ProtocolError
from qim.schemas.frames.history import HistoryBatch, HistoryMessage, PullHistory

__all__ = [
    "FULL_INTERVAL",
    "HistoryBounds",
    "HistoryLimits",
    "InvalidHistoryRequest",
    "VisibleInterval",
    "bounds_from_store",
    "pull_history",
]

_ENCODER = msgspec.msgpack.Encoder()


class InvalidHistoryRequest(ProtocolError):
    """A direction this build does not know: "cannot understand", the connection lives on."""

    error_code = ErrorCode.UPGRADE_REQUIRED
    close = False


@dataclass(frozen=True, slots=True)
class VisibleInterval:
    """``(joined_at, left_at)`` of spec 7.5, both open; ``left_at`` None = still a member."""

    joined_at: int = 0
    left_at: int | None = None

    def contains(self, seq: int) -> bool:
        return self.joined_at < seq and (self.left_at is None or seq < self.left_at)


FULL_INTERVAL = VisibleInterval()
"""One-to-one conversations: the whole history (ADR-0021: 1:1 chats always full interval)."""


@dataclass(frozen=True, slots=True)
class HistoryBounds:
    """ConversationHead's two positions (spec 7.4); seq 0 = the conversation has none yet."""

    latest_conversation_seq: int
    earliest_available_conversation_seq: int = 0


@dataclass(frozen=True, slots=True)
class HistoryLimits:
    """Page caps; Appendix B has no PULL_HISTORY row, so these are our defaults."""

    default_limit: int = 50
    max_limit: int = 200
    max_bytes_cap: int = 1 << 20

    def clamp(self, limit: int, max_bytes: int) -> tuple[int, int]:
        return (
            min(limit or self.default_limit, self.max_limit),
            min(max_bytes or self.max_bytes_cap, self.max_bytes_cap),
        )


def bounds_from_store(reader: OrderedReader, tenant_id: str, conversation_id: str) -> HistoryBounds:
    """Head positions read from the store itself (first and last key), when no head is at hand."""
    prefix = conversation_prefix(tenant_id, conversation_id)
    last = next(reader.scan(prefix, prefix + seq_bytes(MAX_SEQ), True), None)
    first = next(reader.scan(prefix, prefix, False), None)
    return HistoryBounds(
        latest_conversation_seq=0 if last is None else seq_from_key(last[0]),
        earliest_available_conversation_seq=0 if first is None else seq_from_key(first[0]),
    )


def pull_history(
    reader: OrderedReader,
    *,
    tenant_id: str,
    request: PullHistory,
    interval: VisibleInterval,
    bounds: HistoryBounds,
    limits: HistoryLimits | None = None,
) -> HistoryBatch:
    """Answer PULL_HISTORY for a requester whose visible interval is ``interval``.

    The caller has already refused a requester who was never a member (PERMISSION_DENIED).
    """
    limit, max_bytes = (limits or HistoryLimits()).clamp(request.limit, request.max_bytes)
    # closed seq range [low, high] the requester may see
    low = max(interval.joined_at + 1, bounds.earliest_available_conversation_seq, 1)
    high = bounds.latest_conversation_seq
    if interval.left_at is not None:
        high = min(high, interval.left_at - 1)
    anchor = request.anchor_conversation_seq
    if request.direction == "older":
        if anchor:
            high = min(high, anchor - 1)
        reverse = True
    elif request.direction == "newer":
        low = max(low, anchor + 1)
        reverse = False
    else:
        raise InvalidHistoryRequest(f"unknown history direction {request.direction!r}")
    messages: list[HistoryMessage] = []
    used = 0
    has_more = False
    for item in _visible(reader, tenant_id, request.conversation_id, low, high, reverse):
        size = len(_ENCODER.encode(item))
        if messages and (len(messages) >= limit or used + size > max_bytes):
            has_more = True
            break
        messages.append(item)
        used += size
    if reverse:
        messages.reverse()
    return HistoryBatch(
        messages=tuple(messages),
        latest_conversation_seq=_clip_latest(bounds, interval),
        earliest_available_conversation_seq=_clip_earliest(bounds, interval),
        has_more=has_more,
    )


def _visible(
    reader: OrderedReader, tenant_id: str, conversation_id: str, low: int, high: int, reverse: bool
) -> Iterator[HistoryMessage]:
    """Stored messages with ``low <= seq <= high`` in scan order, off-timeline types skipped
    (spec 13.3 ``timeline_visible=false``: in the mailbox, never in the timeline)."""
    if low > high:
        return
    prefix = conversation_prefix(tenant_id, conversation_id)
    start = prefix + seq_bytes(high if reverse else low)
    for key, value in reader.scan(prefix, start, reverse):
        seq = seq_from_key(key)
        if seq < low or seq > high:
            return
        record = decode_message_record(value)
        if on_timeline(record):
            yield to_history_message(record)


def _clip_earliest(bounds: HistoryBounds, interval: VisibleInterval) -> int:
    earliest = bounds.earliest_available_conversation_seq
    return max(earliest, interval.joined_at + 1) if interval.joined_at else earliest


def _clip_latest(bounds: HistoryBounds, interval: VisibleInterval) -> int:
    if interval.left_at is None:
        return bounds.latest_conversation_seq
    return min(bounds.latest_conversation_seq, interval.left_at - 1)
