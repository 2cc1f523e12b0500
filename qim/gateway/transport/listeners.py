"""Start and stop a node's listeners: WebSocket, TLS/TCP (ALPN qim/1), and /metrics.

``/metrics`` is prometheus-client's own HTTP server on a thread, bound to 127.0.0.1 by
default and serving the node's private registry.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from prometheus_client import start_http_server

from qim.gateway.transport.tcp import start_tcp_server
from qim.gateway.transport.ws import start_ws_server

if TYPE_CHECKING:
    from websockets.asyncio.server import Server

    from qim.gateway.node import ConnectionNode

__all__ = ["Listeners"]


class Listeners:
    """The bound ports after ``start()``: ``ws_port``, ``tls_port``, ``metrics_port``."""

    def __init__(self, node: ConnectionNode) -> None:
        self.node = node
        self.ws_port: int | None = None
        self.tls_port: int | None = None
        self.metrics_port: int | None = None
        self._ws: Server | None = None
        self._tcp: asyncio.Server | None = None
        self._http: Any = None

    async def start(self) -> None:
        cfg = self.node.config
        if cfg.ws_port is not None:
            self._ws = await start_ws_server(self.node)
            self.ws_port = _port(self._ws.sockets)
        if cfg.tls_port is not None:
            self._tcp = await start_tcp_server(self.node)
            self.tls_port = _port(self._tcp.sockets)
        if cfg.metrics_port is not None:
            self._http, _thread = start_http_server(
                cfg.metrics_port, cfg.metrics_host, registry=self.node.metrics.registry
            )
            self.metrics_port = int(self._http.server_port)

    async def stop_accepting(self) -> None:
        if self._ws is not None:
            self._ws.close(close_connections=False)
        if self._tcp is not None:
            self._tcp.close()

    async def wait_closed(self, timeout_s: float = 5.0) -> None:
        """Wait for the node's connections to finish, then for the servers."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.node.drained.wait(), timeout_s)
        with contextlib.suppress(TimeoutError):
            if self._ws is not None:
                await asyncio.wait_for(self._ws.wait_closed(), timeout_s)
            if self._tcp is not None:
                await asyncio.wait_for(self._tcp.wait_closed(), timeout_s)

    async def stop_metrics(self) -> None:
        if self._http is not None:
            await asyncio.to_thread(self._http.shutdown)
            self._http.server_close()
            self._http = None


def _port(sockets: Any) -> int:
    return int(next(iter(sockets)).getsockname()[1])
