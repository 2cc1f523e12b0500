"""One vector suite over every transport (§5.3.5 rule 4: TCP and WS share one codec; CI runs the
same vectors over both), in the spirit of trio's ``check_two_way_stream``.

Transports: in-memory message-framed, in-memory byte stream cut into 7-octet chunks, ``ws://``,
``wss://`` and ``qim+tls://`` (TLS 1.3 + ALPN qim/1) against listeners this test starts on
127.0.0.1 with OS-assigned ports and a throwaway self-signed certificate.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve

from qim.client import (
    MAX_MESSAGE_BYTES,
    FramedConnection,
    HeartbeatConfig,
    MemoryNetwork,
    QimClient,
    TlsTransport,
    Transport,
    TransportClosed,
    TransportError,
    WebSocketTransport,
    encode_auth,
    open_transport,
    tls_client_context,
)
from qim.schemas.frames import (
    Auth,
    AuthOk,
    Capability,
    Frame,
    MailboxBatch,
    MailboxCursor,
    Ping,
    Pong,
    Role,
    SyncEntry,
    encode_frame,
)

from .conftest import Cert
from .fake_server import DEFAULT_AUTH_OK, FakeServer, frame_bytes_of

KINDS = ["memory", "memory-stream", "ws", "wss", "qim+tls"]
NOW_MS = 1_700_000_000_500
Handler = Callable[[Transport], Coroutine[Any, Any, None]]


def server_tls(cert: Cert, alpn: list[str] | None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_cert_chain(cert.certfile, cert.keyfile)
    if alpn is not None:
        context.set_alpn_protocols(alpn)
    return context


@asynccontextmanager
async def serving(
    kind: str, handler: Handler, cert: Cert
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """A listener of ``kind`` running ``handler``; yields (url, QimClient options)."""
    if kind.startswith("memory"):
        net = MemoryNetwork(message_framed=kind == "memory", chunk_size=7)
        try:
            yield net.listen("gw", handler), {"dial": net.dial}
        finally:
            await net.close()
    elif kind in ("ws", "wss"):

        async def on_ws(ws: ServerConnection) -> None:
            await handler(WebSocketTransport(ws))

        secure = kind == "wss"
        tls = server_tls(cert, None) if secure else None
        async with serve(on_ws, "127.0.0.1", 0, ssl=tls, compression=None) as server:
            port = server.sockets[0].getsockname()[1]
            options = {"ssl_context": ssl.create_default_context(cafile=cert.certfile)}
            yield f"{kind}://127.0.0.1:{port}/im", options if secure else {}
    else:

        async def on_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await handler(TlsTransport(reader, writer))

        listener = await asyncio.start_server(
            on_stream, "127.0.0.1", 0, ssl=server_tls(cert, ["qim/1"])
        )
        async with listener:
            port = listener.sockets[0].getsockname()[1]
            yield (
                f"qim+tls://127.0.0.1:{port}",
                {"ssl_context": tls_client_context(cafile=str(cert.certfile))},
            )


async def dial(url: str, options: dict[str, Any]) -> Transport:
    if "dial" in options:
        transport: Transport = await options["dial"](url)
        return transport
    return await open_transport(url, ssl_context=options.get("ssl_context"))


# -- the AUTH / PING vectors --------------------------------------------------------------------

AUTH_VECTOR = {
    "access_token": "tok-é",
    "device_id": "phone-1",
    "client_version": "qim-py/vector",
    "capabilities": Capability.E2EE | Capability.COMPRESSION,
    "cursor": MailboxCursor(token=b"\x00sig\xff", last_applied_mailbox_seq=2**40 + 1),
}
AUTH_WIRE = encode_auth(
    access_token="tok-é",
    device_id="phone-1",
    client_version="qim-py/vector",
    capabilities=3,
    mailbox_cursor=MailboxCursor(token=b"\x00sig\xff", last_applied_mailbox_seq=2**40 + 1),
    request_id=1,
)
# (last_applied_mailbox_seq, probe) -> PING ping_id n (= request_id n) and its PONG.
PING_VECTORS = [(0, False), (2**63 + 5, False), (7, True)]


@pytest.mark.parametrize("kind", KINDS)
async def test_auth_and_ping_vectors_are_identical_on_every_transport(
    kind: str, cert: Cert
) -> None:
    server = FakeServer(last_pushed_user_seq=99, mailbox_dirty=True)
    async with serving(kind, server.handle, cert) as (url, options):
        client = QimClient(
            heartbeat=HeartbeatConfig(enabled=False), clock_ms=lambda: NOW_MS, **options
        )
        async with client:
            assert await client.connect(url, **AUTH_VECTOR) == DEFAULT_AUTH_OK  # type: ignore[arg-type]
            pongs: list[Pong] = []
            for seq, probe in PING_VECTORS:
                client.last_applied_mailbox_seq = seq
                pongs.append(await client.ping(probe=probe, timeout=2))
            received = (await server.session()).received
    assert frame_bytes_of(server.auth_frames[0]) == AUTH_WIRE
    expected_pings = [
        Ping(ping_id=n, client_time=NOW_MS, last_applied_mailbox_seq=seq, probe=probe)
        for n, (seq, probe) in enumerate(PING_VECTORS, start=1)
    ]
    assert [frame_bytes_of(f) for f in received] == [
        encode_frame(p, request_id=n) for n, p in enumerate(expected_pings, start=1)
    ]
    assert pongs == [server.pong_for(p) for p in expected_pings]
    assert client.heartbeat.last_pushed_user_seq == 99 and client.heartbeat.mailbox_dirty


# -- the transport contract -------------------------------------------------------------------


@asynccontextmanager
async def transport_pair(kind: str, cert: Cert) -> AsyncIterator[tuple[Transport, Transport]]:
    """(client end, server end) of one connection of ``kind``."""
    accepted: asyncio.Queue[Transport] = asyncio.Queue()
    done = asyncio.Event()

    async def hold(transport: Transport) -> None:
        await accepted.put(transport)
        await done.wait()

    async with serving(kind, hold, cert) as (url, options):
        client = await dial(url, options)
        server = await asyncio.wait_for(accepted.get(), 2)
        try:
            yield client, server
        finally:
            done.set()
            await client.close()
            await server.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_frames_cross_both_ways_intact_even_above_one_mebibyte(kind: str, cert: Cert) -> None:
    big = MailboxBatch(
        entries=tuple(
            SyncEntry(mailbox_seq=i, body_included=True, payload_or_ciphertext=bytes(64 * 1024))
            for i in range(24)
        ),
        has_more=True,
    )
    async with transport_pair(kind, cert) as (client_end, server_end):
        assert (
            client_end.message_framed
            is server_end.message_framed
            is (kind not in ("memory-stream", "qim+tls"))
        )
        client = FramedConnection(client_end, Role.CLIENT)
        server = FramedConnection(server_end, Role.SERVER)
        await client.send(Auth(device_id="d"), request_id=1)
        await client.send(Ping(ping_id=2), request_id=2)
        got = [await server.recv(), await server.recv()]
        await server.send(AuthOk(session_epoch=3), request_id=1)
        await server.send(big)
        back = [await client.recv(), await client.recv()]
    assert [f.body for f in got if isinstance(f, Frame)] == [Auth(device_id="d"), Ping(ping_id=2)]
    assert [f.body for f in back if isinstance(f, Frame)] == [AuthOk(session_epoch=3), big]
    assert len(encode_frame(big)) > 1024 * 1024 and len(encode_frame(big)) < MAX_MESSAGE_BYTES


@pytest.mark.parametrize("kind", KINDS)
async def test_peer_close_ends_recv_and_own_close_ends_send(kind: str, cert: Cert) -> None:
    async with transport_pair(kind, cert) as (client_end, server_end):
        await server_end.close()
        with pytest.raises(TransportClosed):
            async with asyncio.timeout(2):
                await client_end.recv()
        await client_end.close()
        with pytest.raises(TransportClosed):
            await client_end.send(b"x")


@pytest.mark.parametrize("alpn", [None, ["http/1.1"]])
async def test_tls_refuses_a_server_that_does_not_select_qim_1_5_3_5(
    alpn: list[str] | None, cert: Cert
) -> None:
    async def on_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    listener = await asyncio.start_server(on_stream, "127.0.0.1", 0, ssl=server_tls(cert, alpn))
    async with listener:
        port = listener.sockets[0].getsockname()[1]
        with pytest.raises(TransportError, match="ALPN"):
            await TlsTransport.connect(
                "127.0.0.1", port, ssl_context=tls_client_context(str(cert.certfile))
            )


async def test_tls_verifies_the_certificate_by_default(cert: Cert) -> None:
    async def on_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    tls = server_tls(cert, ["qim/1"])
    listener = await asyncio.start_server(on_stream, "127.0.0.1", 0, ssl=tls)
    async with listener:
        port = listener.sockets[0].getsockname()[1]
        with pytest.raises(TransportError):
            await open_transport(f"qim+tls://127.0.0.1:{port}")  # self-signed: not trusted
