"""CONVERSATION_STATE [ext] end to end: one device changes, the user's other device sees it.

Real ``faust worker`` processes of ``qim.apps.conversation`` and ``qim.apps.mailbox``, an
in-process ConnectionNode with routing and ``mailbox_sync``, SDK clients over WebSocket. kim's
phone pins, mutes, archives, marks unread, clears and deletes with the ``qim.client`` calls;
her tablet sees each in PULL_SESSION_LIST (spec 12.9), with a new ``snapshot_revision`` after
a pin or an archive (12.8.2): a page cursor of the old revision restarts at page 1. Clear
history keeps the row with an empty preview and unread 0 until the next message (AT-42); a
deleted conversation leaves the list and a new message brings it back. Effects are awaited by
polling with generous deadlines; no duration is asserted.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from qim.client import QimClient
from qim.devstack.stack import Stack
from qim.schemas.frames.history import SessionEntry, SessionListBatch
from tests.integration.device_support import login
from tests.integration.login_support import pipeline, syncing_gateway

pytestmark = pytest.mark.integration

ME = "kim"
WAIT_S = 120.0


async def listed(client: QimClient) -> SessionListBatch:
    """The first page, as large as the server allows (kim has two conversations)."""
    return await client.pull_session_list(limit=50)


async def until(
    client: QimClient, check: Callable[[dict[str, SessionEntry]], bool], what: str
) -> SessionListBatch:
    """PULL_SESSION_LIST on ``client`` until ``check(rows by conversation)`` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while True:
        batch = await listed(client)
        if check({e.conversation_id: e for e in batch.sessions}):
            return batch
        assert loop.time() < deadline, f"timed out waiting for {what}: {batch.sessions}"
        await asyncio.sleep(0.3)


async def test_one_device_changes_state_and_the_other_sees_it(stack: Stack, tmp_path: Path) -> None:
    tenant = f"t-cs-{uuid.uuid4().hex[:6]}"
    async with pipeline(stack, tmp_path), syncing_gateway(stack, "gw-conv-state") as gw:
        s0 = await login(gw, tenant, "s0", "pc")
        s1 = await login(gw, tenant, "s1", "pc")
        phone = await login(gw, tenant, ME, "phone")
        tablet = await login(gw, tenant, ME, "tablet")
        a, b = phone.client, tablet.client
        try:
            c0, c1 = s0.client.direct_conversation_id(ME), s1.client.direct_conversation_id(ME)
            await s0.client.send_message(c0, b"a0", peer_user_id=ME)
            await s1.client.send_message(c1, b"b0", peer_user_id=ME)
            await until(b, lambda r: c0 in r and c1 in r, "both conversations")
            first = await listed(b)
            assert [e.conversation_id for e in first.sessions] == [c1, c0]  # newest first
            assert (await listed(b)).snapshot_revision == first.snapshot_revision  # no change
            await a.load_session_list()

            # Pin: c0 moves first on the tablet, in a new revision; an old cursor restarts.
            page1 = await b.pull_session_list(limit=1)
            assert page1.has_more and page1.sessions[0].conversation_id == c1
            await a.pin(c0, 1)
            assert a.sessions.rows[c0].pin_rank == 1  # applied locally at once (no echo)
            pinned = await until(b, lambda r: r[c0].pin_rank == 1, "the pin")
            assert [e.conversation_id for e in pinned.sessions] == [c0, c1]
            assert pinned.snapshot_revision != first.snapshot_revision
            stale = await b.pull_session_list(
                snapshot_revision=page1.snapshot_revision,
                page_cursor=page1.next_page_cursor,
                limit=1,
            )
            assert stale.snapshot_revision != page1.snapshot_revision
            assert [e.conversation_id for e in stale.sessions] == [c0]  # page 1 again

            # Mute: the flag, nothing else.
            await a.mute(c0)
            muted = await until(b, lambda r: r[c0].muted, "the mute")
            assert muted.sessions[0].conversation_id == c0 and muted.sessions[0].pin_rank == 1

            # Archive: c1 moves to the archived partition, in a new revision.
            before = await listed(b)
            await a.archive(c1)
            archived = await until(b, lambda r: r[c1].archived, "the archive")
            assert archived.snapshot_revision != before.snapshot_revision
            assert not {e.conversation_id: e for e in archived.sessions}[c0].archived

            # Mark read, then mark unread: >= 1 unread, inexact (7.5 manual_unread).
            await a.mark_read(c0, pinned.sessions[0].latest_conversation_seq)
            await until(b, lambda r: r[c0].unread_count == 0, "the read")
            await a.mark_unread(c0)
            marked = await until(
                b, lambda r: r[c0].unread_count >= 1 and not r[c0].unread_exact, "mark unread"
            )
            assert {e.conversation_id: e for e in marked.sessions}[c0].muted  # still muted

            # Clear history (AT-42): listed, unread 0 (the mark goes too), empty preview; a
            # new message resumes both.
            await a.clear_history(c0)
            cleared = await until(
                b,
                lambda r: r[c0].preview_or_placeholder == b"" and r[c0].unread_count == 0,
                "clear history",
            )
            assert {e.conversation_id: e for e in cleared.sessions}[c0].unread_exact
            assert c0 in {e.conversation_id for e in cleared.sessions}
            await s0.client.send_message(c0, b"a1", peer_user_id=ME)
            resumed = await until(
                b, lambda r: r[c0].preview_or_placeholder == b"a1", "a message after clear"
            )
            row = {e.conversation_id: e for e in resumed.sessions}[c0]
            assert (row.unread_count, row.unread_exact) == (1, True)

            # Delete: c1 leaves the list; a new message brings it back.
            await a.delete_conversation(c1)
            assert c1 not in a.sessions.rows
            await until(b, lambda r: c1 not in r and c0 in r, "the delete")
            await s1.client.send_message(c1, b"b1", peer_user_id=ME)
            back = await until(
                b,
                lambda r: c1 in r and r[c1].preview_or_placeholder == b"b1",
                "the resurrection",
            )
            row = {e.conversation_id: e for e in back.sessions}[c1]
            assert (row.unread_count, row.unread_exact) == (1, True)
        finally:
            for r in (s0, s1, phone, tablet):
                await r.client.close()
