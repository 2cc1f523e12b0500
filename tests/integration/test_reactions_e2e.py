"""Reactions end to end (issue 19, spec 13.6): REACT, REACTION_UPDATE, PULL_REACTIONS, recall.

Real ``faust worker`` processes of both apps, two in-process syncing ConnectionNodes, SDK
clients over WebSocket. alice (on gateway 1) and bob (on gateway 2) react to alice's group
message; carol's two devices (one on each gateway) must end with the absolute counts, and the
reactors' own devices with their own keys. Then: a repeated add and a remove of nothing change
nothing, who-reacted pages, a member who logs in later reads the counts with the message in
history, reactions wrote no mailbox entry and no unread, a stranger is refused, a recall drops
the aggregate; and a one-to-one conversation's peer gets the frame too.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from qim.client import QimError
from qim.client.login import SyncResult
from qim.devstack.stack import Stack
from qim.schemas.frames import ErrorCode, EventType
from qim.schemas.frames.reactions import ReactionUpdate
from tests.integration.device_support import drain, eventually, follow, login
from tests.integration.login_support import WAIT_S, syncing_gateway
from tests.integration.mailbox_support import Client as MailboxProbe
from tests.integration.mailbox_support import Node as MailboxWorker
from tests.integration.test_admin_groups import WRITER_ENV, writer_serving
from tests.integration.workers import FaustWorker

pytestmark = pytest.mark.integration

WINDOW_MS = 500  # reaction_push_merge_window for this run (the default is 2 s)


@contextlib.asynccontextmanager
async def pipeline(stack: Stack, base: Path) -> AsyncIterator[MailboxWorker]:
    """Both apps' workers; the writer with a short merge window."""
    env = {**WRITER_ENV, "QIM_REACTION_PUSH_MERGE_WINDOW": str(WINDOW_MS)}
    writer = FaustWorker(stack, "qim.apps.conversation", base / "conversation", env)
    mailbox = MailboxWorker(stack, base / "mailbox")
    try:
        await asyncio.gather(asyncio.to_thread(writer.start), mailbox.start())
        await asyncio.gather(writer_serving(writer), mailbox.serving(WAIT_S))
        yield mailbox
    finally:
        await asyncio.gather(asyncio.to_thread(writer.stop), mailbox.stop(), return_exceptions=True)


async def test_reactions_reach_online_members_as_absolute_frames_and_history_keeps_them(
    stack: Stack, tmp_path: Path
) -> None:
    tenant = f"t-re-{uuid.uuid4().hex[:6]}"
    async with (
        pipeline(stack, tmp_path),
        MailboxProbe(stack.cfg.kafka.bootstrap) as probe,
        syncing_gateway(stack, "gw-react-1") as gw1,
        syncing_gateway(stack, "gw-react-2") as gw2,
    ):
        alice = await login(gw1, tenant, "alice", "phone")
        bob = await login(gw2, tenant, "bob", "pc")
        carol_phone = await login(gw1, tenant, "carol", "phone")
        carol_tablet = await login(gw2, tenant, "carol", "tablet")
        eve = await login(gw2, tenant, "eve", "pc")
        everyone = [alice, bob, carol_phone, carol_tablet, eve]
        try:
            group = f"g:re-{uuid.uuid4().hex[:6]}"
            await alice.client.create_group(group, ("bob", "carol", "dave"))
            ack = await alice.client.send_message(group, b"lunch?")
            seq = ack.conversation_seq

            first = await alice.client.react(group, seq, "like")
            assert (first.counts, first.summary_version) == ({"like": 1}, 1)
            assert first.self_reaction_keys == ("like",)
            await bob.client.react(group, seq, "like")
            last = await bob.client.react(group, seq, "heart")
            assert last.counts == {"heart": 1, "like": 2} and last.summary_version == 3
            assert last.self_reaction_keys == ("heart", "like")

            # 13.6.2: a repeated add and a remove of nothing succeed and change nothing
            again = await alice.client.react(group, seq, "like")
            assert (again.counts, again.summary_version) == (last.counts, 3)
            nothing = await bob.client.react(group, seq, "party", remove=True)
            assert nothing.summary_version == 3 and nothing.self_reaction_keys == ("heart", "like")

            # carol's two devices (one per gateway) end on the absolute counts, newest version
            for device in (carol_phone, carol_tablet):

                def final(d: SyncResult = device) -> bool:
                    held = d.client.reactions.get(group, seq)
                    return held is not None and held.summary_version == 3

                bodies = await follow(device, final, "carol's REACTION_UPDATE at version 3")
                bodies += await drain(device.client)  # applied while another device was followed
                got = [b for b in bodies if isinstance(b, ReactionUpdate)]
                assert got and all(u.conversation_seq == seq for u in got)
                versions = [u.summary_version for u in got]
                assert versions == sorted(set(versions))  # one frame per version at most
                assert all(u.self_reaction_keys is None for u in got)  # carol reacted to nothing
                held = device.client.reactions.get(group, seq)
                assert held is not None and held.counts == {"heart": 1, "like": 2}
                assert held.self_reaction_keys == ()

            # the reactors' own devices are pushed their own keys
            def alice_final() -> bool:
                held = alice.client.reactions.get(group, seq)
                return held is not None and held.summary_version == 3

            await follow(alice, alice_final, "alice's REACTION_UPDATE at version 3")
            held = alice.client.reactions.get(group, seq)
            assert held is not None and held.self_reaction_keys == ("like",)

            # who reacted (13.6.2): pages in user order, exact has_more
            page = await carol_phone.client.pull_reactions(group, seq, "like")
            assert (page.users, page.total, page.has_more) == (("alice", "bob"), 2, False)
            one = await carol_phone.client.pull_reactions(group, seq, "like", limit=1)
            assert (one.users, one.total, one.has_more) == (("alice",), 2, True)
            rest = await carol_phone.client.pull_reactions(group, seq, "like", offset=1, limit=1)
            assert (rest.users, rest.has_more) == (("bob",), False)
            every = await carol_phone.client.pull_reactions(group, seq)
            assert every.total == 3 and every.users == ("bob", "alice", "bob")  # heart, like

            # a stranger learns nothing
            for call in (
                eve.client.react(group, seq, "like"),
                eve.client.pull_reactions(group, seq, "like"),
            ):
                with pytest.raises(QimError) as denied:
                    await call
                assert denied.value.code == ErrorCode.PERMISSION_DENIED

            # 13.6.1: no mailbox entry, no unread -- barrier: a later message is materialized
            marker = await alice.client.send_message(group, b"marker")

            async def carol_has_marker() -> bool:
                rows = {e.conversation_id: e for e in await probe.session_list(tenant, "carol")}
                row = rows.get(group)
                return row is not None and row.latest_conversation_seq == marker.conversation_seq

            await eventually(carol_has_marker, "the marker in carol's session list")
            rows = {e.conversation_id: e for e in await probe.session_list(tenant, "carol")}
            assert rows[group].unread_count == 2  # lunch? and marker; reactions count nothing
            entries = [
                e for e in await probe.pull_all(tenant, "carol") if e.conversation_id == group
            ]
            messages = {e.message_id for e in entries if e.event_type != EventType.MEMBERSHIP}
            assert messages == {ack.message_id, marker.message_id}

            # a member who was offline reads the counts with the message (read-time join)
            dave = await login(gw1, tenant, "dave", "phone")
            everyone.append(dave)
            history = await dave.client.pull_history(group, direction="newer", limit=50)
            by_seq = {m.conversation_seq: m for m in history.messages}
            joined = by_seq[seq].reactions
            assert joined is not None and joined.counts == {"heart": 1, "like": 2}
            assert joined.summary_version == 3 and joined.self_reaction_keys == ()
            assert by_seq[marker.conversation_seq].reactions is None
            mine = await bob.client.pull_history(group, direction="newer", limit=50)
            bob_view = {m.conversation_seq: m for m in mine.messages}[seq].reactions
            assert bob_view is not None and bob_view.self_reaction_keys == ("heart", "like")
            dave_held = dave.client.reactions.get(group, seq)
            assert dave_held is not None and dave_held.counts == {"heart": 1, "like": 2}

            # 13.6.4: a recall drops the aggregate and the detail; the target is refused
            await alice.client.recall(group, seq)
            history = await dave.client.pull_history(group, direction="newer", limit=50)
            recalled = {m.conversation_seq: m for m in history.messages}[seq]
            assert recalled.state == "RECALLED" and recalled.reactions is None
            assert dave.client.reactions.get(group, seq) is None  # the SDK forgot it too
            for call in (
                bob.client.react(group, seq, "like", remove=True),
                bob.client.pull_reactions(group, seq, "like"),
            ):
                with pytest.raises(QimError) as gone:
                    await call
                assert gone.value.code == ErrorCode.PERMISSION_DENIED

            # a one-to-one conversation: the peer's device is pushed the frame too
            direct = alice.client.direct_conversation_id("bob")
            hello = await alice.client.send_message(direct, b"hi bob", peer_user_id="bob")
            liked = await bob.client.react(direct, hello.conversation_seq, "like")
            assert liked.counts == {"like": 1} and liked.summary_version == 1

            def alice_sees_bob() -> bool:
                held = alice.client.reactions.get(direct, hello.conversation_seq)
                return held is not None and held.counts == {"like": 1}

            await follow(alice, alice_sees_bob, "alice's REACTION_UPDATE of the direct message")
            held = alice.client.reactions.get(direct, hello.conversation_seq)
            assert held is not None and held.self_reaction_keys == ()
        finally:
            await asyncio.gather(*(d.client.close() for d in everyone), return_exceptions=True)
