"""``max_conversations_per_user`` end to end (I-26, acceptance 29), with the cap set to 3.

Real ``faust worker`` processes of ``qim.apps.conversation`` and ``qim.apps.mailbox`` (both
with ``QIM_MAX_CONVERSATIONS_PER_USER=3``), an in-process ConnectionNode with routing and
``mailbox_sync``, the group admin endpoint, SDK clients over WebSocket. kim reaches three
conversations; her MailboxNode publishes the crossing on ``qim.user-quota`` and the writer
(whose ``/writer`` page counts the exhausted users it holds) then refuses a new one-to-one
conversation from either side, a CREATE_GROUP inviting her and an admin add of her with
``ERROR{PERMISSION_DENIED, detail=conversation_quota_exhausted}``, while her existing
conversations keep working. A local delete frees a slot: a new conversation is accepted again.
Then the lost publish: the mailbox worker is killed (``QIM_MAILBOX_QUOTA_CRASH=free``) after the
delete's WriteBatch, before its record is sent; the restarted worker's takeover reconcile
publishes the freed state and the writer admits her again.
Waits poll with generous deadlines; no duration is asserted.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from qim.admin.client import AdminHttpError
from qim.agents.mailbox.quota import QUOTA_CRASH_ENV
from qim.client import QimClient, QimError
from qim.core.mailbox.quota import latest_published
from qim.devstack.stack import Stack
from qim.schemas.frames.errors import ErrorCode
from qim.streams import USER_QUOTA
from tests.integration.device_support import login
from tests.integration.login_support import syncing_gateway
from tests.integration.mailbox_support import SHARDS, eventually
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

    def __init__(self, stack: Stack, base: Path, mailbox_env: dict[str, str] | None = None) -> None:
        env = {**WRITER_ENV, **CAP_ENV}
        self.writer = FaustWorker(stack, "qim.apps.conversation", base / "conversation", env)
        self.mailbox = MailboxWorker(stack, base / "mailbox", {**CAP_ENV, **(mailbox_env or {})})

    async def exhausted(self) -> int:
        status = await asyncio.to_thread(self.writer.get, "/writer")
        return int(status["quota_exhausted"])

    async def until_exhausted(self, count: int, what: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while await self.exhausted() != count:
            assert loop.time() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.3)

    async def settled(self, stack: Stack) -> int:
        """The exhausted count once this fresh mailbox worker's replay of the earlier tests'
        log and its takeover pass are done and the writer holds every state they published
        (the baseline: replayed crossings of other users must not move it mid-test)."""

        def done() -> bool:
            st = self.mailbox.status()
            shards = st.get("shards", {}).values()
            caught_up = all(s["next_offset"] >= s["high_water_at_takeover"] for s in shards)
            return bool(shards) and caught_up and st["user_quota"]["pending"] == []

        await eventually(done, WAIT_S, "replay and quota pass done", self.mailbox.worker.log_tail)
        expected = await published_exhausted(stack.cfg.kafka.bootstrap)
        await self.until_exhausted(expected, "the writer holding qim.user-quota's state")
        return expected

    def refusals(self, tenant: str) -> float:
        """``qim_writer_quota_refused_total`` of ``tenant`` on the writer's scrape."""
        url = f"http://127.0.0.1:{self.writer.web_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        pattern = (
            rf'^qim_writer_quota_refused_total{{[^}}]*tenant="{re.escape(tenant)}"[^}}]*}} (\S+)$'
        )
        found = re.search(pattern, text, re.M)
        return float(found.group(1)) if found else 0.0


async def published_exhausted(bootstrap: str) -> int:
    """How many users' latest ``qim.user-quota`` record says exhausted (read to the end)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(USER_QUOTA.name, p) for p in range(SHARDS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        values = []
        for tp in tps:
            while await consumer.position(tp) < ends[tp]:
                fetched = await consumer.getmany(tp, timeout_ms=500)
                values += [r.value for r in fetched.get(tp, ()) if r.offset < ends[tp]]
        return sum(r.exhausted for r in latest_published(values).values())
    finally:
        await consumer.stop()


@pytest.fixture
async def workers(stack: Stack, tmp_path: Path) -> AsyncIterator[Pipeline]:
    async for p in _pipeline(stack, tmp_path):
        yield p


@pytest.fixture
async def crashing_workers(stack: Stack, tmp_path: Path) -> AsyncIterator[Pipeline]:
    """The mailbox worker dies when a fold plans a "free" record, before sending it."""
    async for p in _pipeline(stack, tmp_path, {QUOTA_CRASH_ENV: "free"}):
        yield p


async def _pipeline(
    stack: Stack, base: Path, mailbox_env: dict[str, str] | None = None
) -> AsyncIterator[Pipeline]:
    p = Pipeline(stack, base, mailbox_env)
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
    baseline = await workers.settled(stack)
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


async def test_a_lost_down_crossing_is_healed_when_the_shard_is_taken_over(
    stack: Stack, crashing_workers: Pipeline
) -> None:
    workers = crashing_workers
    tenant = f"t-quota-heal-{uuid.uuid4().hex[:6]}"
    baseline = await workers.settled(stack)
    async with syncing_gateway(stack, "gw-quota-heal") as gw:
        me = (await login(gw, tenant, ME, "phone")).client
        peers = [(await login(gw, tenant, f"s{i}", "pc")).client for i in range(4)]
        try:
            for i in range(3):
                await direct(me, f"s{i}", b"hello")
            await workers.until_exhausted(baseline + 1, "kim's crossing at 3 conversations")
            await refused(direct(peers[3], ME, b"let me in"))
            assert workers.refusals(tenant) == 1.0  # 20.4.1 rule 3, per tenant

            # The delete is folded, then the worker dies before the "free" record is sent.
            await me.delete_conversation(me.direct_conversation_id("s2"))
            await workers.mailbox.exited(WAIT_S)
            assert await workers.exhausted() == baseline + 1  # the writer still refuses her
            await refused(direct(me, "s3", b"refused on a lost record"))
            assert workers.refusals(tenant) == 2.0

            # The restarted worker replays nothing new (the store has the delete) but its
            # takeover pass reads qim.user-quota, counts 2 and publishes the freed state.
            await workers.mailbox.start()
            await workers.mailbox.serving(WAIT_S)
            await workers.until_exhausted(baseline, "kim healed by the takeover reconcile")
            assert workers.mailbox.status()["user_quota"]["corrected"] >= 1
            await direct(me, "s3", b"now there is room")
            await workers.until_exhausted(baseline + 1, "kim at the cap again")
        finally:
            for client in (me, *peers):
                await client.close()
