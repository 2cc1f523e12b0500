"""Group roles, ownership transfer and dissolve on the real stack (issue 21, spec 20.2.2).

Real ``faust worker`` processes of both apps, the group admin endpoint over HTTP, an SDK
client through a routing gateway and a mailbox probe. The admin plane acts on behalf of
members (``as_member``): a MEMBER's remove is PERMISSION_DENIED; after the owner transfers,
the old owner can no longer remove an ADMIN while the new owner can; after the dissolve a send
is PERMISSION_DENIED, the history below the dissolve stays readable, and every member's mailbox
holds the dissolve's MEMBERSHIP entry.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from qim.admin import AdminHttpError, GroupAdminClient
from qim.client import QimError
from qim.devstack.stack import Stack
from qim.schemas.frames import ErrorCode, EventType
from qim.schemas.records.membership import MEMBERSHIP_CUSTOM_TYPE, decode_control
from tests.integration.device_support import eventually
from tests.integration.mailbox_support import Client as MailboxProbe
from tests.integration.test_admin_groups import SECRET, WAIT_S, serve
from tests.integration.test_gateway_routing import gateway, online
from tests.integration.test_reactions_e2e import pipeline

pytestmark = pytest.mark.integration

MEMBERS = ("alice", "bob", "carol", "dave")


async def _refused(call: Any, *args: Any) -> AdminHttpError:
    with pytest.raises(AdminHttpError) as refused:
        await asyncio.to_thread(call, *args)
    return refused.value


async def test_roles_transfer_and_dissolve_through_the_admin_plane(
    stack: Stack, tmp_path: Path
) -> None:
    tenant, group = f"t-roles-{uuid.uuid4().hex[:6]}", f"g:roles-{uuid.uuid4().hex[:6]}"
    async with (
        pipeline(stack, tmp_path),
        MailboxProbe(stack.cfg.kafka.bootstrap) as probe,
        gateway(stack, "gw-roles") as gw,
    ):
        admin = await serve(stack, timeout_s=WAIT_S)
        try:

            def as_member(user: str) -> GroupAdminClient:
                return GroupAdminClient(
                    admin.url, SECRET, actor=user, as_member=True, timeout_s=WAIT_S + 10
                )

            operator = GroupAdminClient(admin.url, SECRET, actor="ops", timeout_s=WAIT_S + 10)
            created = await asyncio.to_thread(
                operator.create, tenant, group, "alice", ["bob", "carol", "dave"]
            )
            assert created["member_count"] == 4
            promoted = await asyncio.to_thread(
                as_member("alice").set_role, tenant, group, "carol", "ADMIN"
            )
            assert promoted["membership_version"] == created["membership_version"] + 1

            # a MEMBER may not remove (20.2.2 default group setting): PERMISSION_DENIED
            denied = await _refused(as_member("bob").remove, tenant, group, "dave")
            assert denied.status == 403 and denied.body["code"] == ErrorCode.PERMISSION_DENIED
            # the ADMIN may not grant ADMIN, the owner's right
            denied = await _refused(as_member("carol").set_role, tenant, group, "dave", "ADMIN")
            assert denied.body["code"] == ErrorCode.PERMISSION_DENIED

            async with online(gw, "alice", tenant=tenant) as alice:
                before = await alice.send_message(group, b"before", client_message_id="r-1")

            transferred = await asyncio.to_thread(as_member("alice").transfer, tenant, group, "bob")
            assert transferred["member_count"] == 4
            # the old owner is a MEMBER now: it can neither remove the ADMIN nor dissolve
            denied = await _refused(as_member("alice").remove, tenant, group, "carol")
            assert denied.status == 403 and denied.body["code"] == ErrorCode.PERMISSION_DENIED
            denied = await _refused(as_member("alice").dissolve, tenant, group)
            assert denied.body["code"] == ErrorCode.PERMISSION_DENIED
            # the ADMIN can still remove a MEMBER, and may not remove the new OWNER
            denied = await _refused(as_member("carol").remove, tenant, group, "bob")
            assert denied.body["code"] == ErrorCode.PERMISSION_DENIED

            dissolved = await asyncio.to_thread(as_member("bob").dissolve, tenant, group)
            assert dissolved["member_count"] == 0
            shown = await _refused(operator.show, tenant, group)
            assert shown.status == 403  # a dissolved group answers like one that never was
            again = await _refused(operator.add, tenant, group, ["erin"])
            assert again.body["code"] == ErrorCode.PERMISSION_DENIED
        finally:
            await admin.close()

        async with online(gw, "alice", tenant=tenant) as alice:
            with pytest.raises(QimError) as refused:
                await alice.send_message(group, b"after", client_message_id="r-2")
            assert refused.value.code is ErrorCode.PERMISSION_DENIED
            history = await alice.pull_history(group, limit=20)
            assert [m.client_message_id for m in history.messages if m.client_message_id] == [
                before.client_message_id
            ]

        async def dissolve_entry(user: str) -> int | None:
            for entry in await probe.pull_all(tenant, user):
                if entry.conversation_id != group or entry.event_type != EventType.MEMBERSHIP:
                    continue
                if entry.custom_type != MEMBERSHIP_CUSTOM_TYPE or not entry.payload_or_ciphertext:
                    continue
                control = decode_control(entry.payload_or_ciphertext)
                if control.action == "dissolve":
                    assert control.targets == MEMBERS and control.member_count == 0
                    return entry.conversation_seq
            return None

        seqs: dict[str, int] = {}
        for user in MEMBERS:

            async def arrived(u: str = user) -> bool:
                seq = await dissolve_entry(u)
                if seq is not None:
                    seqs[u] = seq
                return seq is not None

            await eventually(arrived, f"{user}'s dissolve MEMBERSHIP entry")
        assert len(set(seqs.values())) == 1 and min(seqs.values()) > before.conversation_seq
