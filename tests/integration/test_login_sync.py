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

import uuid
from pathlib import Path

import pytest

from qim.client import (
    DeviceCursor,
    Identity,
    QimError,
    SyncResult,
    login_and_sync,
)
from qim.devstack.stack import Stack
from qim.schemas.frames import ErrorCode, EventType, MailboxCursor, OnlineReady
from tests.gateway_support import Gateway
from tests.integration.login_support import (
    from_alice,
    materialized,
    new_client,
    pipeline,
    syncing_gateway,
)
from tests.integration.mailbox_support import Client as MailboxProbe

pytestmark = pytest.mark.integration


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
            joined = [e for e in first.entries if e.event_type == EventType.MEMBERSHIP]
            assert [e.conversation_id for e in joined] == [group]  # the create (12.9)
            assert got == [e for e in first.entries if e not in joined]  # and alice's messages
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
