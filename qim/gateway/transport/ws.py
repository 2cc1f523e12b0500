"""The WebSocket driver: binary messages, one frame (or frame piece) per message (§5.3.5).

Thin on purpose: admission at the HTTP upgrade, then bytes to the Connection. The library's
own keepalive pings and permessage-deflate are off: the protocol has PING/PONG with
server-issued intervals (§15.1) and its own COMPRESSED flag (A.1). ``max_size`` is one frame
of ``max_frame_bytes``; the decoder still judges ``body_len`` before decoding (§20.1).
``buffered_bytes`` reads the transport's write buffer for flow control (11.3).
"""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus
from typing import TYPE_CHECKING

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from qim.gateway.actions import CloseReason, ws_close_code
from qim.gateway.transport.connection import Connection
from qim.gateway.transport.tcp import kernel_unacked, limit_send_buffer
from qim.gateway.transport.tls import ALPN_HTTP, server_context
from qim.schemas.frames.header import HEADER_SIZE

if TYPE_CHECKING:
    from qim.gateway.node import ConnectionNode

__all__ = ["WsTransport", "start_ws_server"]


class WsTransport:
    """Each piece is one binary message; websockets' closes become ConnectionError."""

    def __init__(self, ws: ServerConnection) -> None:
        self.ws = ws
        self.reason: Callable[[], CloseReason | None] = lambda: None  # set once attached

    async def send(self, pieces: list[bytes]) -> None:
        try:
            for piece in pieces:
                await self.ws.send(piece)
        except ConnectionClosed as exc:
            raise ConnectionError(str(exc)) from None

    def buffered_bytes(self) -> int:
        """The asyncio transport's write buffer: ``send`` returns once it is under the
        library's high-water mark, so this is what has not reached the socket yet."""
        transport = self.ws.transport
        return 0 if transport is None else int(transport.get_write_buffer_size())

    def unacked_bytes(self) -> int | None:
        transport = self.ws.transport
        return None if transport is None else kernel_unacked(transport.get_extra_info("socket"))

    async def close(self) -> None:
        """Close with the RFC 6455 code of the session's close reason (``ws_close_code``)."""
        await self.ws.close(code=ws_close_code(self.reason()))


def _peer_ip(ws: ServerConnection) -> str:
    address = ws.remote_address
    return str(address[0]) if address else ""


async def start_ws_server(node: ConnectionNode) -> Server:
    cfg = node.config
    ssl_ctx = None
    if cfg.certfile is not None and cfg.keyfile is not None:
        ssl_ctx = server_context(cfg.certfile, cfg.keyfile, [ALPN_HTTP])

    pre_auth_bytes = HEADER_SIZE + cfg.session_config().limits.pre_auth_max_frame_bytes

    def process_request(ws: ServerConnection, request: Request) -> Response | None:
        if node.check(_peer_ip(ws)):
            return None
        return ws.respond(HTTPStatus.TOO_MANY_REQUESTS, "")  # no app frame (§20.4.1)

    async def handler(ws: ServerConnection) -> None:
        peer = _peer_ip(ws)
        node.acquire(peer)
        limit_send_buffer(ws.transport.get_extra_info("socket"), cfg.socket_send_buffer_bytes)
        transport = WsTransport(ws)
        conn = node.attach(transport, peer)
        transport.reason = lambda: conn.session.close_reason
        # Before AUTH_OK websockets itself may hold no more than one AUTH frame: a larger
        # message is refused while it is read (close 1009), never buffered (issue 15.2).
        protocol = ws.protocol
        protocol.max_message_size = pre_auth_bytes

        def lift() -> None:
            protocol.max_message_size = cfg.max_message_bytes

        conn.on_authenticated = lift

        async def read(c: Connection) -> None:
            try:
                async for message in ws:
                    if isinstance(message, str):  # binary only: a text frame is a violation
                        c.apply(c.session.shutdown(CloseReason.PROTOCOL_ERROR, node.clock_ms()))
                    else:
                        c.feed_message(message)
                    if c.closing:
                        return
            except ConnectionClosed:
                return

        await conn.run(read)

    return await serve(
        handler,
        cfg.host,
        cfg.ws_port,
        ssl=ssl_ctx,
        process_request=process_request,
        compression=None,
        ping_interval=None,
        max_size=cfg.max_message_bytes,
        open_timeout=cfg.session_config().unauth_timeout_ms / 1000,
        close_timeout=cfg.close_flush_timeout_ms / 1000,
    )
