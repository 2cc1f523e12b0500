"""Online push end to end (issue 6, gateway side): PushBatch -> PUSH_EVENTS on live sockets.

The setup of ``test_login_sync``: real conversation and mailbox workers, a routing gateway
with login sync (it also publishes presence), the SDK over WebSocket. Every device is past
ONLINE_READY before the message is sent, so the gateway's barrier has released its pushes.

Spec: 11.1.1 (expansion, one event per device), 7.3 (the sender's echo carries
client_message_id), 15.1.1 (PONG.last_pushed_user_seq >= every pushed mailbox_seq).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from qim.client import Identity, SyncResult, login_and_sync
from qim.devstack.stack import Stack
from qim.schemas.frames import PushEvents, SyncEntry
from tests.gateway_support import Gateway
from tests.integration.test_login_sync import WAIT_S, new_client, pipeline, syncing_gateway

pytestmark = pytest.mark.integration


class Device:
    """One online device and every PUSH_EVENTS entry it received (raw, not deduplicated)."""

    def __init__(self, result: SyncResult) -> None:
        self.result = result
        self.entries: list[SyncEntry] = []
        self.frames = 0
        self._task = asyncio.create_task(self._collect())

    async def _collect(self) -> None:
        async for frame in self.result.client.events():
            if isinstance(frame.body, PushEvents):
                self.frames += 1
                self.entries.extend(frame.body.events)

    def of(self, message_id: bytes) -> list[SyncEntry]:
        return [e for e in self.entries if e.message_id == message_id]

    async def close(self) -> None:
        await self.result.client.close()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self._task, 5)


@contextlib.asynccontextmanager
async def online(gw: Gateway, tenant: str, user: str, device: str) -> AsyncIterator[Device]:
    token = await gw.token(user, device, tenant)
    result = await login_and_sync(new_client(), gw.ws_url, token, device)
    result.client.identity = Identity(tenant, user)
    dev = Device(result)
    try:
        yield dev
    finally:
        await dev.close()


async def until(check: Callable[[], bool], what: str, within: float = WAIT_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not check():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.1)


async def test_a_group_message_is_pushed_once_to_every_online_device(
    stack: Stack, tmp_path: Path
) -> None:
    tenant, group = f"t-push-{uuid.uuid4().hex[:6]}", f"g:push-{uuid.uuid4().hex[:8]}"
    async with (
        pipeline(stack, tmp_path),
        syncing_gateway(stack, "gw-push") as gw,
        online(gw, tenant, "alice", "phone") as alice,
        online(gw, tenant, "alice", "tablet") as alice_tablet,
        online(gw, tenant, "bob", "phone") as bob_phone,
        online(gw, tenant, "bob", "tablet") as bob_tablet,
    ):
        sender = alice.result.client
        await sender.create_group(group, ("bob", "carol"))
        receivers = (alice_tablet, bob_phone, bob_tablet)

        # Presence reaches the MailboxNode asynchronously: warm up until every device has
        # been pushed something, so the message under test meets a warm presence cache.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        for i in range(1000):
            await sender.send_message(group, f"w{i}".encode(), client_message_id=f"w{i}")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2):
                    await until(lambda: all(d.entries for d in receivers), "warm-up")
                break
            assert loop.time() < deadline, "no device was ever pushed a message"

        ack = await sender.send_message(group, b"hello", client_message_id="hello")
        mid = ack.message_id
        everyone = (alice, *receivers)
        await until(lambda: all(d.of(mid) for d in everyone), "the message was not pushed")
        await asyncio.sleep(1.0)  # a duplicate would arrive by now

        for device in receivers:
            got = device.of(mid)
            assert len(got) == 1, got
            assert got[0].payload_or_ciphertext == b"hello"
        # the echo: the sender's own mailbox entry (every device of alice) carries the
        # client_message_id, so the sending device upgrades its pending bubble (7.3)
        for device in (bob_phone, bob_tablet):
            assert device.of(mid)[0].client_message_id is None
        for device in (alice, alice_tablet):
            echo = device.of(mid)
            assert len(echo) == 1 and echo[0].client_message_id == "hello"

        for device in everyone:
            entry = device.of(mid)[0]
            pong = await device.result.client.ping(timeout=10)
            assert pong.last_pushed_user_seq >= entry.mailbox_seq
            assert not pong.mailbox_dirty
            # the SDK's dedup: a repeated push of the same entry yields nothing new
            again = PushEvents(events=(entry,), last_pushed_user_seq=entry.mailbox_seq)
            first, second = device.result.on_push(again), device.result.on_push(again)
            assert [e.message_id for e in first] == [mid] and second == []
