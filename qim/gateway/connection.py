"""One live connection: a Session, its OutboundQueue, and the writer task over a Transport.

The drivers (``ws.py``, ``tcp.py``) only read bytes and call ``feed_message`` / ``feed_data``;
everything the session decides is performed by ``apply``. Node-level work (authentication,
device registry, presence, metrics) goes through :class:`ConnectionHooks`.

Closing: a Close action marks the connection closing and wakes the writer, which writes what
is queued (the ERROR / KICKED / REDIRECT that explains the close) for at most
``close_flush_timeout_ms``, then closes the transport; the driver's read loop then ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from qim.gateway.actions import Action, Authenticate, Close, CloseReason, Count, Forward, Send
from qim.gateway.outbound import OutboundQueue
from qim.gateway.session import Session
from qim.schemas.frames import DEFAULT_CHUNK_BYTES, Frame, Stream, encode_fragments, spec_for_model

__all__ = ["Connection", "ConnectionHooks", "Transport"]

log = logging.getLogger(__name__)


class Transport(Protocol):
    """A byte pipe: WebSocket (one frame piece per message) or TLS/TCP (a byte stream)."""

    async def send(self, pieces: list[bytes]) -> None: ...

    async def close(self) -> None: ...


class ConnectionHooks(Protocol):
    """What a connection asks of its node."""

    def authenticate(self, conn: Connection, action: Authenticate) -> None: ...

    def forward(self, conn: Connection, frame: Frame) -> None: ...

    def count(self, conn: Connection, action: Count) -> None: ...

    def activity(self, conn: Connection) -> None: ...

    def closing(self, conn: Connection, reason: CloseReason) -> None: ...

    def finished(self, conn: Connection) -> None: ...


class Connection:
    """Session + outbound queue + writer task; identity ``conn_id`` is unique per node boot."""

    def __init__(
        self,
        conn_id: str,
        session: Session,
        transport: Transport,
        hooks: ConnectionHooks,
        *,
        clock_ms: Callable[[], int],
        peer_ip: str = "",
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        hard_watermark_bytes: int = 4 * 1024 * 1024,
        close_flush_timeout_ms: int = 2_000,
    ) -> None:
        self.conn_id = conn_id
        self.session = session
        self.transport = transport
        self.peer_ip = peer_ip
        self.outbound = OutboundQueue()
        self.scheduled_ms: int | None = None  # the timing-wheel deadline it sits at
        self._hooks = hooks
        self._clock_ms = clock_ms
        self._chunk = chunk_bytes
        self._hard = hard_watermark_bytes
        self._flush_timeout = close_flush_timeout_ms / 1000
        self._wakeup = asyncio.Event()
        self._closing = False
        self._writer: asyncio.Task[None] | None = None

    @property
    def closing(self) -> bool:
        return self._closing

    def __repr__(self) -> str:
        return f"<Connection {self.conn_id} {self.session.state.name} {self.peer_ip}>"

    # -- driver side ----------------------------------------------------------------------------

    def feed_message(self, message: bytes) -> None:
        self.apply(self.session.receive_message(message, self._clock_ms()))

    def feed_data(self, data: bytes) -> None:
        self.apply(self.session.receive_data(data, self._clock_ms()))

    async def run(self, read_loop: Callable[[Connection], Awaitable[None]]) -> None:
        """Drive the connection until both directions are done; never raises for I/O."""
        self._writer = asyncio.create_task(self._write_loop(), name=f"write-{self.conn_id}")
        try:
            await read_loop(self)
        except (ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
            log.debug("%r read ended: %r", self, exc)
        finally:
            self.apply(self.session.peer_closed(self._clock_ms()))
            await self._writer

    # -- actions --------------------------------------------------------------------------------

    def apply(self, actions: list[Action]) -> None:
        """Perform the session's actions in order."""
        for action in actions:
            if isinstance(action, Send):
                self._enqueue(action)
            elif isinstance(action, Close):
                self._begin_close(action.reason)
            elif isinstance(action, Authenticate):
                self._hooks.authenticate(self, action)
            elif isinstance(action, Forward):
                self._hooks.forward(self, action.frame)
            else:
                self._hooks.count(self, action)
        if actions and not self.session.closed:
            self._hooks.activity(self)

    def _enqueue(self, send: Send) -> None:
        stream = spec_for_model(type(send.body)).stream if send.stream is None else send.stream
        pieces = encode_fragments(
            send.body,
            send.request_id,
            stream,
            version=send.version,
            chunk_bytes=self._chunk,
            max_frame_bytes=self.session.config.limits.max_frame_bytes,
        )
        self.outbound.push(pieces, stream)
        self._wakeup.set()
        if stream != Stream.CONTROL and self.outbound.buffered_bytes > self._hard:
            self.apply(self.session.shutdown(CloseReason.SLOW_CONSUMER, self._clock_ms()))

    def _begin_close(self, reason: CloseReason) -> None:
        if self._closing:
            return
        self._closing = True
        self._wakeup.set()
        self._hooks.closing(self, reason)

    # -- writer -----------------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        try:
            while True:
                batch = self.outbound.pop_batch(self._chunk)
                if batch:
                    if self._closing:
                        await asyncio.wait_for(self.transport.send(batch), self._flush_timeout)
                    else:
                        await self.transport.send(batch)
                    continue
                if self._closing:
                    break
                self._wakeup.clear()
                await self._wakeup.wait()
        except (ConnectionError, OSError, TimeoutError) as exc:
            log.debug("%r write ended: %r", self, exc)
            self.apply(self.session.peer_closed(self._clock_ms()))
        except Exception:
            log.exception("%r writer failed", self)
            self.apply(self.session.peer_closed(self._clock_ms()))
        finally:
            self.outbound.clear()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.transport.close(), self._flush_timeout)
            self._hooks.finished(self)
