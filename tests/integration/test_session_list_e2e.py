"""The session list end to end (issue 7): real pipeline, syncing gateway, two SDK devices.

Real ``faust worker`` processes of ``qim.apps.conversation`` and ``qim.apps.mailbox``, an
in-process ConnectionNode with routing and ``mailbox_sync``, ``login_and_sync`` over
WebSocket. dana is offline while three senders write 300 messages into her five
conversations (three one-to-one, two groups); the reference list is computed from what the
senders' SEND_ACKs say was committed, never from the projection.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from qim.client import QimClient
from qim.devstack.stack import Stack
from qim.schemas.frames.control import ReadSync
from qim.schemas.frames.history import SessionEntry
from tests.integration.device_support import WAIT_S, drain, eventually, follow, login
from tests.integration.login_support import pipeline, syncing_gateway
from tests.integration.mailbox_support import Client as MailboxProbe
from tests.integration.mailbox_support import user_state

pytestmark = pytest.mark.integration

ME = "dana"
SENDERS = ("s0", "s1", "s2")


@dataclass(frozen=True)
class Sent:
    conversation_id: str
    conversation_seq: int
    activity: int
    sender: str
    mentions_me: bool
    payload: bytes


def reference(sent: list[Sent], read: dict[str, int]) -> list[tuple[object, ...]]:
    rows = []
    for conv in sorted({s.conversation_id for s in sent}):
        mine = [s for s in sent if s.conversation_id == conv]
        last = max(mine, key=lambda s: s.conversation_seq)
        others = [s for s in mine if s.sender != ME and s.conversation_seq > read.get(conv, 0)]
        unread, mentions = len(others), sum(s.mentions_me for s in others)
        rows.append(
            (last.activity, (conv, last.conversation_seq, last.payload, unread, True, mentions))
        )
    rows.sort(key=lambda r: r[0], reverse=True)
    return [r[1] for r in rows]


def shown(entries: list[SessionEntry]) -> list[tuple[object, ...]]:
    return [
        (e.conversation_id, e.latest_conversation_seq, e.preview_or_placeholder, e.unread_count,
         e.unread_exact, e.mention_count)
        for e in entries
    ]  # fmt: skip


async def test_offline_list_second_device_mark_read_and_badges(
    stack: Stack, tmp_path: Path
) -> None:
    tenant = f"t-sl-{uuid.uuid4().hex[:6]}"
    rng = random.Random(3)
    sent: list[Sent] = []
    async with (
        pipeline(stack, tmp_path),
        MailboxProbe(stack.cfg.kafka.bootstrap) as probe,
        syncing_gateway(stack, "gw-sessions") as gw,
    ):
        senders = {s: await login(gw, tenant, s, "pc") for s in SENDERS}
        tablet = await login(gw, tenant, ME, "tablet")
        try:
            g1, g2 = f"g:a-{uuid.uuid4().hex[:6]}", f"g:b-{uuid.uuid4().hex[:6]}"
            await senders["s0"].client.create_group(g1, ("s1", ME))
            await senders["s1"].client.create_group(g2, ("s2", ME))
            convs: dict[str, tuple[str, ...]] = {g1: ("s0", "s1"), g2: ("s1", "s2")}
            for s, r in senders.items():
                convs[r.client.direct_conversation_id(ME)] = (s,)

            async def send(user: str, client: QimClient, conv: str, n: int) -> None:
                group = conv.startswith("g:")
                mention = group and user != ME and rng.random() < 0.2
                peer = "" if group else (ME if user != ME else convs[conv][0])
                payload = f"m{n}".encode()
                ack = await client.send_message(
                    conv, payload, mention_targets=(ME,) if mention else (), peer_user_id=peer
                )
                activity = int.from_bytes(ack.last_activity_id, "big")
                sent.append(Sent(conv, ack.conversation_seq, activity, user, mention, payload))

            for n in range(5):  # dana's own, from the tablet: never unread
                conv = rng.choice(sorted(convs))
                await send(ME, tablet.client, conv, 1000 + n)
            await tablet.client.close()
            for n in range(300):  # dana offline
                conv = rng.choice(sorted(convs))
                user = rng.choice(convs[conv])
                await send(user, senders[user].client, conv, n)
            expected = reference(sent, {})
            loop = asyncio.get_running_loop()
            deadline = loop.time() + WAIT_S
            while shown(await probe.session_list(tenant, ME, limit=50)) != expected:
                assert loop.time() < deadline, "the MailboxNode never folded the history"
                await asyncio.sleep(0.5)

            # 1. Login after the offline period: AUTH_OK badge and every page = the reference.
            phone = await login(gw, tenant, ME, "phone")
            ok = phone.auth_ok
            assert ok.total_unread == sum(int(r[3]) for r in expected)  # type: ignore[call-overload]
            assert ok.total_mention == sum(int(r[5]) for r in expected)  # type: ignore[call-overload]
            assert ok.projection_complete and ok.badge_projection_mailbox_seq > 0
            assert shown(await phone.client.load_session_list(limit=2)) == expected

            # 2. A second device marks the top conversation read: the phone follows by
            #    READ_SYNC / SESSION_DELTA / BADGE_UPDATE; the tablet gets no echo.
            tablet = await login(gw, tenant, ME, "tablet")
            await tablet.client.load_session_list()
            top, latest = str(expected[0][0]), int(expected[0][1])  # type: ignore[call-overload]
            await tablet.client.mark_read(top, latest)
            after = reference(sent, {top: latest})
            total = sum(int(r[3]) for r in after)  # type: ignore[call-overload]
            rows = phone.client.sessions.rows

            def followed() -> bool:
                badge = phone.client.sessions.badge
                return (
                    rows[top].unread_count == 0
                    and rows[top].read_conversation_seq == latest
                    and badge is not None
                    and badge.total_unread == total
                )

            bodies = await follow(phone, followed, "the phone following the tablet's MARK_READ")
            bodies += await drain(phone.client)  # frames applied on arrival, still queued
            assert ReadSync(conversation_id=top, read_conversation_seq=latest) in bodies
            assert shown(phone.client.sessions.ordered()) == after
            echoed = await drain(tablet.client)
            assert not [b for b in echoed if isinstance(b, ReadSync)]
            assert tablet.client.sessions.rows[top].unread_count == 0  # its own, applied

            # 3. dana leaves g1: the group leaves her list, later messages bring nothing back.
            await phone.client.leave_group(g1)
            for n in range(3):
                await send("s0", senders["s0"].client, g1, 2000 + n)
            await send("s1", senders["s1"].client, g2, 2100)  # a marker dana does receive

            async def list_now() -> list[SessionEntry]:
                return await probe.session_list(tenant, ME, limit=50)

            async def marker_folded() -> bool:
                return any(e.preview_or_placeholder == b"m2100" for e in await list_now())

            await eventually(marker_folded, "the marker after the leave")
            listed = [e.conversation_id for e in await phone.client.load_session_list()]
            assert g1 not in listed and g2 in listed

            # 4. Delete a one-to-one (a user-state request): gone; a new message resurrects it.
            direct = senders["s2"].client.direct_conversation_id(ME)
            await probe.send(user_state(tenant, ME, direct, "delete", device="phone"))

            async def deleted() -> bool:
                return direct not in [e.conversation_id for e in await list_now()]

            await eventually(deleted, "the delete")
            await send("s2", senders["s2"].client, direct, 2200)

            async def resurrected() -> bool:
                rows = {e.conversation_id: e for e in await list_now()}
                row = rows.get(direct)
                return row is not None and row.preview_or_placeholder == b"m2200"

            await eventually(resurrected, "the resurrection")
            (row,) = [e for e in await list_now() if e.conversation_id == direct]
            assert (row.unread_count, row.unread_exact) == (1, True)
        finally:
            for r in [*senders.values(), tablet]:
                await r.client.close()
            if "phone" in locals():
                await phone.client.close()
