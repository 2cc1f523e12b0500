"""A tiny raw test client for the gateway (WebSocket and TLS/TCP + ALPN qim/1) and a harness.

Not the SDK (qim/client): it sends exactly the bytes a test asks for, including broken ones,
and decodes what comes back with the same codec the server uses (Role.CLIENT).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from qim.gateway.auth_memory import MemoryAuthenticator
from qim.gateway.config import GatewayConfig
from qim.gateway.node import ConnectionNode, wall_clock_ms
from qim.gateway.ownership.shards import ShardOwnership
from qim.gateway.ports import Authenticator, Ownership, PresenceSink
from qim.gateway.transport.tls import ALPN_QIM
from qim.params import Settings
from qim.schemas.frames import (
    Auth,
    AuthOk,
    Body,
    Frame,
    FrameDecoder,
    Ping,
    Pong,
    Role,
    UnknownFrame,
    encode_frame,
)

B = TypeVar("B", bound=Body)
TIMEOUT = 10.0


async def wait_until(predicate: Callable[[], bool], within: float = TIMEOUT) -> None:
    """Poll a condition with a deadline (never a fixed sleep): the node's bookkeeping runs on
    the same event loop, so each short yield lets it progress."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


class Closed(Exception):
    """The server closed the connection before the expected frame arrived."""


class RawClient:
    """Common API of both transports; ``frames`` keeps everything received, in order."""

    def __init__(self) -> None:
        self.decoder = FrameDecoder(Role.CLIENT)
        self.frames: list[Frame | UnknownFrame] = []

    async def send_raw(self, data: bytes) -> None:
        raise NotImplementedError

    async def _recv_frame(self) -> Frame | UnknownFrame:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def send(self, body: Body, request_id: int = 0, **kw: Any) -> None:
        await self.send_raw(encode_frame(body, request_id, **kw))

    async def recv(self, within: float = TIMEOUT) -> Frame | UnknownFrame:
        frame = await asyncio.wait_for(self._recv_frame(), within)
        self.frames.append(frame)
        return frame

    async def expect(self, model: type[B], within: float = TIMEOUT) -> B:
        """The next frame, which must be a ``model``."""
        frame = await self.recv(within)
        assert isinstance(frame, Frame) and isinstance(frame.body, model), frame
        return frame.body

    def bodies(self) -> list[Body]:
        """Bodies of every known frame received so far."""
        return [f.body for f in self.frames if isinstance(f, Frame)]

    async def refusal(self, within: float = TIMEOUT) -> list[Body]:
        """Everything received so far plus what arrives until the server closes."""
        before = self.bodies()
        return before + await self.expect_closed(within)

    async def expect_closed(self, within: float = TIMEOUT) -> list[Body]:
        """Read until the server closes; return the bodies received meanwhile."""
        bodies: list[Body] = []
        with contextlib.suppress(Closed):
            while True:
                frame = await self.recv(within)
                if isinstance(frame, Frame):
                    bodies.append(frame.body)
        return bodies

    async def login(
        self, token: str, device_id: str, request_id: int = 1, **kw: Any
    ) -> Frame | UnknownFrame:
        await self.send(Auth(access_token=token, device_id=device_id, **kw), request_id)
        return await self.recv()

    async def ping(self, ping_id: int = 1, request_id: int = 7) -> Pong:
        await self.send(Ping(ping_id=ping_id, client_time=wall_clock_ms()), request_id)
        return await self.expect(Pong)


class WsClient(RawClient):
    def __init__(self, ws: ClientConnection) -> None:
        super().__init__()
        self.ws = ws

    @classmethod
    async def connect(cls, url: str, ssl_ctx: ssl.SSLContext | None = None) -> WsClient:
        ws = await connect(
            url, ssl=ssl_ctx, compression=None, max_size=None, ping_interval=None, open_timeout=10
        )
        return cls(ws)

    async def send_raw(self, data: bytes) -> None:
        await self.ws.send(data)

    async def _recv_frame(self) -> Frame | UnknownFrame:
        while True:
            try:
                message = await self.ws.recv()
            except ConnectionClosed:
                raise Closed from None
            assert isinstance(message, bytes)
            frame = self.decoder.receive_message(message)
            if frame is not None:
                return frame

    async def close(self) -> None:
        await self.ws.close()


class TcpClient(RawClient):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        super().__init__()
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, host: str, port: int, ssl_ctx: ssl.SSLContext) -> TcpClient:
        reader, writer = await asyncio.open_connection(
            host, port, ssl=ssl_ctx, server_hostname="localhost"
        )
        return cls(reader, writer)

    @property
    def alpn(self) -> str | None:
        obj = self.writer.get_extra_info("ssl_object")
        return None if obj is None else obj.selected_alpn_protocol()

    async def send_raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def _recv_frame(self) -> Frame | UnknownFrame:
        while True:
            frame = self.decoder.next_frame()
            if frame is not None:
                return frame
            try:
                data = await self.reader.read(65536)
            except (ConnectionError, ssl.SSLError):
                data = b""
            if not data:
                raise Closed
            self.decoder.receive_data(data)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await self.writer.wait_closed()


def make_cert(directory: Path) -> tuple[Path, Path]:
    """A self-signed localhost certificate via the openssl CLI (no `cryptography` in the venv)."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    if not cert.exists():
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
             "-keyout", str(key), "-out", str(cert)],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
    return cert, key


def client_ssl(cert: Path, alpn: list[str] | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(cert))
    if alpn:
        ctx.set_alpn_protocols(alpn)
    return ctx


Mint = Callable[[str, str, str, int], Awaitable[str]]  # (tenant, user, device, ttl_ms) -> token


def memory_mint(auth: MemoryAuthenticator) -> Mint:
    async def mint(tenant: str, user: str, device: str, ttl_ms: int) -> str:
        return auth.issue_token(tenant, user, device, now_ms=wall_clock_ms(), ttl_ms=ttl_ms)

    return mint


@dataclass
class Gateway:
    """A running node plus what tests need to reach it."""

    node: ConnectionNode
    mint: Mint
    cert: Path | None = None

    @property
    def ws_url(self) -> str:
        scheme = "wss" if self.node.config.tls else "ws"
        return f"{scheme}://127.0.0.1:{self.node.listeners.ws_port}/"

    async def ws(self) -> WsClient:
        ctx = client_ssl(self.cert) if self.cert and self.node.config.tls else None
        return await WsClient.connect(self.ws_url, ctx)

    async def tcp(self, alpn: list[str] | None = None) -> TcpClient:
        assert self.cert is not None and self.node.listeners.tls_port is not None
        ctx = client_ssl(self.cert, [ALPN_QIM] if alpn is None else alpn)
        return await TcpClient.connect("127.0.0.1", self.node.listeners.tls_port, ctx)

    async def token(
        self, user: str, device: str, tenant: str = "t1", ttl_ms: int = 3_600_000
    ) -> str:
        return await self.mint(tenant, user, device, ttl_ms)

    async def online(
        self, user: str, device: str, tenant: str = "t1", client: RawClient | None = None
    ) -> tuple[RawClient, AuthOk]:
        """Connect (WebSocket unless ``client`` is given) and log in; AUTH_OK must come back."""
        client = client or await self.ws()
        frame = await client.login(await self.token(user, device, tenant), device)
        assert isinstance(frame, Frame) and isinstance(frame.body, AuthOk), frame
        return client, frame.body


@contextlib.asynccontextmanager
async def running_gateway(
    *,
    authenticator: Authenticator | None = None,
    mint: Mint | None = None,
    ownership: Ownership | None = None,
    presence: PresenceSink | None = None,
    cert: Path | None = None,
    node_id: str = "gw-test",
    settings: Settings | None = None,
    **config: Any,
) -> AsyncIterator[Gateway]:
    """A ConnectionNode on free loopback ports; stopped (connections closed) on exit."""
    cfg = GatewayConfig(
        node_id=node_id,
        settings=settings or Settings.load(env={}),
        certfile=cert,
        keyfile=None if cert is None else cert.with_name("key.pem"),
        **config,
    )
    if authenticator is None:
        memory = MemoryAuthenticator()
        authenticator, mint = memory, memory_mint(memory)
    assert mint is not None, "a custom authenticator needs its mint"
    node = ConnectionNode(cfg, authenticator, ownership=ownership, presence=presence)
    await node.start()
    try:
        yield Gateway(node, mint, cert)
    finally:
        await node.stop()


@contextlib.asynccontextmanager
async def owning_gateway(
    bootstrap: str, group: str, advertised: str, **gateway: Any
) -> AsyncIterator[Gateway]:
    """A :func:`running_gateway` that owns every ConnectionShard through its own consumer
    group (``group``), assigned before the node starts; the ownership stops after the node."""
    ownership = ShardOwnership(bootstrap, group, advertised)
    await ownership.start()
    try:
        await asyncio.wait_for(ownership.wait_assigned(), 60)
        async with running_gateway(ownership=ownership, kafka_bootstrap=bootstrap, **gateway) as gw:
            yield gw
    finally:
        await ownership.stop()
