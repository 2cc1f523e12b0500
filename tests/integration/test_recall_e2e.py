"""Recall and edit end to end through the session list (issue 7, spec 13.4, 12.4.2, 12.5.5).

Real ``faust worker`` processes of both apps, an in-process syncing ConnectionNode, SDK clients
over WebSocket. dana's phone is online while s0 recalls and edits in their one-to-one
conversation, and s1 (a group owner) recalls s0's group message. What the list shows is read
both from the MailboxNode (PULL_SESSION_LIST) and from the phone's local list, which only
changes through SESSION_DELTA frames; history is read with PULL_HISTORY.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import msgspec
import pytest

from qim.client import QimError
from qim.devstack.stack import Stack
from qim.schemas.frames import ErrorCode
from qim.schemas.frames.history import SessionEntry
from qim.schemas.records.outbox import PreviewPlaceholder
from tests.integration.device_support import eventually, follow, login
from tests.integration.login_support import pipeline, syncing_gateway
from tests.integration.mailbox_support import Client as MailboxProbe

pytestmark = pytest.mark.integration

ME = "dana"


def placeholder_state(preview: bytes) -> str:
    """The ``state`` of a placeholder preview ("" for a text preview that is not one)."""
    try:
        return msgspec.msgpack.decode(preview, type=PreviewPlaceholder).state
    except (msgspec.DecodeError, msgspec.ValidationError):
        return ""


async def test_recall_and_edit_repair_the_preview_and_count_unread_once(
    stack: Stack, tmp_path: Path
) -> None:
    tenant = f"t-rc-{uuid.uuid4().hex[:6]}"
    async with (
        pipeline(stack, tmp_path),
        MailboxProbe(stack.cfg.kafka.bootstrap) as probe,
        syncing_gateway(stack, "gw-recall") as gw,
    ):
        s0 = await login(gw, tenant, "s0", "pc")
        s1 = await login(gw, tenant, "s1", "pc")
        phone = await login(gw, tenant, ME, "phone")
        try:
            direct = s0.client.direct_conversation_id(ME)

            async def send(payload: bytes) -> tuple[int, bytes]:
                ack = await s0.client.send_message(direct, payload, peer_user_id=ME)
                return ack.conversation_seq, ack.last_activity_id

            sent = [await send(f"m{n}".encode()) for n in (1, 2, 3)]
            top_seq, top_activity = sent[-1]

            async def row() -> SessionEntry | None:
                rows = {e.conversation_id: e for e in await probe.session_list(tenant, ME)}
                return rows.get(direct)

            async def unread_is(n: int) -> bool:
                r = await row()
                return r is not None and r.unread_count == n and r.latest_conversation_seq >= 3

            await eventually(lambda: unread_is(3), "three unread messages")
            await phone.client.load_session_list()

            # AT-12: recall the preview message -> placeholder, no move, unread - 1, a delta.
            recall = await s0.client.recall(direct, top_seq)
            assert recall.conversation_seq > top_seq  # the CONTROL event has its own seq
            await eventually(lambda: unread_is(2), "the recall's decrement")
            shown = await row()
            assert shown is not None
            assert placeholder_state(shown.preview_or_placeholder) == "recalled"
            assert shown.latest_conversation_seq == top_seq  # INV-05: the CONTROL seq is not it
            assert shown.last_activity_id == top_activity  # no reordering
            local = phone.client.sessions.rows

            def phone_followed() -> bool:
                r = local.get(direct)
                return r is not None and placeholder_state(r.preview_or_placeholder) == "recalled"

            await follow(phone, phone_followed, "the phone's SESSION_DELTA for the recall")
            assert local[direct].unread_count == 2
            assert local[direct].latest_conversation_seq == top_seq

            # 13.4.4: a retried recall is the same event; nothing is decremented twice.
            again = await s0.client.recall(direct, top_seq)
            assert again.conversation_seq == recall.conversation_seq
            m4_seq, _ = await send(b"m4")
            await eventually(lambda: unread_is(3), "m4 after the retried recall")

            # AT-13-like: edit an older message -> the preview (m4) and unread stay.
            await s0.client.edit(direct, sent[0][0], b"m1-edited")
            # edit the preview message -> the preview is the new text, unread unchanged.
            await s0.client.edit(direct, m4_seq, b"m4-edited")

            async def edited() -> bool:
                r = await row()
                return r is not None and r.preview_or_placeholder == b"m4-edited"

            await eventually(edited, "the edit of the preview message")
            shown = await row()
            assert shown is not None and shown.unread_count == 3
            assert shown.latest_conversation_seq == m4_seq

            # AT-25: dana recalls her own message -> s0 loses one unread, dana none.
            mine = await phone.client.send_message(direct, b"from dana", peer_user_id="s0")
            await phone.client.recall(direct, mine.conversation_seq)
            await s0.client.send_message(direct, b"marker", peer_user_id=ME)

            async def marker() -> bool:
                r = await row()
                return r is not None and r.preview_or_placeholder == b"marker"

            await eventually(marker, "the marker after dana's own recall")
            shown = await row()
            assert shown is not None and shown.unread_count == 4  # m2 m1 m4 marker; m3 recalled

            # Permissions: dana cannot recall s0's message; history shows the final states.
            with pytest.raises(QimError) as denied:
                await phone.client.recall(direct, sent[1][0])
            assert denied.value.code == ErrorCode.PERMISSION_DENIED
            history = await phone.client.pull_history(direct, direction="newer", limit=50)
            states = {m.conversation_seq: m.state for m in history.messages}
            assert states[top_seq] == "RECALLED" and states[sent[0][0]] == "EDITED"
            assert states[sent[1][0]] == "NORMAL"
            by_seq = {m.conversation_seq: m for m in history.messages}
            assert by_seq[top_seq].recall_event_conversation_seq == recall.conversation_seq
            assert by_seq[sent[0][0]].payload_or_ciphertext == b"m1-edited"
            assert not by_seq[top_seq].payload_or_ciphertext  # the recalled body is not served

            # A group owner recalls another member's message (no window, 13.4.3).
            group = f"g:rc-{uuid.uuid4().hex[:6]}"
            await s1.client.create_group(group, ("s0", ME))
            ack = await s0.client.send_message(group, b"group hello")

            async def group_unread(n: int) -> bool:
                rows = {e.conversation_id: e for e in await probe.session_list(tenant, ME)}
                r = rows.get(group)
                return r is not None and r.unread_count == n

            await eventually(lambda: group_unread(1), "the group message")
            with pytest.raises(QimError) as denied:
                await phone.client.recall(group, ack.conversation_seq)
            assert denied.value.code == ErrorCode.PERMISSION_DENIED
            await s1.client.recall(group, ack.conversation_seq)
            await eventually(lambda: group_unread(0), "the owner's recall")
        finally:
            for r in (s0, s1, phone):
                await r.client.close()
