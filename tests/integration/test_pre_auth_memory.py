"""Issue 15.2 on a real gateway process: unauthenticated connections cannot pin memory.

Each attacker opens a WebSocket and, without AUTH, sends FRAGMENTED pieces of a non-AUTH frame
on every stream (the issue's 8 x 4 MiB per connection), or one whole 4 MiB message. Before the
fix the gateway reassembled all of it (8 connections: 65 -> 437 MB, never returned). Now the
first piece past one AUTH frame's size closes the connection (1009 from websockets for an
oversized message, a protocol close from the decoder for a growing reassembly), and the
gateway's RSS stays within a bound of what it was before, also after the connections are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from qim.bench.procstats import read_sample
from qim.devstack import procs
from qim.devstack.stack import GatewaySpec, Stack
from qim.schemas.frames import SendMessage, encode_frame
from qim.schemas.frames.header import FrameFlags, FrameHeader

pytestmark = pytest.mark.integration

ATTACKERS = 16
STREAMS = 8
PIECE = 16 * 1024  # one piece of a fragmented body (the gateway itself writes 64 KiB pieces)
FRAME = 4 * 1024 * 1024
RSS_BOUND = 48 * 1024 * 1024  # far below the 16 x 32 MiB the attack asked the gateway to hold


def _piece(stream: int, *, more: bool, size: int = PIECE) -> bytes:
    """A SEND_MESSAGE piece (not AUTH) of ``size`` zero octets; FRAGMENTED when ``more``."""
    header = FrameHeader(
        opcode=0x0201,  # SEND_MESSAGE (A.2)
        body_len=size,
        request_id=7,
        stream_id=stream,
        flags=int(FrameFlags.FRAGMENTED) if more else 0,
    )
    return header.pack() + b"\x00" * size


@pytest.fixture(scope="module")
def gateway(stack: Stack) -> Iterator[tuple[str, int]]:
    spec = GatewaySpec(name="gw-preauth", ws_port=procs.free_port(), metrics_port=procs.free_port())
    stack.start_gateway(spec)
    pid = procs.read_pid(stack.cfg.base_dir / "gateways" / spec.name / "gateway.pid")
    assert pid is not None
    try:
        yield spec.url, pid
    finally:
        stack.stop_gateway(spec)


def _rss(pid: int) -> int:
    sample = read_sample(pid)
    assert sample is not None, "the gateway process is gone"
    return sample.rss_bytes


async def _attack(url: str, pieces: list[bytes]) -> int | None:
    """Send until the gateway closes; returns the close code (None: it never closed)."""
    ws = await connect(url, max_size=None, open_timeout=30)
    try:
        for piece in pieces:
            await ws.send(piece)
        await asyncio.wait_for(ws.recv(), timeout=30)  # a refusal frame, then the close
        await asyncio.wait_for(ws.recv(), timeout=30)
    except ConnectionClosed:
        pass
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ws.wait_closed(), timeout=30)
    code = ws.close_code
    if code is None:
        await ws.close()
    return code


async def test_unauthenticated_fragment_floods_are_closed_and_memory_stays_bounded(
    gateway: tuple[str, int],
) -> None:
    url, pid = gateway
    per_stream = FRAME // PIECE
    fragmented = [_piece(s, more=True) for _ in range(per_stream) for s in range(STREAMS)]
    before = _rss(pid)
    codes = await asyncio.gather(*(_attack(url, fragmented) for _ in range(ATTACKERS)))
    assert all(code is not None for code in codes), codes
    during = _rss(pid)
    assert during <= before + RSS_BOUND, (before, during)

    whole = [_piece(0, more=False, size=FRAME)]
    codes = await asyncio.gather(*(_attack(url, whole) for _ in range(ATTACKERS)))
    assert all(code == 1009 for code in codes), codes  # message too big, refused while read
    after = _rss(pid)
    assert after <= before + RSS_BOUND, (before, after)


async def test_close_codes_follow_rfc_6455(gateway: tuple[str, int]) -> None:
    """A broken header closes with 1002 (protocol error), a non-AUTH first frame with 1008."""
    url, _ = gateway
    broken = bytearray(_piece(0, more=False, size=8))
    broken[19] ^= 0xFF  # the header's CRC32C no longer matches
    assert await _attack(url, [bytes(broken)]) == 1002
    assert await _attack(url, [encode_frame(SendMessage(), 3)]) == 1008
