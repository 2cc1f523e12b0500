"""The SDK's one network seam: a :class:`Transport` moves frame bytes, nothing else.

Three implementations share the protocol (spec §5.3.5 rule 4: TCP and WS share one codec):

* :class:`WebSocketTransport` - ``ws://`` / ``wss://``; one binary message carries one frame
  (``message_framed = True``).
* :class:`TlsTransport` - TLS over TCP with ALPN ``qim/1``; a byte stream of frames
  (``message_framed = False``). The negotiated ALPN is verified, never assumed.
* :class:`MemoryTransport` - an in-memory pair for unit tests and in-process servers, in either
  mode; :class:`MemoryNetwork` dials ``memory://name`` endpoints to registered handlers.

Both ends of a connection can use the same classes (a server wraps its accepted websocket or
stream), so the fake servers of the test suite run unchanged over every transport.
``recv`` raises :class:`TransportClosed` once the peer is gone; it never returns ``b""``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable, Coroutine
from typing import Any, Final, Literal, Protocol, runtime_checkable

from websockets.asyncio.client import connect as ws_connect
from websockets.asyncio.connection import Connection
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.typing import Subprotocol

from qim.client.errors import TransportClosed, TransportError
from qim.schemas.frames import DEFAULT_MAX_FRAME_BYTES, HEADER_SIZE

__all__ = [
    "ALPN_QIM",
    "MAX_MESSAGE_BYTES",
    "MemoryNetwork",
    "MemoryTransport",
    "TlsTransport",
    "Transport",
    "WebSocketTransport",
    "tls_client_context",
]

ALPN_QIM: Final = "qim/1"  # §5.3.2: ALPN carries only qim/1 or http/1.1
MAX_MESSAGE_BYTES: Final = HEADER_SIZE + DEFAULT_MAX_FRAME_BYTES  # one websocket message
_READ_BYTES: Final = 64 * 1024  # B.5 stream_write_chunk_bytes: one read per chunk


@runtime_checkable
class Transport(Protocol):
    """Frame bytes in and out; ``message_framed`` says whether ``recv`` returns whole frames."""

    @property
    def message_framed(self) -> bool: ...

    async def send(self, data: bytes) -> None: ...

    async def recv(self) -> bytes: ...

    async def close(self) -> None: ...


class MemoryTransport:
    """One end of an in-memory pair; ``chunk_size`` cuts stream sends to exercise reassembly."""

    def __init__(
        self,
        inbox: asyncio.Queue[bytes | None],
        outbox: asyncio.Queue[bytes | None],
        *,
        message_framed: bool,
        chunk_size: int | None = None,
    ) -> None:
        if chunk_size is not None and chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        self._inbox = inbox
        self._outbox = outbox
        self._message_framed = message_framed
        self._chunk_size = None if message_framed else chunk_size
        self._closed = False
        self._eof = False

    @classmethod
    def pair(
        cls, *, message_framed: bool = True, chunk_size: int | None = None
    ) -> tuple[MemoryTransport, MemoryTransport]:
        """Two connected ends (client, server)."""
        a: asyncio.Queue[bytes | None] = asyncio.Queue()
        b: asyncio.Queue[bytes | None] = asyncio.Queue()
        return (
            cls(a, b, message_framed=message_framed, chunk_size=chunk_size),
            cls(b, a, message_framed=message_framed, chunk_size=chunk_size),
        )

    @property
    def message_framed(self) -> bool:
        return self._message_framed

    async def send(self, data: bytes) -> None:
        if self._closed or self._eof:
            raise TransportClosed("memory transport is closed")
        step = self._chunk_size or max(len(data), 1)
        for start in range(0, len(data), step):
            self._outbox.put_nowait(bytes(data[start : start + step]))

    async def recv(self) -> bytes:
        if self._closed or self._eof:
            raise TransportClosed("memory transport is closed")
        item = await self._inbox.get()
        if item is None:
            self._eof = True
            raise TransportClosed("peer closed the memory transport")
        return item

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._outbox.put_nowait(None)  # the peer's recv sees EOF
            self._inbox.put_nowait(None)  # wakes our own pending recv


Handler = Callable[[MemoryTransport], Coroutine[Any, Any, None]]


class MemoryNetwork:
    """In-process endpoints: ``listen("a", handler)`` then ``dial("memory://a")``.

    Each dial makes a :class:`MemoryTransport` pair and runs ``handler(server_end)`` as a task;
    pass ``network.dial`` as ``QimClient(dial=...)``.
    """

    def __init__(self, *, message_framed: bool = True, chunk_size: int | None = None) -> None:
        self._message_framed = message_framed
        self._chunk_size = chunk_size
        self._handlers: dict[str, Handler] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def listen(self, name: str, handler: Handler) -> str:
        """Register ``handler`` under ``name``; returns its URL ``memory://name``."""
        self._handlers[name] = handler
        return f"memory://{name}"

    async def dial(self, url: str) -> MemoryTransport:
        name = url.removeprefix("memory://")
        handler = self._handlers.get(name) if url.startswith("memory://") else None
        if handler is None:
            raise TransportError(f"nothing listens on {url!r}")
        client, server = MemoryTransport.pair(
            message_framed=self._message_framed, chunk_size=self._chunk_size
        )
        task = asyncio.create_task(handler(server), name=f"memory-server:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return client

    async def close(self) -> None:
        """Cancel the handler tasks still running."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class WebSocketTransport:
    """A websocket connection (either end) carrying one frame per binary message."""

    message_framed: Final = True

    def __init__(self, ws: Connection) -> None:
        self._ws = ws

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        open_timeout: float | None = 10.0,
        subprotocols: list[str] | None = None,
        proxy: str | Literal[True] | None = None,
    ) -> WebSocketTransport:
        """Open ``ws://`` or ``wss://`` (default TLS context for wss when none is given)."""
        secure = url.startswith("wss://")
        try:
            ws = await ws_connect(
                url,
                ssl=(ssl_context or ssl.create_default_context()) if secure else None,
                server_hostname=server_hostname if secure else None,
                open_timeout=open_timeout,
                max_size=MAX_MESSAGE_BYTES,
                compression=None,  # the frame header has its own COMPRESSED flag (A.1)
                subprotocols=None
                if subprotocols is None
                else [Subprotocol(p) for p in subprotocols],
                proxy=proxy,
            )
        except (OSError, InvalidHandshake, InvalidURI, TimeoutError) as exc:
            raise TransportError(f"websocket {url}: {exc}") from exc
        return cls(ws)

    async def send(self, data: bytes) -> None:
        try:
            await self._ws.send(data)
        except ConnectionClosed as exc:
            raise TransportClosed(f"websocket closed: {exc}") from None

    async def recv(self) -> bytes:
        try:
            message = await self._ws.recv(decode=False)
        except ConnectionClosed as exc:
            raise TransportClosed(f"websocket closed: {exc}") from None
        return message if isinstance(message, bytes) else message.encode()

    async def close(self) -> None:
        await self._ws.close()


def tls_client_context(cafile: str | None = None) -> ssl.SSLContext:
    """A verifying TLS 1.3 client context advertising ALPN ``qim/1`` (§5.3.5 rule 1)."""
    context = ssl.create_default_context(cafile=cafile)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.set_alpn_protocols([ALPN_QIM])
    return context


class TlsTransport:
    """A TLS (or plain, server side in tests) byte stream of frames."""

    message_framed: Final = False

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._closed = False

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        open_timeout: float | None = 10.0,
    ) -> TlsTransport:
        """Connect, handshake, and refuse any ALPN result but ``qim/1``.

        A caller's ``ssl_context`` gets ALPN ``qim/1`` set on it (the only protocol this
        transport speaks); without one, :func:`tls_client_context` is used.
        """
        context = ssl_context or tls_client_context()
        context.set_alpn_protocols([ALPN_QIM])
        try:
            async with asyncio.timeout(open_timeout):
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=context, server_hostname=server_hostname or host
                )
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            raise TransportError(f"tls {host}:{port}: {exc!r}") from exc
        transport = cls(reader, writer)
        ssl_object = writer.get_extra_info("ssl_object")
        selected = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
        if selected != ALPN_QIM:
            await transport.close()
            raise TransportError(f"tls {host}:{port}: server selected ALPN {selected!r}")
        return transport

    async def send(self, data: bytes) -> None:
        if self._closed or self._writer.is_closing():
            raise TransportClosed("tls stream is closed")
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (ConnectionError, ssl.SSLError) as exc:
            raise TransportClosed(f"tls stream: {exc!r}") from None

    async def recv(self) -> bytes:
        if self._closed:
            raise TransportClosed("tls stream is closed")
        try:
            data = await self._reader.read(_READ_BYTES)
        except (ConnectionError, ssl.SSLError) as exc:
            raise TransportClosed(f"tls stream: {exc!r}") from None
        if not data:
            raise TransportClosed("peer closed the tls stream")
        return data

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError, TimeoutError):
            async with asyncio.timeout(1.0):
                await self._writer.wait_closed()
