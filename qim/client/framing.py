"""A :class:`Transport` plus the sans-I/O codec: frames out, frames in, for either end.

The SDK reads with ``Role.CLIENT`` and the test servers with ``Role.SERVER``; both drive the one
:class:`~qim.schemas.frames.FrameDecoder`. A message-framed transport feeds
``receive_message`` (one frame per websocket message), a byte stream feeds ``receive_data``
and keeps what follows a frame for the next call - so bytes that arrive glued to AUTH_OK are
not lost when the reader task takes over from the handshake.
"""

from __future__ import annotations

from qim.client.transport import Transport
from qim.schemas.frames import (
    DEFAULT_LIMITS,
    PROTOCOL_VERSION,
    Body,
    Frame,
    FrameDecoder,
    Limits,
    Role,
    UnknownFrame,
    encode_frame,
)

__all__ = ["FramedConnection"]


class FramedConnection:
    """One connection's codec state over one transport."""

    def __init__(
        self, transport: Transport, role: Role, *, limits: Limits = DEFAULT_LIMITS
    ) -> None:
        self.transport = transport
        self.role = role
        self.decoder = FrameDecoder(role, limits=limits)

    async def send(
        self,
        body: Body,
        *,
        request_id: int = 0,
        stream_id: int | None = None,
        version: int = PROTOCOL_VERSION,
    ) -> None:
        """Encode one frame (default stream from the opcode table) and send it."""
        frame = encode_frame(body, request_id=request_id, stream_id=stream_id, version=version)
        await self.transport.send(frame)

    async def send_raw(self, frame: bytes) -> None:
        """Send already-encoded frame bytes (one whole frame on a message transport)."""
        await self.transport.send(frame)

    async def recv(self) -> Frame | UnknownFrame:
        """The next complete frame; raises TransportClosed at EOF, ProtocolError on bad bytes."""
        if self.transport.message_framed:
            while True:
                frame = self.decoder.receive_message(await self.transport.recv())
                if frame is not None:
                    return frame
        while True:
            frame = self.decoder.next_frame()
            if frame is not None:
                return frame
            self.decoder.receive_data(await self.transport.recv())

    async def close(self) -> None:
        await self.transport.close()
