"""``max_conversations_per_user`` end to end (I-26, acceptance 29), with the cap set to 3.

Real ``faust worker`` processes of ``qim.apps.conversation`` and ``qim.apps.mailbox`` (both
with ``QIM_MAX_CONVERSATIONS_PER_USER=3``), an in-process ConnectionNode with routing and
``mailbox_sync``, the group admin endpoint, SDK clients over WebSocket. kim reaches three
conversations; her MailboxNode publishes the crossing on ``qim.user-quota`` and the writer
(whose ``/writer`` page counts the exhausted users it holds) then refuses a new one-to-one
conversation from either side, a CREATE_GROUP inviting her and an admin add of her with
``ERROR{PERMISSION_DENIED, detail=conversation_quota_exhausted}``, while her existing
conversations keep working. A local delete frees a slot: a new conversation is accepted again.
Waits poll with generous deadlines; no duration is asserted.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest

from qim.admin.client import AdminHttpError
from qim.client import QimClient, QimError
from qim.devstack.stack import Stack
from qim.schemas.frames.errors import ErrorCode
from tests.integration.device_support import login
from tests.integration.login_support import syncing_gateway
from tests.integration.mailbox_support import Node as MailboxWorker
from tests.integration.test_admin_groups import WRITER_ENV, http, serve, writer_serving
from tests.integration.workers import FaustWorker

pytestmark = pytest.mark.integration

CAP_ENV = {"QIM_MAX_CONVERSATIONS_PER_USER": "3"}
WAIT_S = 120.0
DETAIL = "conversation_quota_exhausted"
ME = "kim"


class Pipeline:
    """Both workers with the small cap; ``exhausted()`` reads the writer's held set size."""

    def __init__(self, stack: Stack, base: Path) -> None:
        env = {**WRITER_ENV, **CAP_ENV}
        self.writer = FaustWorker(stack, "qim.apps.conversation", base / "conversation", env)
        self.mailbox = MailboxWorker(stack, base / "mailbox", CAP_ENV)

    async def exhausted(self) -> int:
        status = await asyncio.to_thread(self.writer.get, "/writer")
        return int(status["quota_exhausted"])

    async def until_exhausted(self, count: int, what: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while await self.exhausted() != count:
            assert loop.time() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.3)


@pytest.fixture
async def workers(stack: Stack, tmp_path: Path) -> AsyncIterator[Pipeline]:
    p = Pipeline(stack, tmp_path)
    try:
        await asyncio.gather(asyncio.to_thread(p.writer.start), p.mailbox.start())
        await asyncio.gather(writer_serving(p.writer), p.mailbox.serving(WAIT_S))
        yield p
    finally:
        await asyncio.gather(
            asyncio.to_thread(p.writer.stop), p.mailbox.stop(), return_exceptions=True
        )


async def refused(call: Awaitable[object]) -> QimError:
    with pytest.raises(QimError) as caught:
        await call
    assert (caught.value.code, caught.value.detail) == (ErrorCode.PERMISSION_DENIED, DETAIL)
    return caught.value


async def direct(client: QimClient, peer: str, payload: bytes) -> None:
    await client.send_message(client.direct_conversation_id(peer), payload, peer_user_id=peer)


async def test_the_cap_refuses_new_conversations_until_a_delete_frees_one(
    stack: Stack, workers: Pipeline
) -> None:
    tenant = f"t-quota-{uuid.uuid4().hex[:6]}"
    baseline = await workers.exhausted()
    admin = await serve(stack, timeout_s=WAIT_S)
    async with syncing_gateway(stack, "gw-quota") as gw:
        me = (await login(gw, tenant, ME, "phone")).client
        peers = [(await login(gw, tenant, f"s{i}", "pc")).client for i in range(5)]
        try:
            for i, peer in enumerate(peers[:3]):
                await direct(me, f"s{i}", b"hello")
                await direct(peer, ME, b"hi")  # an existing conversation: no new one
            await workers.until_exhausted(baseline + 1, "kim's crossing at 3 conversations")

            # A fourth conversation is refused from either side; nothing was committed.
            await refused(direct(me, "s3", b"one too many"))
            await refused(direct(peers[3], ME, b"let me in"))
            await refused(peers[0].create_group(f"g:q{uuid.uuid4().hex[:6]}", ("s1", ME)))
            group = f"g:qa{uuid.uuid4().hex[:6]}"
            await asyncio.to_thread(http(admin).create, tenant, group, "s0", ["s1"])
            with pytest.raises(AdminHttpError) as caught:
                await asyncio.to_thread(http(admin).add, tenant, group, [ME])
            assert (caught.value.status, caught.value.body.get("detail")) == (403, DETAIL)
            added = await asyncio.to_thread(http(admin).add, tenant, group, ["s2"])
            assert added["member_count"] == 3  # the add path itself works for others

            # Existing conversations keep working at the cap, both ways.
            await direct(me, "s0", b"still here")
            await direct(peers[1], ME, b"me too")

            # A local delete frees a slot; a new conversation is accepted again.
            await me.delete_conversation(me.direct_conversation_id("s2"))
            await workers.until_exhausted(baseline, "kim's slot freed by the delete")
            await direct(me, "s3", b"now there is room")
            await workers.until_exhausted(baseline + 1, "kim at the cap again")
            await refused(direct(peers[4], ME, b"and the cap holds again"))
        finally:
            for client in (me, *peers):
                await client.close()
            await admin.close()
