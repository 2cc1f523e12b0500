"""A group flagged E2EE at creation, on the real stack (issue 23, spec 22.1, 22.3, AT-43/44/47).

Real ``faust worker`` processes of both apps (the writer with ``e2ee_max_members`` = 3), a
routing gateway with SDK clients over WebSocket, the group admin endpoint over HTTP and a
mailbox probe. alice creates an E2EE group with bob through CREATE_GROUP and sends an opaque
body: the MessageStore (history) and bob's mailbox hold it byte for byte, and bob's session
list previews the E2EE placeholder, never the body (a plaintext group created alongside shows
its text, the contrast). An edit keeps ciphertext and placeholder. The admin plane adds carol
(the 3rd member, the limit) and is refused dave with ``PERMISSION_DENIED`` /
``e2ee_member_limit``; the group stays E2EE (the next message's preview, a positive barrier, is
still the placeholder) and its member count is unchanged; unread and the @mention count (the
mention targets stay plaintext, 22.3) work as in any group. bob has a push token on an offline
device (a digest record, as the NotificationService publishes it): the PushTask the MailboxNode
plans for the E2EE message is flagged ``e2ee`` with the placeholder text, the plaintext
group's is not (its task is the barrier that the digest is known). An E2EE create over the
limit is refused the same way. The tenant makes its one-to-one conversations E2EE
(``QIM_E2EE_DIRECT_TENANTS``): alice's direct message to bob is stored as sent and previewed
as the placeholder too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from qim.admin import AdminHttpError, GroupAdminClient
from qim.client import QimError
from qim.core.notify.tasks import E2EE_PUSH_PLACEHOLDER
from qim.devstack.stack import Stack
from qim.schemas.frames import ErrorCode
from qim.schemas.frames.history import SessionEntry
from qim.schemas.records.membership import MEMBERSHIP_CUSTOM_TYPE, decode_control
from qim.schemas.records.notify import (
    DeviceKey,
    DeviceTokenDigest,
    PushTask,
    decode_push_task,
    encode,
)
from qim.schemas.records.outbox import PreviewPlaceholder
from qim.streams.topics import DEVICE_TOKEN_DIGEST, PUSH_TASKS
from tests.integration.device_support import eventually
from tests.integration.login_support import pipeline
from tests.integration.mailbox_support import Client as MailboxProbe
from tests.integration.mailbox_support import shard_of
from tests.integration.test_admin_groups import SECRET, WAIT_S, serve
from tests.integration.test_gateway_routing import gateway, online

pytestmark = pytest.mark.integration

E2EE_MAX = 3


def sealed(tag: bytes) -> bytes:
    """Stands in for a client's body ciphertext: opaque bytes the server must not touch."""
    return b"\x00\xffE2EE" + os.urandom(48) + tag


def placeholder(entry: SessionEntry) -> PreviewPlaceholder:
    return msgspec.msgpack.decode(entry.preview_or_placeholder, type=PreviewPlaceholder)


@contextlib.asynccontextmanager
async def push_tasks(
    stack: Stack, tenant: str, user: str, device: str
) -> AsyncIterator[Callable[[str], Awaitable[PushTask | None]]]:
    """Registers a push token digest for ``user``'s offline ``device`` and yields
    ``next_task(conversation_id)``: the next PushTask planned for that device and conversation,
    or None when none came within a few seconds."""
    shard = shard_of(tenant, user)
    key = DeviceKey(tenant, user, device)
    producer = AIOKafkaProducer(bootstrap_servers=stack.cfg.kafka.bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=stack.cfg.kafka.bootstrap)
    await producer.start()
    await consumer.start()
    tp = TopicPartition(PUSH_TASKS.name, shard)
    consumer.assign([tp])
    await consumer.seek_to_beginning(tp)
    try:
        digest = encode(DeviceTokenDigest(provider="APNS"))
        await producer.send_and_wait(
            DEVICE_TOKEN_DIGEST.name, digest, key=key.encode(), partition=shard
        )

        async def next_task(conversation_id: str) -> PushTask | None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5.0
            while loop.time() < deadline:
                for record in (await consumer.getmany(tp, timeout_ms=500)).get(tp, []):
                    task = decode_push_task(record.value)
                    if task.key == key and task.conversation_id == conversation_id:
                        return task
            return None

        yield next_task
    finally:
        await consumer.stop()
        await producer.stop()


async def test_an_e2ee_group_stores_ciphertext_previews_the_placeholder_and_caps_its_members(
    stack: Stack, tmp_path: Path
) -> None:
    tenant = f"t-e2g-{uuid.uuid4().hex[:6]}"
    secret, plain = f"g:sec-{uuid.uuid4().hex[:6]}", f"g:pln-{uuid.uuid4().hex[:6]}"
    env = {"QIM_E2EE_MAX_MEMBERS": str(E2EE_MAX), "QIM_E2EE_DIRECT_TENANTS": tenant}
    async with (
        pipeline(stack, tmp_path, env),
        MailboxProbe(stack.cfg.kafka.bootstrap) as probe,
        gateway(stack, "gw-e2ee-groups") as gw,
    ):

        async def row(user: str, conversation_id: str, seq: int) -> SessionEntry:
            found: list[SessionEntry] = []

            async def reached() -> bool:
                rows = {e.conversation_id: e for e in await probe.session_list(tenant, user)}
                r = rows.get(conversation_id)
                found[:] = [r] if r is not None else []
                return r is not None and r.latest_conversation_seq >= seq

            await eventually(reached, f"{user}'s row of {conversation_id} at seq {seq}")
            return found[0]

        admin = await serve(stack, timeout_s=WAIT_S)
        operator = GroupAdminClient(admin.url, SECRET, actor="ops", timeout_s=WAIT_S + 10)
        try:
            async with online(gw, "alice", tenant=tenant) as alice:
                created = await alice.create_group(secret, ("bob",), e2ee=True)
                assert created.total_hint == 2
                await alice.create_group(plain, ("bob",))
                body = sealed(b"-1")
                ack = await alice.send_message(secret, body)
                text = await alice.send_message(plain, b"hello in plaintext")

                # stored untouched: the MessageStore and bob's mailbox hold the same bytes
                history = await alice.pull_history(secret, limit=10)
                stored = {m.conversation_seq: m.payload_or_ciphertext for m in history.messages}
                assert stored[ack.conversation_seq] == body

                # previews: the placeholder for the E2EE group, the text for the plain one
                shown = await row("bob", secret, ack.conversation_seq)
                assert placeholder(shown).e2ee
                assert body not in shown.preview_or_placeholder
                assert b"E2EE" not in shown.preview_or_placeholder
                other = await row("bob", plain, text.conversation_seq)
                assert other.preview_or_placeholder == b"hello in plaintext"
                entries = {
                    (e.conversation_id, e.conversation_seq): e
                    for e in await probe.pull_all(tenant, "bob")
                }
                delivered = entries[(secret, ack.conversation_seq)]
                if delivered.body_included:
                    assert delivered.payload_or_ciphertext == body
                # the create's MEMBERSHIP entry tells the members the group is E2EE
                create = [
                    e
                    for (conv, _), e in entries.items()
                    if conv == secret and e.custom_type == MEMBERSHIP_CUSTOM_TYPE
                ]
                assert create and create[0].payload_or_ciphertext is not None
                assert decode_control(create[0].payload_or_ciphertext).e2ee

                # an edit carries ciphertext too, and the preview stays the placeholder
                edited = sealed(b"-1-edited")
                edit = await alice.edit(secret, ack.conversation_seq, edited)
                history = await alice.pull_history(secret, limit=10)
                stored = {m.conversation_seq: m.payload_or_ciphertext for m in history.messages}
                assert stored[ack.conversation_seq] == edited
                again = await row("bob", secret, ack.conversation_seq)
                assert placeholder(again).e2ee and edited not in again.preview_or_placeholder
                assert edit.conversation_seq > ack.conversation_seq

                # e2ee_max_members: the 3rd member joins, a 4th is refused, nothing changes
                added = await asyncio.to_thread(operator.add, tenant, secret, ["carol"])
                assert added["member_count"] == E2EE_MAX
                with pytest.raises(AdminHttpError) as refused:
                    await asyncio.to_thread(operator.add, tenant, secret, ["dave"])
                assert refused.value.status == 403
                assert refused.value.body["code"] == ErrorCode.PERMISSION_DENIED
                assert refused.value.body["detail"] == "e2ee_member_limit"
                shown_group = await asyncio.to_thread(operator.show, tenant, secret)
                assert shown_group["member_count"] == E2EE_MAX
                assert shown_group["membership_version"] == added["membership_version"]
                # the plaintext group has no such limit
                grown = await asyncio.to_thread(operator.add, tenant, plain, ["carol", "dave"])
                assert grown["member_count"] == 4

                # the group stayed E2EE: the next message (the barrier) previews the placeholder;
                # unread and the @mention count work on metadata alone (22.3)
                later = await alice.send_message(secret, sealed(b"-2"), mention_targets=("bob",))
                carol_row = await row("carol", secret, later.conversation_seq)
                assert placeholder(carol_row).e2ee
                assert carol_row.unread_count == 1  # joined after the first message
                bob_row = await row("bob", secret, later.conversation_seq)
                assert placeholder(bob_row).e2ee
                assert bob_row.unread_count == 2  # the two messages; edit and join count nothing
                assert bob_row.mention_count == 1

                # push (16.7): the plaintext group's task is the barrier, then the E2EE one
                async with push_tasks(stack, tenant, "bob", "tablet") as next_task:
                    plain_task = None
                    for attempt in range(12):
                        await alice.send_message(plain, f"ping {attempt}".encode())
                        plain_task = await next_task(plain)
                        if plain_task is not None:
                            break
                    assert plain_task is not None, "no PushTask for the plaintext group"
                    assert not plain_task.e2ee and plain_task.preview_or_placeholder == ""
                    await alice.send_message(secret, sealed(b"-3"))
                    secret_task = await next_task(secret)
                    assert secret_task is not None, "no PushTask for the E2EE group"
                    assert secret_task.e2ee and secret_task.kind == "alert"
                    assert secret_task.preview_or_placeholder == E2EE_PUSH_PLACEHOLDER
                    assert secret_task.total_unread >= 3  # the badge counts as usual

                # the tenant's one-to-one conversations are E2EE from their first message
                direct = alice.direct_conversation_id("bob", tenant_id=tenant, user_id="alice")
                one = sealed(b"-direct")
                dm = await alice.send_message(direct, one, peer_user_id="bob")
                history = await alice.pull_history(direct, limit=10)
                assert [m.payload_or_ciphertext for m in history.messages] == [one]
                dm_row = await row("bob", direct, dm.conversation_seq)
                assert placeholder(dm_row).e2ee and one not in dm_row.preview_or_placeholder

                # creating an E2EE group over the limit is refused whole (AT-44)
                with pytest.raises(QimError) as too_big:
                    await alice.create_group(
                        f"g:big-{uuid.uuid4().hex[:6]}", ("bob", "carol", "dave"), e2ee=True
                    )
                assert too_big.value.code == ErrorCode.PERMISSION_DENIED
                assert too_big.value.detail == "e2ee_member_limit"
        finally:
            await admin.close()
