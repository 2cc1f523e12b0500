"""Login sync end to end (issue 5): the real pipeline, a syncing gateway, the SDK.

Real ``faust worker`` processes of ``qim.apps.conversation`` (ConversationWriter +
FanoutCoordinator) and ``qim.apps.mailbox`` (MailboxNode), an in-process ConnectionNode with
routing and ``mailbox_sync`` on (ShardOwnership of the to-gateway topic, read_committed), and
``login_and_sync`` over WebSocket. alice is online; bob, in a group of three with her and in a
one-to-one, is offline while she writes.

Spec: 9.3.1 (``sync_to_seq`` = W[lane] at AUTH, has_offline), 9.3.2 (pulls, contiguous cursor),
9.3.4 / T30 (SYNC_COMPLETE checked by the server), 6.8 (the cursor a device keeps: a login with
it re-delivers nothing), T22 (has_offline=false -> SYNC_COMPLETE at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from qim.client import (
    DeviceCursor,
    HeartbeatConfig,
    Identity,
    QimClient,
    QimError,
    SyncResult,
    login_and_sync,
)
from qim.devstack.stack import CONVERSATION_PARTITION_COUNT, Stack
from qim.gateway.ownership import ShardOwnership
from qim.schemas.frames import ErrorCode, EventType, MailboxCursor, OnlineReady, SyncEntry
from tests.gateway_support import Gateway, running_gateway
from tests.integration.mailbox_support import Client as MailboxProbe
from tests.integration.mailbox_support import Node as MailboxWorker
from tests.integration.test_admin_groups import WRITER_ENV, writer_serving
from tests.integration.test_gateway_routing import SETTINGS
from tests.integration.workers import FaustWorker

pytestmark = pytest.mark.integration

WAIT_S = 60.0
MESSAGE_TYPES = (EventType.MESSAGE, EventType.MENTION)


def new_client() -> QimClient:
    return QimClient(heartbeat=HeartbeatConfig(enabled=False), request_timeout=20)


@contextlib.asynccontextmanager
async def syncing_gateway(stack: Stack, name: str) -> AsyncIterator[Gateway]:
    """A routing node with login sync, owning every ConnectionShard through its own group."""
    bootstrap = stack.cfg.kafka.bootstrap
    group = f"qim-gw-sync-{uuid.uuid4().hex[:8]}"
    ownership = ShardOwnership(bootstrap, group, f"ws://{name}")
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
        ) as gw:
            yield gw
    finally:
        await ownership.stop()


@contextlib.asynccontextmanager
async def pipeline(stack: Stack, base: Path) -> AsyncIterator[MailboxWorker]:
    """The conversation and mailbox workers, started side by side; stopped on exit."""
    writer = FaustWorker(stack, "qim.apps.conversation", base / "conversation", WRITER_ENV)
    mailbox = MailboxWorker(stack, base / "mailbox")
    try:
        await asyncio.gather(asyncio.to_thread(writer.start), mailbox.start())
        await asyncio.gather(writer_serving(writer), mailbox.serving(WAIT_S))
        yield mailbox
    finally:
        await asyncio.gather(asyncio.to_thread(writer.stop), mailbox.stop(), return_exceptions=True)


def from_alice(entries: Sequence[SyncEntry]) -> list[SyncEntry]:
    return [e for e in entries if e.sender_id == "alice" and e.event_type in MESSAGE_TYPES]


async def materialized(probe: MailboxProbe, tenant: str, user: str, count: int) -> None:
    """Wait until ``user``'s mailbox serves ``count`` messages of alice (asked of the
    MailboxNode directly), so a login's W[lane] snapshot is known to cover them."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while len(from_alice(await probe.pull_all(tenant, user))) < count:
        assert loop.time() < deadline, f"{user}'s mailbox never held {count} messages"
        await asyncio.sleep(0.3)


async def bob_logs_in(gw: Gateway, tenant: str, cursor: DeviceCursor | None) -> SyncResult:
    token = await gw.token("bob", "phone", tenant)
    result = await login_and_sync(new_client(), gw.ws_url, token, "phone", cursor)
    await result.client.close()
    return result


async def test_offline_messages_are_pulled_once_and_the_saved_cursor_resumes(
    stack: Stack, tmp_path: Path
) -> None:
    tenant, group = f"t-sync-{uuid.uuid4().hex[:6]}", f"g:sync-{uuid.uuid4().hex[:8]}"
    async with (
        pipeline(stack, tmp_path) as mailbox,
        MailboxProbe(stack.cfg.kafka.bootstrap) as probe,
        syncing_gateway(stack, "gw-sync") as gw,
    ):
        token = await gw.token("alice", "phone", tenant)
        alice = await login_and_sync(new_client(), gw.ws_url, token, "phone")
        client = alice.client
        client.identity = Identity(tenant, "alice")
        try:
            assert alice.auth_ok.mailbox_cursor_token  # the MailboxNode answered her AUTH
            await client.create_group(group, ("bob", "carol"))
            for i in range(5):
                await client.send_message(group, f"g{i}".encode(), client_message_id=f"g{i}")
            await client.send_direct("bob", b"d0", client_message_id="d0")
            await materialized(probe, tenant, "bob", 6)

            # 1. A new device: everything offline is pulled, exactly once, in mailbox order.
            first = await bob_logs_in(gw, tenant, None)
            assert first.auth_ok.has_offline and first.auth_ok.sync_to_seq > 0
            got = from_alice(first.entries)
            assert got == first.entries  # alice's messages and nothing else
            assert len(got) == 6 and len({(e.message_id, e.event_id) for e in got}) == 6
            in_group = [e for e in got if e.conversation_id == group]
            in_group.sort(key=lambda e: e.conversation_seq)
            assert [e.payload_or_ciphertext for e in in_group] == [
                b"g0",
                b"g1",
                b"g2",
                b"g3",
                b"g4",
            ]
            direct = [e for e in got if e.conversation_id != group]
            assert [e.payload_or_ciphertext for e in direct] == [b"d0"]
            assert [e.mailbox_seq for e in first.entries] == sorted(
                e.mailbox_seq for e in first.entries
            )
            assert first.cursor.last_applied_mailbox_seq >= first.auth_ok.sync_to_seq
            assert first.cursor.token == first.auth_ok.mailbox_cursor_token

            # 2. The saved cursor: nothing offline, nothing delivered again.
            second = await bob_logs_in(gw, tenant, first.cursor)
            assert not second.auth_ok.has_offline and second.entries == []
            assert second.cursor.last_applied_mailbox_seq >= first.cursor.last_applied_mailbox_seq

            # 3. A message while bob is away arrives with the next login, and only with it.
            await client.send_message(group, b"late", client_message_id="late")
            await materialized(probe, tenant, "bob", 7)
            third = await bob_logs_in(gw, tenant, second.cursor)
            assert third.auth_ok.has_offline
            assert [e.payload_or_ciphertext for e in third.entries] == [b"late"]
            fourth = await bob_logs_in(gw, tenant, third.cursor)
            assert not fourth.auth_ok.has_offline and fourth.entries == []
        finally:
            await client.close()

        # 4. The barrier is the server's: a wrong sync_to_seq is SYNC_INCOMPLETE (T30).
        token = await gw.token("bob", "phone", tenant)
        saved = fourth.cursor
        cursor = MailboxCursor(saved.token, saved.last_applied_mailbox_seq)
        async with new_client() as raw:
            ok = await raw.connect(gw.ws_url, token, "phone", cursor=cursor)
            assert not ok.has_offline  # T22: nothing to pull, SYNC_COMPLETE may follow at once
            with pytest.raises(QimError) as info:
                await raw.sync_complete(ok.sync_to_seq + 1)
            assert info.value.code is ErrorCode.SYNC_INCOMPLETE
            assert await raw.sync_complete(ok.sync_to_seq) == OnlineReady()
        assert mailbox.pid is not None  # the worker stayed up throughout
