"""TYPING across two gateways (issue 16, spec 13.2, AT-51, INV-33).

alice (phone + laptop) is owned by one gateway, bob (phone + laptop) by the other; the
ConversationWriter decides each TYPING and the relay crosses to bob's gateway through
``qim.to-gateway``. Checked on the real stack: both of bob's devices get
``TYPING{conversation_id, user_id=alice, expires_in_ms=typing_ttl}``, none of alice's own
devices ever does; a second TYPING inside the merge window is not forwarded; a conversation
above ``large_group_member_threshold`` forwards nothing; a non-member is refused with its
request_id; and afterwards bob's mailbox, session list, unread and the group's history hold
nothing but the messages that were really sent. Every negative check waits for a later
positive frame on the same device (a barrier), never for a quiet second.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from qim.client import QimClient
from qim.devstack.stack import Stack
from qim.schemas.frames import Body, Error, ErrorCode, Frame
from qim.schemas.frames.control import TypingDown
from tests.integration.device_support import eventually
from tests.integration.mailbox_support import Client as MailboxProbe
from tests.integration.realtime_support import collect_until, nodes, pipeline, user_on

pytestmark = pytest.mark.integration

TTL_MS = 5000  # typing_ttl (B.6.1)
WRITER_ENV = {
    # A long merge window: the second TYPING below is merged however slow the box is.
    "QIM_TYPING_MERGE_WINDOW": "600000",
    # 3 members at most: the 4-member group below is "large" (AT-51's 1,001 at small scale).
    "QIM_LARGE_GROUP_MEMBER_THRESHOLD": "3",
}


def typing_from(user: str, conversation: str) -> Callable[[Frame], bool]:
    def match(frame: Frame) -> bool:
        body = frame.body
        return (
            isinstance(body, TypingDown)
            and body.user_id == user
            and body.conversation_id == conversation
        )

    return match


def typings(bodies: list[Body]) -> list[TypingDown]:
    return [b for b in bodies if isinstance(b, TypingDown)]


async def test_typing_reaches_the_other_members_devices_on_another_gateway_only(
    stack: Stack, tmp_path: Path
) -> None:
    tenant = f"t-typ-{uuid.uuid4().hex[:6]}"
    small, large = f"g:small-{uuid.uuid4().hex[:6]}", f"g:large-{uuid.uuid4().hex[:6]}"
    async with (
        pipeline(stack, tmp_path, WRITER_ENV),
        MailboxProbe(stack.cfg.kafka.bootstrap) as probe,
        nodes(stack) as (a, b),
    ):
        alice, carol = user_on(a, tenant, "alice-"), user_on(a, tenant, "carol-")
        bob, dave = user_on(b, tenant, "bob-"), user_on(b, tenant, "dave-")
        mallory = user_on(b, tenant, "mallory-")
        clients: list[QimClient] = []
        try:
            alice_phone = await a.online(tenant, alice, "phone")
            alice_laptop = await a.online(tenant, alice, "laptop")
            carol_pc = await a.online(tenant, carol, "pc")
            bob_phone = await b.online(tenant, bob, "phone")
            bob_laptop = await b.online(tenant, bob, "laptop")
            stranger = await b.online(tenant, mallory, "pc")
            clients += [alice_phone, alice_laptop, carol_pc, bob_phone, bob_laptop, stranger]
            await alice_phone.create_group(small, (bob, carol))
            await alice_phone.create_group(large, (bob, carol, dave))
            hello = await alice_phone.send_message(small, b"hello")

            async def bob_has_hello() -> bool:
                rows = {r.conversation_id: r for r in await probe.session_list(tenant, bob, 10)}
                row = rows.get(small)
                return row is not None and row.latest_conversation_seq == hello.conversation_seq

            await eventually(bob_has_hello, "bob's row for the small group")
            mailbox_before = await probe.pull_all(tenant, bob)
            list_before = await probe.session_list(tenant, bob, 10)

            # AT-51: typing in the small group reaches bob's two devices on the other gateway.
            await alice_phone.typing(small)
            await alice_phone.typing(small)  # inside typing_merge_window: merged
            await alice_phone.typing(large)  # above large_group_member_threshold: not forwarded
            await carol_pc.typing(small)  # the barrier behind alice's three
            for device in (bob_phone, bob_laptop):
                seen = typings(await collect_until(device, typing_from(carol, small), "carol"))
                assert [(t.user_id, t.conversation_id) for t in seen] == [
                    (alice, small),
                    (carol, small),
                ], "one indicator per window, none for the large group"
                assert all(t.expires_in_ms == TTL_MS for t in seen)
            assert bob_phone.typing_indicators.typing(small, 0) == (alice, carol)

            # never the typist's own devices: both of alice's see carol's and bob's, not hers
            await bob_laptop.typing(small)
            for device in (alice_phone, alice_laptop):
                seen = typings(await collect_until(device, typing_from(bob, small), "bob"))
                assert {t.user_id for t in seen} == {carol, bob}, "alice saw her own typing"

            # a stranger may not type into the group: PERMISSION_DENIED with its request_id
            rid = await stranger.typing(small)
            refusal = await collect_until(
                stranger, lambda f: isinstance(f.body, Error), "the stranger's refusal"
            )
            error = refusal[-1]
            assert isinstance(error, Error)
            assert error.code == int(ErrorCode.PERMISSION_DENIED) and error.request_id == rid

            # INV-33: nothing of it reached a mailbox, a session list, unread or the history.
            marker = await alice_phone.send_message(small, b"marker")

            async def bob_has_marker() -> bool:
                rows = {r.conversation_id: r for r in await probe.session_list(tenant, bob, 10)}
                row = rows.get(small)
                return row is not None and row.latest_conversation_seq == marker.conversation_seq

            await eventually(bob_has_marker, "the marker in bob's session list")
            mailbox_after = await probe.pull_all(tenant, bob)
            assert mailbox_after[: len(mailbox_before)] == mailbox_before
            added = mailbox_after[len(mailbox_before) :]
            assert [e.conversation_seq for e in added] == [marker.conversation_seq]
            rows_before = {r.conversation_id: r for r in list_before}
            rows_after = {r.conversation_id: r for r in await probe.session_list(tenant, bob, 10)}
            assert rows_after[small].unread_count == rows_before[small].unread_count + 1
            assert rows_after[large] == rows_before[large]
            history = await alice_phone.pull_history(small, limit=50)
            payloads = [m.payload_or_ciphertext for m in history.messages]
            assert payloads.count(b"hello") == 1 and payloads.count(b"marker") == 1
            seqs = sorted(m.conversation_seq for m in history.messages)
            assert seqs[-1] == marker.conversation_seq  # no TYPING took a seq
        finally:
            for client in clients:
                await client.close()
