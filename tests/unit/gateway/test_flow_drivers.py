"""Both drivers measure a real socket (spec 11.3.1): WebSocket and TLS/TCP over loopback.

A logged-in raw client that does not read is pushed to until its connection is DEGRADED --
which needs the driver's ``buffered_bytes`` and the kernel buffer (``SO_SNDBUF``) to show the
backlog -- then it reads everything and the connection is NORMAL again: recovery is driven by
bytes really leaving the socket, and the MAILBOX_DIRTY ERROR reached the client on stream 0.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from qim.core.push import FlowState
from qim.gateway.transport.connection import Connection
from qim.params import Settings
from qim.schemas.frames import Error, ErrorCode, Frame, PushEvents
from tests.gateway_support import Closed, Gateway, RawClient, make_cert, running_gateway
from tests.unit.gateway.flow_support import push

KiB = 1024
SETTINGS = Settings.load(
    overrides={
        "conn_send_soft_watermark": {"bytes": 64 * KiB, "items": 2000},
        "conn_send_hard_watermark": {"bytes": 64 * 1024 * KiB, "items": 8000},
        "conn_send_low_watermark": 16 * KiB,
    },
    env={},
)


def connection_of(gw: Gateway, user: str) -> Connection:
    (conn,) = [
        c
        for c in gw.node.connections.values()
        if c.session.grant is not None and c.session.grant.user_id == user
    ]
    return conn


async def flood_until_degraded(conn: Connection) -> int:
    seq = 0
    while conn.session.flow_state is FlowState.NORMAL:
        seq += 1
        assert seq < 5_000, "never DEGRADED: the backlog was not measured"
        conn.apply(conn.session.push(push(seq, 4 * KiB), conn.session.last_active_ms))
        if seq % 8 == 0:
            await asyncio.sleep(0.002)  # the writer moves pieces into the transport
    return seq


async def read_all(client: RawClient, conn: Connection) -> list[Frame]:
    """Read until a quiet second finds the connection recovered (NORMAL, MAILBOX_DIRTY seen);
    a quiet second alone is not enough on a loaded machine, so keep reading up to 30 s."""
    frames: list[Frame] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30.0
    while True:
        try:
            frame = await client.recv(within=1.0)
        except Closed:
            return frames
        except TimeoutError:
            recovered = conn.session.flow_state is FlowState.NORMAL
            if (recovered and any(isinstance(f.body, Error) for f in frames)) or (
                loop.time() > deadline
            ):
                return frames
            continue
        if isinstance(frame, Frame):
            frames.append(frame)


async def test_a_non_reading_client_is_degraded_and_recovers_once_it_reads(
    tmp_path: Path,
) -> None:
    cert, _ = make_cert(tmp_path)
    async with running_gateway(
        cert=cert, settings=SETTINGS, tls_port=0, socket_send_buffer_bytes=8 * KiB
    ) as gw:
        ws_client, _ = await gw.online("wendy", "phone")
        tcp_client, _ = await gw.online("tom", "phone", client=await gw.tcp())
        for user, client in (("wendy", ws_client), ("tom", tcp_client)):
            conn = connection_of(gw, user)
            pushed = await flood_until_degraded(conn)
            assert conn.outbound.queued_pushes == 0  # the pending real-time queue dropped
            frames = await read_all(client, conn)  # the client reads again
            assert conn.session.flow_state is FlowState.NORMAL, user
            errors = [f.body for f in frames if isinstance(f.body, Error)]
            # one MAILBOX_DIRTY per degradation: on a loaded machine a first one can end during
            # the flood's pauses (the peer's kernel receive buffer still takes bytes) and the
            # flood degrades it again; never any other ERROR
            codes = [e.code for e in errors]
            assert codes and set(codes) == {ErrorCode.MAILBOX_DIRTY}, (user, codes)
            got = [e.mailbox_seq for f in frames if isinstance(f.body, PushEvents)
                   for e in f.body.events]  # fmt: skip
            assert got == sorted(got) and 0 < len(got) < pushed, user  # in order, some dropped
            await client.close()
