"""Online push end to end (issue 6, gateway side): PushBatch -> PUSH_EVENTS on live sockets.

The setup of ``test_login_sync``: real conversation and mailbox workers, a routing gateway
with login sync (it also publishes presence), the SDK over WebSocket. Every device is past
ONLINE_READY before the message is sent, so the gateway's barrier has released its pushes.

Spec: 11.1.1 (expansion, one event per device), 7.3 (the sender's echo carries
client_message_id), 15.1.1 (PONG.last_pushed_user_seq >= every pushed mailbox_seq).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from qim.devstack.stack import Stack
from qim.schemas.frames import PushEvents
from tests.integration.login_support import pipeline, syncing_gateway
from tests.integration.online_support import barrier, online, until, warm_up

pytestmark = pytest.mark.integration


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

        await warm_up(
            lambda i: sender.send_message(group, f"w{i}".encode(), client_message_id=f"w{i}"),
            receivers,
        )

        ack = await sender.send_message(group, b"hello", client_message_id="hello")
        mid = ack.message_id
        everyone = (alice, *receivers)
        await until(lambda: all(d.of(mid) for d in everyone), "the message was not pushed")
        # a later message of the group pushed to every device: a duplicate of "hello" would
        # have reached each socket before it (pushes of one conversation in log order)
        await barrier(everyone, sender.send_message(group, b"later", client_message_id="later"))

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
            # the SDK's dedup: delivered once, and a repeated push of it yields nothing new
            assert len(device.got(mid)) == 1
            again = PushEvents(events=(entry,), last_pushed_user_seq=entry.mailbox_seq)
            assert device.result.on_push(again) == []
