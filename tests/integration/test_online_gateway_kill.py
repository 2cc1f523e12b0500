"""A gateway killed with its devices online (issue 6): leases run out, mailboxes keep the rest.

A real ``qim gateway`` process (login sync on, Redis AuthService, a 3 s presence lease renewed
every second) holds alice's phone and bob's phone and tablet; the real conversation and
mailbox workers run beside it. After ``kill -9`` nobody writes their presence any more: no
tombstone, no renewal, so each entry's lease runs out by itself (5.4.2, 5.4.3 (3)). Messages
sent then - by carol, on a second gateway - are materialized and planned for carol's own
device only: the MailboxNode finds no live device for alice and bob (no PushBatch names them,
``qim_mailbox_push_offline_users_total`` counts them). The devices reconnect to the second
gateway with their SDK state and pull what they missed: every message exactly once.

Within the lease (a second test, with a long lease): the MailboxNode still plans a push for
the dead connection; the new owner of the ConnectionShard does not know it, drops it and
answers PRESENCE_STALE, and the MailboxNode takes the device offline before its lease ends.

Spec: 5.4.2 (sole writer, lease renewal), 5.4.3 (1) (PRESENCE_STALE) and (3) (an expired
lease is offline), 11.1.1 rule 1 (an unknown connection_id is dropped and reported), 11.1.2
(push failure never rolls back the mailbox; the client recovers via PULL_MAILBOX), 9.3.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from qim.auth import AuthService, KeyRing, SigningKey
from qim.client import Identity
from qim.devstack.stack import Stack
from qim.schemas.frames import SyncEntry
from tests.integration.login_support import MESSAGE_TYPES, pipeline
from tests.integration.online_support import (
    Device,
    PushWatch,
    connect,
    presence_log,
    until,
    warm_up,
)
from tests.integration.test_gateway_cluster import GatewayProc, start_gateway

pytestmark = pytest.mark.integration

LEASE_TTL_MS = 3000
LONG_LEASE_TTL_MS = 60_000  # the PRESENCE_STALE case must finish well within the lease
GATEWAY_ENV = {
    "QIM_MAILBOX_SYNC": "1",
    "QIM_PRESENCE_LEASE_TTL": str(LEASE_TTL_MS),
    "QIM_PRESENCE_LEASE_RENEW": "1000",
}
DEVICES = (("alice", "phone"), ("bob", "phone"), ("bob", "tablet"))


def messages(entries: list[SyncEntry]) -> dict[bytes, SyncEntry]:
    """Message entries by message_id; fails on a (message_id, event_id) seen twice."""
    found = [e for e in entries if e.event_type in MESSAGE_TYPES]
    keys = [(e.message_id, e.event_id) for e in found]
    assert len(keys) == len(set(keys)), "a duplicate survived the SDK's dedup"
    return {e.message_id: e for e in found}


class Cluster:
    """Gateway processes (each in its own ownership group, so it owns every shard at once)
    sharing one AuthService ring, and SDK devices on them; ``close`` stops what it started."""

    def __init__(self, stack: Stack, workdir: Path, tenant: str) -> None:
        self.stack, self.workdir, self.tenant = stack, workdir, tenant
        self.ring = KeyRing([SigningKey.generate("online-kill")])
        self.redis = aioredis.Redis.from_url(stack.cfg.redis.url)
        self.auth = AuthService(self.redis, self.ring)
        self.gateways: list[GatewayProc] = []
        self.devices: list[Device] = []

    async def gateway(self, name: str, lease_ttl_ms: int = LEASE_TTL_MS) -> GatewayProc:
        env = {**GATEWAY_ENV, "QIM_PRESENCE_LEASE_TTL": str(lease_ttl_ms)}
        group = f"it-gw-kill-{uuid.uuid4().hex[:8]}"
        keys = self.ring.format()
        gw = await asyncio.to_thread(
            start_gateway, self.stack, self.workdir, name, group, keys, env
        )
        self.gateways.append(gw)
        return gw

    async def login(
        self, gw: GatewayProc, user: str, device: str, prior: Device | None = None
    ) -> Device:
        """``prior``: the device's previous Device, whose MailboxSync the login continues."""
        token = await self.auth.issue_token(self.tenant, user, device)
        sync = prior.result.sync if prior is not None else None
        dev = await connect(gw.url, token, Identity(self.tenant, user), device, sync=sync)
        self.devices.append(dev)
        return dev

    async def close(self) -> None:
        for dev in self.devices:
            await dev.close()
        for gw in self.gateways:
            await asyncio.to_thread(gw.stop)
        await self.redis.aclose()


async def test_a_killed_gateways_devices_go_offline_by_lease_and_resync_without_loss(
    stack: Stack, tmp_path: Path
) -> None:
    tenant, group = f"t-kill-{uuid.uuid4().hex[:6]}", f"g:kill-{uuid.uuid4().hex[:8]}"
    bootstrap = stack.cfg.kafka.bootstrap
    cluster = Cluster(stack, tmp_path, tenant)
    first: dict[tuple[str, str], Device] = {}
    back: dict[tuple[str, str], Device] = {}
    try:
        async with pipeline(stack, tmp_path) as mailbox, PushWatch(bootstrap) as watch:
            a = await cluster.gateway("gw-a")
            for user, name in DEVICES:
                first[(user, name)] = await cluster.login(a, user, name)
            sender = first[("alice", "phone")].result.client
            await sender.create_group(group, ("bob", "carol"))
            bobs = (first[("bob", "phone")], first[("bob", "tablet")])
            await warm_up(
                lambda i: sender.send_message(group, f"w{i}".encode(), client_message_id=f"w{i}"),
                bobs,
            )
            await until(lambda: all(d.entries for d in first.values()), "alice's echo")

            await asyncio.to_thread(a.kill)
            killed_ms = time.time_ns() // 1_000_000
            await until(lambda: all(d.closed for d in first.values()), "sockets still open")

            # nobody writes for a dead node: the last record is an upsert that was never
            # renewed after the kill, so its lease runs out by itself
            expiry = 0
            for user, name in DEVICES:
                log = await presence_log(bootstrap, tenant, user, name)
                last = log[-1]
                assert last is not None, "a killed gateway wrote a tombstone"
                assert last.lease_expire_at <= killed_ms + LEASE_TTL_MS
                expiry = max(expiry, last.lease_expire_at)
            await asyncio.sleep((expiry - time.time_ns() // 1_000_000) / 1000 + 0.2)

            b = await cluster.gateway("gw-b")
            carol = back[("carol", "phone")] = await cluster.login(b, "carol", "phone")
            to_carol = carol.result.client
            offline_before = mailbox.totals().get("push_offline_users_total", 0)
            sent: dict[bytes, str] = {}
            for i in range(3):
                ack = await to_carol.send_message(
                    group, f"g{i}".encode(), client_message_id=f"g{i}"
                )
                sent[ack.message_id] = "group"
            for i in range(2):
                ack = await to_carol.send_direct("bob", f"d{i}".encode(), client_message_id=f"d{i}")
                sent[ack.message_id] = "direct"

            # carol's echo is pushed (pushes still flow), alice and bob are offline
            await until(lambda: all(carol.of(m) for m in sent), "carol's echo was not pushed")

            # the devices come back on the new gateway with their SDK state: the login pulls
            # what waited in the mailboxes, and nothing is handed over twice
            for user, name in DEVICES:
                back[(user, name)] = await cluster.login(b, user, name, first[(user, name)])
            for (user, name), device in back.items():
                if user == "carol":
                    continue
                before = first[(user, name)]
                meant = {m for m, kind in sent.items() if user == "bob" or kind == "group"}
                pulled = messages(device.result.entries)
                assert meant <= set(pulled)
                delivered = messages([*before.delivered, *device.delivered])
                assert meant <= set(delivered)
                warm = {m for m, e in delivered.items() if e.sender_id == "alice"}
                assert set(delivered) == meant | warm
                assert len(warm) >= 1

            # alice and bob were offline when their MailboxNodes planned the messages: their
            # logins pulled them, so each node folded them and (in the same fold, before it
            # answered) enqueued whatever PushBatches it planned; the watch then read
            # qim.to-gateway to its end, so a PushBatch naming alice or bob would be in it
            await watch.caught_up()
            for mid in sent:
                assert {r.user_id for r in watch.recipients(mid)} == {"carol"}
            offline = mailbox.totals().get("push_offline_users_total", 0) - offline_before
            assert offline >= 3 * 2 + 2  # alice and bob per group message, bob per direct one
    finally:
        await cluster.close()


async def test_a_gateway_replaced_within_the_lease_reports_presence_stale(
    stack: Stack, tmp_path: Path
) -> None:
    """11.1.1 rule 1 and 5.4.3 (1): the lease still holds after the kill, so the MailboxNode
    plans a push for bob's dead connection; the new owner of his ConnectionShard has no such
    connection, drops it and answers PRESENCE_STALE, which takes bob offline at once."""
    tenant, group = f"t-stale-{uuid.uuid4().hex[:6]}", f"g:stale-{uuid.uuid4().hex[:8]}"
    bootstrap = stack.cfg.kafka.bootstrap
    cluster = Cluster(stack, tmp_path, tenant)
    try:
        async with pipeline(stack, tmp_path) as mailbox, PushWatch(bootstrap) as watch:
            a = await cluster.gateway("gw-a", lease_ttl_ms=LONG_LEASE_TTL_MS)
            bob = await cluster.login(a, "bob", "phone")
            carol = await cluster.login(a, "carol", "phone")
            sender = carol.result.client
            await sender.create_group(group, ("bob",))
            await warm_up(
                lambda i: sender.send_message(group, f"w{i}".encode(), client_message_id=f"w{i}"),
                (bob,),
            )
            await asyncio.to_thread(a.kill)
            last = (await presence_log(bootstrap, tenant, "bob", "phone"))[-1]
            assert last is not None  # a dead node writes no tombstone
            lease = last.lease_expire_at

            b = await cluster.gateway("gw-b", lease_ttl_ms=LONG_LEASE_TTL_MS)
            carol_b = await cluster.login(b, "carol", "phone")
            stale_before = mailbox.totals().get("presence_stale:dropped", 0)
            first = await carol_b.result.client.send_message(group, b"m1", client_message_id="m1")
            await until(lambda: bool(watch.recipients(first.message_id)), "m1 never planned")
            bob_epoch = bob.result.auth_ok.session_epoch
            planned = [r for r in watch.recipients(first.message_id) if r.user_id == "bob"]
            assert [(r.device_id, r.session_epoch) for r in planned] == [("phone", bob_epoch)]
            await until(
                lambda: mailbox.totals().get("presence_stale:dropped", 0) > stale_before,
                "the MailboxNode never dropped bob's dead connection",
            )

            second = await carol_b.result.client.send_message(group, b"m2", client_message_id="m2")
            await until(lambda: bool(carol_b.of(second.message_id)), "carol's echo of m2")

            back = await cluster.login(b, "bob", "phone", bob)
            pulled = messages(back.result.entries)
            assert {first.message_id, second.message_id} <= set(pulled)
            # bob's login pulled m2, so his MailboxNode folded it and enqueued its PushBatches
            # before answering; the watch read qim.to-gateway to its end: one naming bob
            # would be in it
            await watch.caught_up()
            assert {r.user_id for r in watch.recipients(second.message_id)} == {"carol"}
            # offline by PRESENCE_STALE, not by the lease: that still held when m2 was planned
            assert time.time_ns() // 1_000_000 < lease, "the test ran past bob's lease"
            delivered = messages([*bob.delivered, *back.delivered])
            assert {e.payload_or_ciphertext for e in delivered.values()} >= {b"m1", b"m2"}
    finally:
        await cluster.close()
