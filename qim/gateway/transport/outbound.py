"""Per-connection outbound scheduling across the A.5 streams (§15.4.2, §15.4.3).

Why: a 4 MiB MAILBOX_BATCH on a 1 Mbps link takes 32 s; a PONG stuck behind it fails the
client's probe and starts a reconnect loop (§15.4.2). So:

* every frame is queued on its stream as *pieces*: ``encode_fragments`` cuts a body larger than
  ``stream_write_chunk_bytes`` (64 KiB, B.5) into FRAGMENTED frames of at most that size. Each
  piece is a complete frame with its own header, so any boundary between pieces is a frame
  boundary on the byte stream (and one WebSocket message each);
* stream 0 (control: PONG, ERROR, KICKED, AUTH_OK) has strict priority: the next piece written
  after a control frame is queued is that control frame, so it waits behind at most one
  piece (<= 64 KiB + header) already handed to the transport;
* streams 1.. share the link by weighted round robin, one piece per credit, weights following
  the frame priority of §15.4.3 (realtime > bulk > room);
* pieces of one stream stay FIFO, so fragments of a frame are contiguous on their stream and
  never interleave with another frame of the *same* stream (§15.4.3); the decoder reassembles
  per stream.

PUSH_EVENTS frames carry a :class:`PushTag` (their ledger charge and priority class, 11.3):
the writer reports a tag when the frame's last piece has left the socket, and
:meth:`OutboundQueue.purge_pushes` drops the tagged frames not yet started -- the "pending
real-time queue" that DEGRADED and the node budget drop (11.3.1, 11.3.3, C11). The other
server-initiated real-time frames (SESSION_DELTA, BADGE_UPDATE, READ_SYNC: absolute values a
pull repairs, 12.6) are queued as *notices* and :meth:`OutboundQueue.purge_notices` drops the
ones not yet started, so DEGRADED drops the whole pending real-time queue and keeps the
replies (SEND_ACK, ONLINE_READY). A frame whose first piece is already written is never cut:
the receiver would be left with half a frame.

Pure: no asyncio. The connection's writer task pops and writes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

from qim.schemas.frames import Stream
from qim.schemas.records.push import FramePriority

__all__ = ["DEFAULT_STREAM_WEIGHTS", "OutboundQueue", "PushTag", "Written"]

DEFAULT_STREAM_WEIGHTS: Final[Mapping[int, int]] = {
    Stream.REALTIME: 4,
    Stream.BULK: 2,
    Stream.ROOM: 1,
}


@dataclass(eq=False, slots=True)
class PushTag:
    """One queued PUSH_EVENTS frame: identity by object, one per frame."""

    ledger_bytes: int  # what ConnectionPush charged for it (PendingPush.ledger_bytes)
    wire_bytes: int  # headers + body, all pieces
    priority: FramePriority
    mailbox_seq: int = 0  # the frame's recipient seq: PUSHED evidence once it left (16.1.2)


_Item: TypeAlias = tuple[bytes, PushTag | None, bool, str]  # piece, tag, last, notice name
Written: TypeAlias = tuple[bytes, PushTag | None]
"""A piece to write and, on the last piece of a push frame, that frame's tag."""


class OutboundQueue:
    """Pieces waiting to be written, one FIFO per stream; ``pop`` picks the next by priority."""

    def __init__(self, weights: Mapping[int, int] = DEFAULT_STREAM_WEIGHTS) -> None:
        self._weights = dict(weights)
        self._queues: dict[int, deque[_Item]] = {Stream.CONTROL: deque()}
        self._started: dict[int, PushTag] = {}  # stream -> push frame partly written
        self._open: dict[int, bool] = {}  # stream -> some frame partly written
        self._turn = Stream.CONTROL
        self._credit = 0
        self._bytes = 0
        self._pieces = 0
        self._push_frames = 0
        self._notices = 0

    @property
    def queued_notices(self) -> int:
        """Notice frames (SESSION_DELTA, ...) whose last piece is not written yet."""
        return self._notices

    @property
    def queued_pushes(self) -> int:
        """Push frames whose last piece is not written yet."""
        return self._push_frames

    @property
    def buffered_bytes(self) -> int:
        """Octets queued and not yet popped (all streams)."""
        return self._bytes

    def __len__(self) -> int:
        return self._pieces

    def push(
        self,
        pieces: Sequence[bytes],
        stream: int,
        tag: PushTag | None = None,
        *,
        notice: str = "",
    ) -> None:
        """Queue the pieces of one frame on ``stream``, in order; ``tag`` marks a push frame,
        ``notice`` (the frame's name) a real-time frame that :meth:`purge_notices` may drop."""
        queue = self._queues.get(stream)
        if queue is None:
            queue = self._queues[stream] = deque()
        last = len(pieces) - 1
        notice = notice if tag is None else ""
        queue.extend((piece, tag, i == last, notice) for i, piece in enumerate(pieces))
        if tag is not None:
            self._push_frames += 1
        if notice:
            self._notices += 1
        self._bytes += sum(len(p) for p in pieces)
        self._pieces += len(pieces)

    def pop(self) -> bytes | None:
        """The next piece to write, or None when everything is written."""
        item = self._pop_item()
        return None if item is None else item[0]

    def pop_batch(self, max_bytes: int) -> list[bytes]:
        """Pieces in write order, up to ``max_bytes`` (at least one): one syscall's worth."""
        return [piece for piece, _ in self.pop_written(max_bytes)]

    def pop_written(self, max_bytes: int) -> list[Written]:
        """Like :meth:`pop_batch`, with the tag of each push frame completed by a piece.

        Priority still holds at the next call: a control frame queued meanwhile goes first.
        """
        batch: list[Written] = []
        size = 0
        while size < max_bytes:
            item = self._pop_item()
            if item is None:
                break
            batch.append((item[0], item[1]))
            size += len(item[0])
        return batch

    def push_tags(self) -> list[PushTag]:
        """The push frames not yet started (what :meth:`purge_pushes` would drop)."""
        return self._droppable(lambda _: True)

    def purge_pushes(self, which: Callable[[PushTag], bool] = lambda _: True) -> list[PushTag]:
        """Drop the queued push frames matching ``which`` that have no piece written yet."""
        dropped = list(self._droppable(which))
        if not dropped:
            return dropped
        gone = {id(tag) for tag in dropped}
        for queue in self._queues.values():
            kept = [item for item in queue if item[1] is None or id(item[1]) not in gone]
            for piece, tag, _, _ in queue:
                if tag is not None and id(tag) in gone:
                    self._bytes -= len(piece)
                    self._pieces -= 1
            queue.clear()
            queue.extend(kept)
        self._push_frames -= len(dropped)
        return dropped

    def purge_stream(self, stream: int) -> None:
        """Drop every frame of ``stream`` not started yet; a frame partly written completes.

        Why: at close (KICKED, replaced) the real-time stream's SESSION_DELTA / BADGE_UPDATE /
        READ_SYNC must not follow KICKED any more than PUSH_EVENTS may; the next session's
        AUTH_OK and sync cover them."""
        queue = self._queues.get(stream)
        if not queue:
            return
        items = list(queue)
        keep = 0
        if self._open.get(stream):
            keep = next((i + 1 for i, item in enumerate(items) if item[2]), len(items))
        for piece, tag, last, notice in items[keep:]:
            self._bytes -= len(piece)
            self._pieces -= 1
            if tag is not None and last:
                self._push_frames -= 1
            if notice and last:
                self._notices -= 1
        queue.clear()
        queue.extend(items[:keep])

    def purge_notices(self) -> list[str]:
        """Drop every notice frame not started yet (all streams); the names of those dropped."""
        dropped: list[str] = []
        for stream, queue in self._queues.items():
            if not queue:
                continue
            items = list(queue)
            keep = 0
            if self._open.get(stream):  # the frame partly written completes
                keep = next((i + 1 for i, item in enumerate(items) if item[2]), len(items))
            kept = items[:keep]
            for item in items[keep:]:
                piece, _, last, notice = item
                if not notice:
                    kept.append(item)
                    continue
                self._bytes -= len(piece)
                self._pieces -= 1
                if last:
                    dropped.append(notice)
            queue.clear()
            queue.extend(kept)
        self._notices -= len(dropped)
        return dropped

    def clear(self) -> None:
        """Drop everything queued (connection gone)."""
        for queue in self._queues.values():
            queue.clear()
        self._started.clear()
        self._bytes = self._pieces = self._push_frames = self._notices = 0

    # -- internals ------------------------------------------------------------------------------

    def _droppable(self, which: Callable[[PushTag], bool]) -> list[PushTag]:
        seen: dict[int, PushTag] = {}
        for stream, queue in self._queues.items():
            started = self._started.get(stream)
            for _, tag, _, _ in queue:
                if tag is not None and tag is not started and which(tag):
                    seen.setdefault(id(tag), tag)
        return list(seen.values())

    def _pop_item(self) -> _Item | None:
        control = self._queues[Stream.CONTROL]
        if control:
            return self._take(Stream.CONTROL, control)
        queue = self._queues.get(self._turn)
        if self._credit <= 0 or not queue or self._turn == Stream.CONTROL:
            nxt = self._next_stream()
            if nxt is None:
                return None
            self._turn, self._credit = nxt, self._weights.get(nxt, 1)
            queue = self._queues[nxt]
        self._credit -= 1
        return self._take(self._turn, queue)

    def _take(self, stream: int, queue: deque[_Item]) -> _Item:
        item = queue.popleft()
        piece, tag, last, notice = item
        self._open[stream] = not last
        if tag is not None:
            if last:
                self._started.pop(stream, None)
                self._push_frames -= 1
            else:
                self._started[stream] = tag
        if notice and last:
            self._notices -= 1
        self._bytes -= len(piece)
        self._pieces -= 1
        return (piece, tag if last else None, last, notice)

    def _next_stream(self) -> int | None:
        active = sorted(s for s, q in self._queues.items() if q and s != Stream.CONTROL)
        if not active:
            return None
        for stream in active:
            if stream > self._turn:
                return stream
        return active[0]
