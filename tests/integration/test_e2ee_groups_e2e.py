"""A group flagged E2EE at creation, on the real stack (issue 23, spec 22.1, 22.3, AT-43/44/47).

Real ``faust worker`` processes of both apps (the writer with ``e2ee_max_members`` = 3), a
routing gateway with SDK clients over WebSocket, the group admin endpoint over HTTP and a
mailbox probe. alice creates an E2EE group with bob through CREATE_GROUP and sends an opaque
body: the MessageStore (history) and bob's mailbox hold it byte for byte, and bob's session
list previews the E2EE placeholder, never the body (a plaintext group created alongside shows
its text, the contrast). An edit keeps ciphertext and placeholder. The admin plane adds carol
(the 3rd member, the limit) and is refused dave with ``PERMISSION_DENIED`` /
``e2ee_member_limit``; the group stays E2EE (the next message's preview, a positive barrier, is
still the placeholder) and its member count is unchanged. An E2EE create over the limit is
refused the same way.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import msgspec
import pytest

from qim.admin import AdminHttpError, GroupAdminClient
from qim.client import QimError
from qim.devstack.stack import Stack
from qim.schemas.frames import ErrorCode
from qim.schemas.frames.history import SessionEntry
from qim.schemas.records.membership import MEMBERSHIP_CUSTOM_TYPE, decode_control
from qim.schemas.records.outbox import PreviewPlaceholder
from tests.integration.device_support import eventually
from tests.integration.login_support import pipeline
from tests.integration.mailbox_support import Client as MailboxProbe
from tests.integration.test_admin_groups import SECRET, WAIT_S, serve
from tests.integration.test_gateway_routing import gateway, online

pytestmark = pytest.mark.integration

E2EE_MAX = 3


def sealed(tag: bytes) -> bytes:
    """Stands in for a client's body ciphertext: opaque bytes the server must not touch."""
    return b"\x00\xffE2EE" + os.urandom(48) + tag


def placeholder(entry: SessionEntry) -> PreviewPlaceholder:
    return msgspec.msgpack.decode(entry.preview_or_placeholder, type=PreviewPlaceholder)


async def test_an_e2ee_group_stores_ciphertext_previews_the_placeholder_and_caps_its_members(
    stack: Stack, tmp_path: Path
) -> None:
    tenant = f"t-e2g-{uuid.uuid4().hex[:6]}"
    secret, plain = f"g:sec-{uuid.uuid4().hex[:6]}", f"g:pln-{uuid.uuid4().hex[:6]}"
    env = {"QIM_E2EE_MAX_MEMBERS": str(E2EE_MAX)}
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

                # the group stayed E2EE: the next message (the barrier) previews the placeholder
                later = await alice.send_message(secret, sealed(b"-2"))
                carol_row = await row("carol", secret, later.conversation_seq)
                assert placeholder(carol_row).e2ee

                # creating an E2EE group over the limit is refused whole (AT-44)
                with pytest.raises(QimError) as too_big:
                    await alice.create_group(
                        f"g:big-{uuid.uuid4().hex[:6]}", ("bob", "carol", "dave"), e2ee=True
                    )
                assert too_big.value.code == ErrorCode.PERMISSION_DENIED
                assert too_big.value.detail == "e2ee_member_limit"
        finally:
            await admin.close()
