"""The mention_only tier for very large groups on the real stack (issue 21, spec 10.2.3).

Real ``faust worker`` processes of both apps, a syncing routing gateway, SDK clients over
WebSocket and a mailbox probe. The writer runs with the tier's switch on for one tenant only
(``QIM_TENANT_OVERRIDES``: ``mailbox_write_policy = mention_only``) and the two to-be-measured
admission parameters set so that a five-member group passes (``N x (1 - a) > 2``).

In that tenant: a mentioned member's mailbox gets a MENTION entry and no MESSAGE entry, an
unmentioned member's gets nothing (checked after a later message's MENTION entry reached its
shard, the positive barrier); that member's AUTH_OK asks for the session list
(``projection_complete = false``), its row says ``write_policy = mention_only`` with
``delivered_conversation_seq``, an inexact unread, and the SDK's gap rule reads the message
through PULL_HISTORY. In another tenant of the same workers (switch off, the default) the same
group writes every member a MESSAGE entry and its row says ``always``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from qim.client.login import login_and_sync
from qim.devstack.stack import Stack
from qim.schemas.frames import EventType, SyncEntry
from qim.schemas.frames.base import MentionType
from tests.integration.device_support import eventually, login
from tests.integration.login_support import WAIT_S, new_client, syncing_gateway
from tests.integration.mailbox_support import Client as MailboxProbe
from tests.integration.mailbox_support import Node as MailboxWorker
from tests.integration.test_admin_groups import WRITER_ENV, writer_serving
from tests.integration.test_at_all_limits import _metric
from tests.integration.workers import FaustWorker

pytestmark = pytest.mark.integration

MEMBERS = ("bob", "carol", "dave", "erin")


@contextlib.asynccontextmanager
async def _pipeline(stack: Stack, base: Path, env: dict[str, str]) -> AsyncIterator[FaustWorker]:
    """Both apps' workers; yields the writer (its /metrics port)."""
    writer = FaustWorker(stack, "qim.apps.conversation", base / "conversation", env)
    mailbox = MailboxWorker(stack, base / "mailbox")
    try:
        await asyncio.gather(asyncio.to_thread(writer.start), mailbox.start())
        await asyncio.gather(writer_serving(writer), mailbox.serving(WAIT_S))
        yield writer
    finally:
        await asyncio.gather(asyncio.to_thread(writer.stop), mailbox.stop(), return_exceptions=True)


def _of(entries: list[SyncEntry], group: str, seq: int) -> list[tuple[int, int]]:
    return [
        (e.event_type, e.mention_type)
        for e in entries
        if e.conversation_id == group and e.conversation_seq == seq
    ]


async def test_mention_only_on_for_one_tenant_and_off_by_default(
    stack: Stack, tmp_path: Path
) -> None:
    on, off = f"t-mo-{uuid.uuid4().hex[:6]}", f"t-al-{uuid.uuid4().hex[:6]}"
    writer_env = {
        **WRITER_ENV,
        "QIM_TENANT_OVERRIDES": json.dumps({on: {"mailbox_write_policy": "mention_only"}}),
        "QIM_READ_DIFFUSION_MIN_SAVING": "2",
        "QIM_READ_DIFFUSION_MAX_ACTIVE_RATIO": "0.9",
    }
    async with (
        _pipeline(stack, tmp_path, writer_env) as writer,
        MailboxProbe(stack.cfg.kafka.bootstrap) as probe,
        syncing_gateway(stack, "gw-mention-only") as gw,
    ):
        group = f"g:big-{uuid.uuid4().hex[:6]}"
        alice = await login(gw, on, "alice", "phone")
        try:
            await alice.client.create_group(group, MEMBERS)
            first = await alice.client.send_message(group, b"hi @bob", mention_targets=("bob",))
            second = await alice.client.send_message(
                group, b"and @carol", mention_targets=("carol",)
            )
        finally:
            await alice.client.close()
        # one switch, at the first message (24.1.3); the second kept the policy
        switches = {"tenant": on, "conversation": group, "to": "mention_only"}
        family = "mailbox_write_policy_switch_total"
        assert _metric(writer.web_port, family, switches) == 1.0

        # the mentioned member: a MENTION entry, no MESSAGE entry (AT-39)
        async def bob_mentioned() -> bool:
            return bool(_of(await probe.pull_all(on, "bob"), group, first.conversation_seq))

        await eventually(bob_mentioned, "bob's MENTION entry")
        bob_entries = await probe.pull_all(on, "bob")
        assert _of(bob_entries, group, first.conversation_seq) == [
            (EventType.MENTION, MentionType.AT_ME)
        ]
        assert _of(bob_entries, group, second.conversation_seq) == []  # silent, not mentioned

        # carol: the later message's MENTION entry is the barrier for her shard
        async def carol_barrier() -> bool:
            return bool(_of(await probe.pull_all(on, "carol"), group, second.conversation_seq))

        await eventually(carol_barrier, "carol's MENTION entry of the second message")
        carol_entries = await probe.pull_all(on, "carol")
        assert _of(carol_entries, group, first.conversation_seq) == []
        # the sender is active by its send: its own entries keep coming
        alice_entries = await probe.pull_all(on, "alice")
        assert (EventType.MESSAGE, MentionType.NONE) in _of(
            alice_entries, group, second.conversation_seq
        )

        # carol logs in: AUTH_OK asks for the session list, the SDK runs it (9.3.1, 10.2.3)
        token = await gw.token("carol", "pc", on)
        carol = await login_and_sync(new_client(), gw.ws_url, token, "pc", session_list=None)
        try:
            assert carol.session_list_required
            row = carol.client.sessions.rows[group]
            assert row.write_policy == "mention_only"
            assert row.delivered_conversation_seq == second.conversation_seq
            assert row.latest_conversation_seq == second.conversation_seq
            assert not row.unread_exact and row.unread_count >= 2
            assert row.mention_count == 1  # the MENTION entry keeps the count exact
            # the gap rule: PULL_HISTORY fills up to latest_conversation_seq (AT-41)
            pulled = await carol.client.enter_conversation(group)
            payloads = {m.conversation_seq: m.payload_or_ciphertext for m in pulled}
            assert payloads.get(first.conversation_seq) == b"hi @bob"
            assert payloads.get(second.conversation_seq) == b"and @carol"
            assert await carol.client.enter_conversation(group) == []  # covered now
        finally:
            await carol.client.close()

        # carol came online: the very next message writes her MESSAGE entry again (AT-42)
        alice = await login(gw, on, "alice", "phone")
        try:
            third = await alice.client.send_message(group, b"welcome back")
        finally:
            await alice.client.close()

        async def carol_active() -> bool:
            return bool(_of(await probe.pull_all(on, "carol"), group, third.conversation_seq))

        await eventually(carol_active, "carol's MESSAGE entry after her login")
        assert _of(await probe.pull_all(on, "carol"), group, third.conversation_seq) == [
            (EventType.MESSAGE, MentionType.NONE)
        ]

        # the same group shape in a tenant without the switch: every member's entry (always)
        plain = f"g:plain-{uuid.uuid4().hex[:6]}"
        alice = await login(gw, off, "alice", "phone")
        try:
            await alice.client.create_group(plain, MEMBERS)
            sent = await alice.client.send_message(plain, b"hello all")
        finally:
            await alice.client.close()
        assert _metric(writer.web_port, family, {"tenant": off}) is None  # never switched

        async def carol_has_it() -> bool:
            return bool(_of(await probe.pull_all(off, "carol"), plain, sent.conversation_seq))

        await eventually(carol_has_it, "carol's MESSAGE entry under always")
        assert _of(await probe.pull_all(off, "carol"), plain, sent.conversation_seq) == [
            (EventType.MESSAGE, MentionType.NONE)
        ]
        token = await gw.token("carol", "pc", off)
        carol = await login_and_sync(new_client(), gw.ws_url, token, "pc", session_list=True)
        try:
            assert not carol.session_list_required
            row = carol.client.sessions.rows[plain]
            assert (row.write_policy, row.delivered_conversation_seq) == ("always", None)
            assert await carol.client.enter_conversation(plain) == []  # rule 3: no check
        finally:
            await carol.client.close()
