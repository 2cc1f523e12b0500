"""Ephemeral custom messages across two gateways (issue 16, spec 13.3 -> 13.2, INV-33).

alice (phone + laptop) is owned by one gateway, bob (phone + laptop) by the other; a declared
``delivery_class=ephemeral`` type sent by alice's phone is decided by the ConversationWriter
(membership, type, size), acked with ``conversation_seq`` 0 and relayed through
``qim.to-gateway`` to the owning ConnectionShards. Checked on the real stack: both of bob's
devices and alice's laptop get it as a PUSH_EVENTS entry with the body and no mailbox
reference; alice's phone (the sender) never does; a stranger is refused with its request_id;
and a later persistent message's pulls show the ephemeral one in no mailbox, history or
session list and unread unchanged by it. Every negative check waits for a later positive
frame on the same device (a barrier), never for a quiet second.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from qim.client import QimClient, QimError
from qim.devstack.stack import Stack
from qim.schemas.frames import Body, ErrorCode, Frame, SyncEntry
from qim.schemas.frames.messaging import PushEvents
from qim.schemas.message_types import MessageType
from tests.integration.device_support import eventually
from tests.integration.mailbox_support import Client as MailboxProbe
from tests.integration.realtime_support import collect_until, nodes, pipeline, user_on
from tests.integration.test_custom_messages_e2e import declaration

pytestmark = pytest.mark.integration

CURSOR = "live.cursor"


def custom_types(tenant: str) -> str:
    cursor = declaration(
        CURSOR,
        delivery_class="ephemeral",
        counts_unread=False,
        affects_session_order=False,
        timeline_visible=False,
        anchor_mode="none",
        schema_version=4,
    )
    return json.dumps({tenant: [cursor]})


def ephemeral_entries(bodies: list[Body]) -> list[SyncEntry]:
    return [
        e for b in bodies if isinstance(b, PushEvents) for e in b.events if e.custom_type == CURSOR
    ]


def carrying(payload: bytes) -> Callable[[Frame], bool]:
    def match(frame: Frame) -> bool:
        body = frame.body
        return isinstance(body, PushEvents) and any(
            e.custom_type == CURSOR and e.payload_or_ciphertext == payload for e in body.events
        )

    return match


async def test_an_ephemeral_message_reaches_the_online_devices_and_no_mailbox(
    stack: Stack, tmp_path: Path
) -> None:
    tenant = f"t-eph-{uuid.uuid4().hex[:6]}"
    group = f"g:eph-{uuid.uuid4().hex[:6]}"
    env = {"QIM_CUSTOM_TYPES": custom_types(tenant)}
    async with (
        pipeline(stack, tmp_path, env),
        MailboxProbe(stack.cfg.kafka.bootstrap) as probe,
        nodes(stack) as (a, b),
    ):
        alice, bob = user_on(a, tenant, "alice-"), user_on(b, tenant, "bob-")
        mallory = user_on(b, tenant, "mallory-")
        clients: list[QimClient] = []
        try:
            alice_phone = await a.online(tenant, alice, "phone")
            alice_laptop = await a.online(tenant, alice, "laptop")
            bob_phone = await b.online(tenant, bob, "phone")
            bob_laptop = await b.online(tenant, bob, "laptop")
            stranger = await b.online(tenant, mallory, "pc")
            clients += [alice_phone, alice_laptop, bob_phone, bob_laptop, stranger]
            await alice_phone.create_group(group, (bob,))
            hello = await alice_phone.send_message(group, b"hello")

            async def bob_has(seq: int) -> bool:
                rows = {r.conversation_id: r for r in await probe.session_list(tenant, bob, 10)}
                row = rows.get(group)
                return row is not None and row.latest_conversation_seq == seq

            await eventually(lambda: bob_has(hello.conversation_seq), "bob's row for the group")
            mailbox_before = await probe.pull_all(tenant, bob)
            list_before = await probe.session_list(tenant, bob, 10)

            # acked with no seq and a transient message_id
            ack = await alice_phone.send_custom(group, CURSOR, b"cursor-1")
            assert ack.conversation_seq == 0 and ack.last_activity_id == bytes(16)
            assert ack.message_id != bytes(16)

            # bob's two devices on the other gateway, and alice's other device, get it
            for device in (bob_phone, bob_laptop, alice_laptop):
                got = ephemeral_entries(
                    await collect_until(device, carrying(b"cursor-1"), "the ephemeral message")
                )
                assert len(got) == 1
                entry = got[0]
                assert entry.message_id == ack.message_id
                assert (entry.mailbox_seq, entry.conversation_seq, entry.flags) == (0, 0, 0)
                assert (entry.sender_id, entry.origin_device_id) == (alice, "phone")
                assert entry.conversation_id == group and entry.body_included
                assert (entry.message_type, entry.schema_version) == (MessageType.CUSTOM, 4)
                assert entry.client_message_id == ack.client_message_id

            # never the sending device: bob's reply is the barrier on alice's phone
            back = await bob_phone.send_custom(group, CURSOR, b"cursor-2")
            assert back.conversation_seq == 0 and back.message_id != ack.message_id
            seen = ephemeral_entries(
                await collect_until(alice_phone, carrying(b"cursor-2"), "bob's ephemeral")
            )
            assert [e.payload_or_ciphertext for e in seen] == [b"cursor-2"], "echoed to sender"

            # a stranger may not send one into the group
            with pytest.raises(QimError) as refused:
                await stranger.send_custom(group, CURSOR, b"nope")
            assert refused.value.code == ErrorCode.PERMISSION_DENIED

            # INV-33: nothing of it reached a mailbox, a session list, unread or the history
            marker = await alice_phone.send_message(group, b"marker")
            assert marker.conversation_seq == hello.conversation_seq + 1  # no seq was taken
            await eventually(lambda: bob_has(marker.conversation_seq), "the marker for bob")
            mailbox_after = await probe.pull_all(tenant, bob)
            assert mailbox_after[: len(mailbox_before)] == mailbox_before
            added = mailbox_after[len(mailbox_before) :]
            assert [e.conversation_seq for e in added] == [marker.conversation_seq]
            assert all(e.custom_type != CURSOR for e in mailbox_after)
            before = {r.conversation_id: r for r in list_before}[group]
            after = {r.conversation_id: r for r in await probe.session_list(tenant, bob, 10)}
            assert after[group].unread_count == before.unread_count + 1
            assert after[group].last_message_id == marker.message_id
            history = await bob_phone.pull_history(group, limit=50)
            assert [m.payload_or_ciphertext for m in history.messages].count(b"marker") == 1
            assert all(m.custom_type != CURSOR for m in history.messages)
            assert max(m.conversation_seq for m in history.messages) == marker.conversation_seq
        finally:
            for client in clients:
                await client.close()
