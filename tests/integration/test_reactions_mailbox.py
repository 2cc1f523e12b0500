"""Reactions reach mailbox pulls (issue 19, spec 13.6, 18.3.1): a new device sees the counts.

Real ``faust worker`` processes of both apps, two syncing ConnectionNodes, SDK clients over
WebSocket. alice and bob react to two of alice's group messages (one small enough to ride
inline in the entry, one joined from the shard's body copy) while carol is offline. carol then
logs in on a fresh device (no cursor): the MESSAGE entries PULL_MAILBOX returns carry the
aggregates and her SDK holds them. After a recall a second fresh device pulls the recalled
entry without its aggregate, the other message's still there. Finally ``qim replay mailbox``'s
rebuild of carol's shard from its dispatch partition equals the live store byte for byte: the
aggregate comes from the log alone.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from qim.agents.mailbox.options import MailboxOptions
from qim.agents.mailbox.replay import replay_worker_shard
from qim.client.login import SyncResult
from qim.devstack.stack import Stack
from qim.params import Settings
from qim.schemas.frames import EventType, SyncEntry
from tests.integration.device_support import eventually, login
from tests.integration.login_support import syncing_gateway
from tests.integration.mailbox_support import WORKER_ENV, shard_of
from tests.integration.mailbox_support import Client as MailboxProbe
from tests.integration.test_reactions_e2e import pipeline

pytestmark = pytest.mark.integration

LONG = b"x" * 3000  # above inline_body_max_bytes (2 KiB): its entry is joined at read time


def message_entry(result: SyncResult, message_id: bytes) -> SyncEntry:
    """The one MESSAGE entry of ``message_id`` the login's PULL_MAILBOX ranges returned."""
    (entry,) = [
        e
        for e in result.entries
        if e.message_id == message_id and e.event_type == EventType.MESSAGE
    ]
    return entry


async def test_a_fresh_device_pulls_the_counts_with_the_message_and_a_recall_drops_them(
    stack: Stack, tmp_path: Path
) -> None:
    tenant = f"t-rm-{uuid.uuid4().hex[:6]}"
    async with (
        pipeline(stack, tmp_path) as mailbox,
        MailboxProbe(stack.cfg.kafka.bootstrap) as probe,
        syncing_gateway(stack, "gw-react-mb-1") as gw1,
        syncing_gateway(stack, "gw-react-mb-2") as gw2,
    ):
        alice = await login(gw1, tenant, "alice", "phone")
        bob = await login(gw2, tenant, "bob", "pc")
        devices = [alice, bob]
        try:
            group = f"g:rm-{uuid.uuid4().hex[:6]}"
            await alice.client.create_group(group, ("bob", "carol"))
            short = await alice.client.send_message(group, b"lunch?")
            long = await alice.client.send_message(group, LONG)

            # carol is offline throughout
            await alice.client.react(group, short.conversation_seq, "like")
            await bob.client.react(group, short.conversation_seq, "like")
            last_short = await bob.client.react(group, short.conversation_seq, "heart")
            assert last_short.counts == {"heart": 1, "like": 2}
            assert last_short.summary_version == 3
            last_long = await bob.client.react(group, long.conversation_seq, "party")
            assert (last_long.counts, last_long.summary_version) == ({"party": 1}, 1)

            # barrier: a later message of the same conversation is in carol's mailbox, so the
            # reactions' summaries before it on her shard's dispatch partition are folded
            marker = await alice.client.send_message(group, b"marker")

            async def carol_has(message_id: bytes) -> bool:
                entries = await probe.pull_all(tenant, "carol")
                return any(e.message_id == message_id for e in entries)

            await eventually(lambda: carol_has(marker.message_id), "the marker for carol")

            carol = await login(gw1, tenant, "carol", "phone")  # a new device: no cursor
            devices.append(carol)
            inline = message_entry(carol, short.message_id)
            assert inline.body_included and inline.payload_or_ciphertext == b"lunch?"
            assert inline.reactions is not None
            assert inline.reactions.counts == {"heart": 1, "like": 2}
            assert inline.reactions.summary_version == 3
            joined = message_entry(carol, long.message_id)
            assert joined.body_included and joined.payload_or_ciphertext == LONG
            assert joined.reactions is not None
            assert (joined.reactions.counts, joined.reactions.summary_version) == (
                {"party": 1},
                1,
            )
            assert message_entry(carol, marker.message_id).reactions is None  # nobody reacted
            held = carol.client.reactions.get(group, short.conversation_seq)
            assert held is not None and held.counts == {"heart": 1, "like": 2}
            assert held.summary_version == 3 and held.self_reaction_keys == ()
            applied = mailbox.totals().get("reaction_summary_applied_total")
            assert applied is not None and applied >= 4  # carol's shard folded all four

            # 13.6.4: a recall drops the aggregate from the pull
            recall = await alice.client.recall(group, short.conversation_seq)
            await eventually(lambda: carol_has(recall.message_id), "the recall for carol")
            tablet = await login(gw2, tenant, "carol", "tablet")
            devices.append(tablet)
            recalled = message_entry(tablet, short.message_id)
            assert recalled.reactions is None and not recalled.body_included
            assert tablet.client.reactions.get(group, short.conversation_seq) is None
            kept = message_entry(tablet, long.message_id)
            assert kept.reactions is not None and kept.reactions.counts == {"party": 1}
        finally:
            await asyncio.gather(*(d.client.close() for d in devices), return_exceptions=True)

        # qim replay mailbox: carol's shard rebuilt from its dispatch partition is the live one
        options = MailboxOptions.load(
            Settings.load(env=WORKER_ENV),
            WORKER_ENV,
            bootstrap=stack.cfg.kafka.bootstrap,
            datadir=mailbox.worker.datadir,
        )
        report = await replay_worker_shard(
            options, shard_of(tenant, "carol"), tmp_path / "replay-carol"
        )
        assert report.ok, report.lines()
        assert report.records_read > 0
