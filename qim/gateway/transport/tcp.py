"""The TLS-over-TCP driver with ALPN ``qim/1`` (§5.3.5): a byte stream into the same Session.

The socket is accepted in plain TCP, admitted per IP, and only then upgraded with
``start_tls``: a refused peer costs no TLS handshake and gets no app frame (§20.4.1). The
handshake is bounded by ``unauth_connection_timeout`` (slowloris, §15.2.3). A peer that did not
negotiate ``qim/1`` is closed. ``buffered_bytes`` reads the TLS transport's write buffer
for flow control (11.3); ``socket_send_buffer_bytes`` caps the kernel's (C11).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import socket
import struct
import termios
from typing import TYPE_CHECKING, Any

from qim.gateway.transport.connection import Connection
from qim.gateway.transport.tls import ALPN_QIM, server_context

if TYPE_CHECKING:
    from qim.gateway.node import ConnectionNode

__all__ = ["TcpTransport", "limit_send_buffer", "start_tcp_server"]

log = logging.getLogger(__name__)
_READ_BYTES = 64 * 1024


def limit_send_buffer(sock: Any, size: int | None) -> None:
    """``SO_SNDBUF`` of an accepted socket (11.3, C11): bytes the kernel holds are invisible to
    flow control and sit in front of any later PONG, so a gateway may keep them few."""
    if sock is None or size is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)


def kernel_unacked(sock: Any) -> int | None:
    """Bytes the kernel still holds for the peer, sent or not, that the peer's TCP has not
    acknowledged (Linux ``SIOCOUTQ``); None where it cannot be read. 0 after data went out
    means the peer's kernel has it: 16.1.2's "the connection is alive" evidence."""
    if sock is None:
        return None
    try:
        fd = sock.fileno()
        if fd < 0:
            return None
        buf = fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0")
    except (OSError, ValueError, AttributeError):
        return None
    return int(struct.unpack("i", buf)[0])


class TcpTransport:
    """Pieces go out in one write each batch (frames are atomic on the stream)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer

    async def send(self, pieces: list[bytes]) -> None:
        self.writer.write(b"".join(pieces))
        await self.writer.drain()

    def buffered_bytes(self) -> int:
        """The (TLS) transport's write buffer: what ``drain`` has not pushed to the socket."""
        return int(self.writer.transport.get_write_buffer_size())

    def unacked_bytes(self) -> int | None:
        return kernel_unacked(self.writer.get_extra_info("socket"))

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


async def start_tcp_server(node: ConnectionNode) -> asyncio.Server:
    cfg = node.config
    assert cfg.certfile is not None and cfg.keyfile is not None  # GatewayConfig checks it
    ctx = server_context(cfg.certfile, cfg.keyfile, [ALPN_QIM])
    handshake_s = cfg.session_config().unauth_timeout_ms / 1000

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        peer = str(peername[0]) if peername else ""
        if not node.admit(peer):
            writer.transport.abort()
            return
        limit_send_buffer(writer.get_extra_info("socket"), cfg.socket_send_buffer_bytes)
        try:
            await writer.start_tls(ctx, ssl_handshake_timeout=handshake_s)
            ssl_object = writer.get_extra_info("ssl_object")
            alpn = None if ssl_object is None else ssl_object.selected_alpn_protocol()
        except (OSError, TimeoutError, ConnectionError) as exc:
            log.debug("TLS handshake with %s failed: %r", peer, exc)
            writer.transport.abort()
            node.release(peer)
            return
        if alpn != ALPN_QIM:
            node.metrics.refused.labels(reason="alpn").inc()
            writer.transport.abort()
            node.release(peer)
            return
        conn = node.attach(TcpTransport(writer), peer)

        async def read(c: Connection) -> None:
            while not c.closing:
                data = await reader.read(_READ_BYTES)
                if not data:
                    return
                c.feed_data(data)

        await conn.run(read)

    return await asyncio.start_server(on_client, cfg.host, cfg.tls_port)
