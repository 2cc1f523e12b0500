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

Pure: no asyncio. The connection's writer task pops and writes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Final

from qim.schemas.frames import Stream

__all__ = ["DEFAULT_STREAM_WEIGHTS", "OutboundQueue"]

DEFAULT_STREAM_WEIGHTS: Final[Mapping[int, int]] = {
    Stream.REALTIME: 4,
    Stream.BULK: 2,
    Stream.ROOM: 1,
}


class OutboundQueue:
    """Pieces waiting to be written, one FIFO per stream; ``pop`` picks the next by priority."""

    def __init__(self, weights: Mapping[int, int] = DEFAULT_STREAM_WEIGHTS) -> None:
        self._weights = dict(weights)
        self._queues: dict[int, deque[bytes]] = {Stream.CONTROL: deque()}
        self._turn = Stream.CONTROL
        self._credit = 0
        self._bytes = 0
        self._pieces = 0

    @property
    def buffered_bytes(self) -> int:
        """Octets queued and not yet popped (all streams)."""
        return self._bytes

    def __len__(self) -> int:
        return self._pieces

    def push(self, pieces: Sequence[bytes], stream: int) -> None:
        """Queue the pieces of one frame on ``stream``, in order."""
        queue = self._queues.get(stream)
        if queue is None:
            queue = self._queues[stream] = deque()
        queue.extend(pieces)
        self._bytes += sum(len(p) for p in pieces)
        self._pieces += len(pieces)

    def pop(self) -> bytes | None:
        """The next piece to write, or None when everything is written."""
        control = self._queues[Stream.CONTROL]
        if control:
            return self._take(control)
        queue = self._queues.get(self._turn)
        if self._credit <= 0 or not queue or self._turn == Stream.CONTROL:
            nxt = self._next_stream()
            if nxt is None:
                return None
            self._turn, self._credit = nxt, self._weights.get(nxt, 1)
            queue = self._queues[nxt]
        self._credit -= 1
        return self._take(queue)

    def pop_batch(self, max_bytes: int) -> list[bytes]:
        """Pieces in write order, up to ``max_bytes`` (at least one): one syscall's worth.

        Priority still holds at the next call: a control frame queued meanwhile goes first.
        """
        batch: list[bytes] = []
        size = 0
        while size < max_bytes:
            piece = self.pop()
            if piece is None:
                break
            batch.append(piece)
            size += len(piece)
        return batch

    def clear(self) -> None:
        """Drop everything queued (connection gone)."""
        for queue in self._queues.values():
            queue.clear()
        self._bytes = self._pieces = 0

    def _take(self, queue: deque[bytes]) -> bytes:
        piece = queue.popleft()
        self._bytes -= len(piece)
        self._pieces -= 1
        return piece

    def _next_stream(self) -> int | None:
        active = sorted(s for s, q in self._queues.items() if q and s != Stream.CONTROL)
        if not active:
            return None
        for stream in active:
            if stream > self._turn:
                return stream
        return active[0]
