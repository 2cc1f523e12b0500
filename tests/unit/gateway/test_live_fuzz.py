"""A live fuzz over a real WebSocket listener (no Kafka): random payloads on fresh connections
while a well-behaved connection keeps getting PONGs, and the node's memory stays bounded."""

from __future__ import annotations

import asyncio
import gc
import random
import tracemalloc

from qim.gateway.presence_writer import MemoryPresence
from qim.params import Settings
from qim.schemas.frames import Pong
from tests.gateway_support import Closed, Gateway, RawClient, running_gateway, wait_until
from tests.unit.gateway.test_fuzz import malformed

FAST = Settings.load(
    overrides={"per_ip_connect_rate": {"count": 100_000, "period_ms": 1000}}, env={}
)


async def throw(gw: Gateway, payload: bytes) -> None:
    client = await gw.ws()
    try:
        await client.send_raw(payload)
        await client.expect_closed(within=5)
    except (Closed, ConnectionError):
        pass
    finally:
        await client.close()


async def test_server_keeps_serving_and_memory_stays_bounded_under_random_payloads() -> None:
    rng = random.Random(4242)
    presence = MemoryPresence()
    async with running_gateway(
        settings=FAST, presence=presence, unauth_connection_timeout_ms=1000, wheel_tick_ms=100
    ) as gw:
        good, ok = await gw.online("alice", "phone")
        assert isinstance(good, RawClient)
        tracemalloc.start()
        try:
            baseline = 0
            for round_no in range(12):
                payloads = [malformed(rng) for _ in range(25)]
                await asyncio.gather(*(throw(gw, p) for p in payloads))
                pong = await good.ping(ping_id=round_no)
                assert isinstance(pong, Pong) and pong.ping_id == round_no
                if round_no == 1:  # after warm-up: imports, caches, first buffers
                    await wait_until(lambda: len(gw.node.connections) == 1)
                    gc.collect()
                    baseline = tracemalloc.get_traced_memory()[0]
            await wait_until(lambda: len(gw.node.connections) == 1)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - baseline
        finally:
            tracemalloc.stop()
        assert grown < 2 * 1024 * 1024, f"node memory grew by {grown} octets over 250 connections"
        assert gw.node.admission.connections("127.0.0.1") == 1
        assert len(gw.node.registry) == 1 and ok.session_epoch == 1
        await good.close()
