"""Spec 26.4.5 and 26.4.7 with three devices: A and B online, C offline until the end.

Real workers of both apps, an in-process syncing ConnectionNode, SDK clients over WebSocket.
On A: MARK_READ, mark unread, pin, mute (the SDK's CONVERSATION_STATE calls). B follows by
its pushed CONTROL entries and PULL_SESSION_LIST; A gets no echo of its own read; C logs in
afterwards and recovers the same UserConversationState from its mailbox's CONTROL entries;
a MARK_READ at or above the manual-unread mark then clears it on every device.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from qim.client import QimClient, SyncResult
from qim.core.mailbox.session_store import decode_state
from qim.core.mailbox.user_state import USER_STATE_CUSTOM_TYPE
from qim.core.session_list import UserConversationState
from qim.devstack.stack import Stack
from qim.schemas.frames import PushEvents, SyncEntry
from qim.schemas.frames.base import EventType
from qim.schemas.frames.control import ReadSync
from qim.schemas.frames.history import SessionEntry
from tests.integration.device_support import WAIT_S, drain, login
from tests.integration.login_support import pipeline, syncing_gateway

pytestmark = pytest.mark.integration

ME = "kim"


def states(entries: list[SyncEntry], conv: str) -> list[UserConversationState]:
    """The UserConversationStates the user-state CONTROL entries of ``conv`` carry, in order."""
    return [
        decode_state(e.payload_or_ciphertext or b"")
        for e in sorted(entries, key=lambda e: (e.mailbox_seq, e.event_ordinal, e.event_id))
        if e.event_type == EventType.CONTROL
        and e.custom_type == USER_STATE_CUSTOM_TYPE
        and e.conversation_id == conv
    ]


async def row_of(client: QimClient, conv: str) -> SessionEntry | None:
    batch = await client.pull_session_list(limit=50)
    return {e.conversation_id: e for e in batch.sessions}.get(conv)


async def until_row(
    client: QimClient, conv: str, check: Callable[[SessionEntry], bool], what: str
) -> SessionEntry:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while True:
        row = await row_of(client, conv)
        if row is not None and check(row):
            return row
        assert loop.time() < deadline, f"timed out waiting for {what}: {row}"
        await asyncio.sleep(0.3)


async def pushed_states(
    device: SyncResult, conv: str, done: Callable[[UserConversationState], bool]
) -> list[UserConversationState]:
    """The user-state CONTROL entries pushed to ``device`` for ``conv``, read until the newest
    one satisfies ``done`` (a push follows the WriteBatch a pull already sees: wait for it)."""
    entries: list[SyncEntry] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while True:
        found = states(entries, conv)
        if found and done(found[-1]):
            return found
        assert loop.time() < deadline, f"timed out waiting for pushed state: {found[-1:]}"
        try:
            frame = await device.client.next_event(timeout=0.5)
        except TimeoutError:
            continue
        if isinstance(frame.body, PushEvents):
            entries.extend(frame.body.events)


async def test_read_pin_mute_and_manual_unread_reach_every_device_26_4_5_and_26_4_7(
    stack: Stack, tmp_path: Path
) -> None:
    tenant = f"t-264-{uuid.uuid4().hex[:6]}"
    async with pipeline(stack, tmp_path), syncing_gateway(stack, "gw-26-4") as gw:
        s0 = await login(gw, tenant, "s0", "pc")
        a = await login(gw, tenant, ME, "phone")
        b = await login(gw, tenant, ME, "tablet")
        c: SyncResult | None = None
        try:
            conv = s0.client.direct_conversation_id(ME)
            acks = [
                await s0.client.send_message(conv, f"k{n}".encode(), peer_user_id=ME)
                for n in range(3)
            ]
            latest = acks[-1].conversation_seq
            await until_row(b.client, conv, lambda r: r.unread_count == 3, "three unread")

            # 26.4.7 (0): K fully read on A.
            await a.client.mark_read(conv, latest)
            await until_row(b.client, conv, lambda r: r.unread_count == 0, "the read on B")
            # 26.4.7 (1) + 26.4.5: mark unread, pin, mute on A.
            await a.client.mark_unread(conv)
            await a.client.pin(conv, 1)
            await a.client.mute(conv)
            row_b = await until_row(
                b.client,
                conv,
                lambda r: r.unread_count >= 1 and r.pin_rank == 1 and r.muted,
                "mark unread, pin and mute on B",
            )
            assert not row_b.unread_exact and row_b.read_conversation_seq == latest
            row_a = await row_of(a.client, conv)
            assert row_a is not None and row_a.unread_count >= 1  # A shows it unread too

            # A never gets its own read echoed; B got every change as a CONTROL entry.
            assert not [x for x in await drain(a.client) if isinstance(x, ReadSync)]
            on_b = await pushed_states(
                b,
                conv,
                lambda s: s.pin_rank == 1 and s.muted and bool(s.manual_unread_conversation_seq),
            )
            final_b = on_b[-1]
            assert final_b.read_conversation_seq == latest
            assert final_b.manual_unread_conversation_seq == latest  # U = head latest (7.5)
            assert (final_b.pin_rank, final_b.muted) == (1, True)

            # C comes online: its mailbox's CONTROL entries give the same state, field by field.
            c = await login(gw, tenant, ME, "laptop")
            on_c = states(c.entries, conv)
            assert on_c and on_c[-1] == final_b
            assert all(
                e.origin_device_id == "phone"
                for e in c.entries
                if e.custom_type == USER_STATE_CUSTOM_TYPE
            )
            row_c = await row_of(c.client, conv)
            assert row_c is not None and row_c.unread_count >= 1 and row_c.pin_rank == 1

            # 26.4.7 (4): MARK_READ at the mark clears it on all three devices.
            await a.client.mark_read(conv, latest)  # not above the watermark: a no-op
            await s0.client.send_message(conv, b"k3", peer_user_id=ME)
            newest = await until_row(
                b.client, conv, lambda r: r.latest_conversation_seq > latest, "k3 on B"
            )
            await a.client.mark_read(conv, newest.latest_conversation_seq)
            for device in (a, b, c):
                cleared = await until_row(
                    device.client,
                    conv,
                    lambda r: r.unread_count == 0 and r.unread_exact,
                    "the cleared mark",
                )
                assert cleared.read_conversation_seq == newest.latest_conversation_seq
                assert cleared.pin_rank == 1 and cleared.muted  # untouched by the read
        finally:
            for r in (s0, a, b, *(() if c is None else (c,))):
                await r.client.close()
