"""An E2EE conversation end to end (issue 23, spec 22.2): keys, sessions, one body ciphertext.

Real pieces: Kafka, `faust worker`s of `qim.apps.conversation`, `qim.apps.mailbox` and
`qim.apps.keys`, one syncing gateway with prekeys on, SDK clients over WebSocket. alice and
bob have two devices each. Every device publishes its bundle; alice's phone fetches bob's two
devices and her own laptop, opens an X3DH + Double Ratchet session with each (the SDK's
reference code) and sends the conversation's sender key to each as a key-distribution message,
then one message whose body is sealed once with that sender key. The server stores and delivers
the ciphertext byte for byte (read back from history and from a fresh login's mailbox), never
the plaintext, and each of the three other devices decrypts it.

Until device-filtered ``E2EE_KEY_DIST`` CONTROL events exist (22.2), the key distribution
travels as a tenant-declared custom type, ``e2ee.key_dist.v1``, with the flags 22.2 gives
E2EE_KEY_DIST (no unread, no session order, not on the timeline); every device of the
conversation receives it in its mailbox and opens only its own envelope.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from qim.client.e2ee import DeviceKeys
from qim.client.e2ee_session import KeyDistribution, accept, initiate, open_sealed, seal
from qim.devstack.stack import CONVERSATION_PARTITION_COUNT, PREKEY_PARTITION_COUNT, Stack
from qim.gateway.ownership.shards import ShardOwnership
from qim.schemas.frames import SyncEntry
from tests.gateway_support import Gateway, running_gateway
from tests.integration.device_support import login
from tests.integration.mailbox_support import Node as MailboxWorker
from tests.integration.test_admin_groups import WRITER_ENV, writer_serving
from tests.integration.test_gateway_routing import SETTINGS
from tests.integration.workers import FaustWorker

pytestmark = pytest.mark.integration

KEY_DIST = "e2ee.key_dist.v1"  # a tenant type: the "qim." prefix is the server's
MARKER = b"plaintext-marker-4f1c"
KEY_DIST_TYPE = {
    "custom_type": KEY_DIST, "schema_version": 1, "delivery_class": "persistent",
    "counts_unread": False, "affects_session_order": False, "timeline_visible": False,
    "anchor_mode": "none", "preview_template": "", "max_payload_bytes": 16384,
    "minimum_client_version": "1.0",
}  # fmt: skip


@contextlib.asynccontextmanager
async def pipeline(stack: Stack, base: Path) -> AsyncIterator[None]:
    """The conversation worker (with the key-distribution type declared) and the mailbox."""
    env = {**WRITER_ENV, "QIM_CUSTOM_TYPES": json.dumps({"*": [KEY_DIST_TYPE]})}
    writer = FaustWorker(stack, "qim.apps.conversation", base / "conversation", env)
    mailbox = MailboxWorker(stack, base / "mailbox")
    try:
        await asyncio.gather(asyncio.to_thread(writer.start), mailbox.start())
        await asyncio.gather(writer_serving(writer), mailbox.serving(90.0))
        yield
    finally:
        await asyncio.gather(asyncio.to_thread(writer.stop), mailbox.stop(), return_exceptions=True)


@contextlib.asynccontextmanager
async def e2ee_gateway(stack: Stack, name: str) -> AsyncIterator[Gateway]:
    bootstrap = stack.cfg.kafka.bootstrap
    ownership = ShardOwnership(bootstrap, f"qim-gw-e2ee-{uuid.uuid4().hex[:8]}", f"ws://{name}")
    await ownership.start()
    try:
        await asyncio.wait_for(ownership.wait_assigned(), 60)
        async with running_gateway(
            ownership=ownership,
            settings=SETTINGS,
            node_id=name,
            kafka_bootstrap=bootstrap,
            route_requests=True,
            mailbox_sync=True,
            conversation_partition_count=CONVERSATION_PARTITION_COUNT,
            prekeys=True,
            prekey_partition_count=PREKEY_PARTITION_COUNT,
        ) as gw:
            yield gw
    finally:
        await ownership.stop()


def receive(
    keys: DeviceKeys, me: str, entries: list[SyncEntry], direct: str, body_seq: int
) -> bytes:
    """What a recipient device does: open its envelope, then the sealed body."""
    (dist,) = [e for e in entries if e.custom_type == KEY_DIST]
    assert dist.payload_or_ciphertext is not None
    kd = msgspec.msgpack.decode(dist.payload_or_ciphertext, type=KeyDistribution)
    _, sender_key = accept(keys, kd.envelopes[me])
    (body,) = [e for e in entries if e.conversation_seq == body_seq]
    assert body.payload_or_ciphertext is not None
    return open_sealed(sender_key, direct, body.payload_or_ciphertext)


async def test_an_e2ee_message_is_stored_and_delivered_as_ciphertext_and_decrypts_on_each_device(
    stack: Stack, tmp_path: Path
) -> None:
    tenant = f"t-e2ee-{uuid.uuid4().hex[:6]}"
    keys_worker = FaustWorker(stack, "qim.apps.keys", tmp_path / "keys", {})
    devices = {d: DeviceKeys() for d in ("alice/phone", "alice/laptop", "bob/phone", "bob/laptop")}
    for k in devices.values():
        k.add_one_time(5)
    await asyncio.to_thread(keys_worker.start)
    try:
        async with pipeline(stack, tmp_path), e2ee_gateway(stack, "gw-e2ee") as gw:
            online = {}
            for name, k in devices.items():
                user, device = name.split("/")
                online[name] = await login(gw, tenant, user, device)
                await online[name].client.publish_prekeys(k.publish_frame())
            phone = online["alice/phone"].client
            direct = phone.direct_conversation_id("bob")

            bundles = {f"bob/{b.device_id}": b for b in (await phone.fetch_prekeys("bob")).bundles}
            own = await phone.fetch_prekeys("alice", ("laptop",))
            bundles["alice/laptop"] = own.bundles[0]
            assert sorted(bundles) == ["alice/laptop", "bob/laptop", "bob/phone"]
            sender_key = os.urandom(32)
            envelopes = {
                target: initiate(devices["alice/phone"], bundle, sender_key)[1]
                for target, bundle in sorted(bundles.items())
            }
            dist = KeyDistribution(sender="alice/phone", key_id=1, envelopes=envelopes)
            await phone.send_custom(
                direct, KEY_DIST, msgspec.msgpack.encode(dist), peer_user_id="bob"
            )
            sealed = seal(sender_key, direct, MARKER)
            ack = await phone.send_message(direct, sealed, peer_user_id="bob")

            # stored: history (the MessageStore) holds the client's ciphertext byte for byte
            history = await phone.pull_history(direct, limit=10)
            stored = {m.conversation_seq: m.payload_or_ciphertext for m in history.messages}
            assert stored[ack.conversation_seq] == sealed
            assert all(MARKER not in (p or b"") for p in stored.values())

            # delivered: a fresh login of each other device syncs the same bytes, and decrypts
            for name in ("bob/phone", "bob/laptop", "alice/laptop"):
                await online[name].client.close()
                again = await login(gw, tenant, *name.split("/"))
                online[name] = again
                mine = [e for e in again.entries if e.conversation_id == direct]
                bodies = [
                    e.payload_or_ciphertext
                    for e in mine
                    if e.conversation_seq == ack.conversation_seq and e.body_included
                ]
                assert bodies == [sealed], mine
                assert receive(devices[name], name, mine, direct, ack.conversation_seq) == MARKER
            for result in online.values():
                await result.client.close()
    finally:
        await asyncio.to_thread(keys_worker.stop)
