"""What is really pending in a socket's send buffer, and PUSH_EVENTS frames from raw bytes.

Why: a PUSH_EVENTS handed to ``transport.write`` has not reached the client; it sits in the
transport's buffer (and the kernel's) until the peer reads. Counting it as gone the moment it
is queued hides a client that stopped reading: the flow state (11.3.1) would never leave
NORMAL. :class:`InFlight` keeps, for every push frame written to the transport, the stream
offset where it ends; the driver reads the transport's own buffer size
(``get_write_buffer_size()``), and every frame whose last byte is below
``written - buffered`` has left -- only then does it leave the connection's ledger.

Bytes already in the kernel socket buffer count as left (we cannot see them); the listeners
keep that buffer small (``SO_SNDBUF``, C11) so the measured level tracks the client.

:func:`push_pieces` is the other half of "encode once" (10.3): the PUSH_EVENTS body arrives
as bytes spliced from the batch's shared encoding and only the 20-byte header (per socket:
version, stream, length, CRC over the header alone, A.1) is built here; the body is cut into
``stream_write_chunk_bytes`` FRAGMENTED pieces like any frame, never decoded.

Pure: no asyncio.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Final

from qim.gateway.transport.outbound import PushTag, Written
from qim.schemas.frames import FrameFlags, PushEvents, Stream, frame_bytes, spec_for_model
from qim.schemas.frames.exceptions import EncodeError

__all__ = ["PUSH_EVENTS_OPCODE", "InFlight", "push_pieces"]

PUSH_EVENTS_OPCODE: Final = spec_for_model(PushEvents).opcode


def push_pieces(
    body: bytes, *, version: int, chunk_bytes: int, max_frame_bytes: int
) -> list[bytes]:
    """A PUSH_EVENTS frame on stream 1 around an already-encoded body, cut into pieces."""
    if len(body) > max_frame_bytes:
        raise EncodeError(f"body of {len(body)} octets > max_frame_bytes {max_frame_bytes}")
    starts = range(0, max(len(body), 1), chunk_bytes)
    last = starts[-1]
    return [
        frame_bytes(
            PUSH_EVENTS_OPCODE,
            body[start : start + chunk_bytes],
            stream_id=Stream.REALTIME,
            flags=0 if start == last else int(FrameFlags.FRAGMENTED),
            version=version,
            max_frame_bytes=max_frame_bytes,
        )
        for start in starts
    ]


class InFlight:
    """Push frames handed to the transport whose bytes may still sit in its buffer."""

    __slots__ = ("_frames", "left", "written")

    def __init__(self) -> None:
        self.written = 0  # octets handed to the transport, ever
        self.left = 0  # octets known to have left the transport's buffer
        self._frames: deque[tuple[int, PushTag]] = deque()  # (end offset, tag), ascending

    def __len__(self) -> int:
        return len(self._frames)

    @property
    def buffered(self) -> int:
        """Octets handed to the transport and not yet out of it (as last measured)."""
        return self.written - self.left

    def wrote(self, batch: Sequence[Written]) -> None:
        """``batch`` was handed to the transport, in this order."""
        for piece, tag in batch:
            self.written += len(piece)
            if tag is not None:
                self._frames.append((self.written, tag))

    def measure(self, transport_buffered: int) -> list[PushTag]:
        """The push frames that left since the last call, given the transport's buffer size."""
        left = self.written - max(0, min(transport_buffered, self.written))
        self.left = max(self.left, left)
        gone: list[PushTag] = []
        while self._frames and self._frames[0][0] <= self.left:
            gone.append(self._frames.popleft()[1])
        return gone
