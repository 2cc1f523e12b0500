"""A ConversationWriter killed around a REACT loses no reaction and counts none twice (issue 19).

Real writer processes and Kafka; requests are produced the way the gateway does. The crash hook
(``QIM_WRITER_CRASH_AT``, ``react:<conversation>:<seq>:<user>:<key>``) exits the process (a kill
without cleanup) once before the commit (the next owner decides the REACT again from the
uncommitted request) and once after the commit but before the MessageStore write (the restart
catches the store up from the outbox, so the client's retry is the 13.6.2 no-op).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator

import pytest

from qim.devstack.stack import Stack
from qim.schemas.records import (
    MessageReacted,
    PullReactionsRequest,
    ReactRequest,
    WriterReply,
    conversation_partition,
)
from tests.integration.writer_support import Client, create_group, read_outbox, send, shard_of
from tests.integration.writer_workers import Workers

pytestmark = pytest.mark.integration

_ids = itertools.count(30_000_000)


@pytest.fixture(scope="module")
async def workers(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Workers]:
    pool = Workers(stack, tmp_path_factory.mktemp("react-writers"))
    try:
        yield pool
    finally:
        await pool.stop_all()


@pytest.fixture(scope="module")
async def client(stack: Stack) -> AsyncIterator[Client]:
    async with Client(stack.cfg.kafka.bootstrap) as c:
        yield c


def react(tenant: str, user: str, conversation_id: str, seq: int, key: str) -> ReactRequest:
    return ReactRequest(
        tenant_id=tenant,
        user_id=user,
        device_id="dev",
        session_epoch=1,
        connection_shard=shard_of(user),
        request_id=next(_ids),
        conversation_id=conversation_id,
        conversation_seq=seq,
        reaction_key=key,
        action="add",
    )


def counts(reply: WriterReply) -> tuple[dict[str, int], int]:
    update = reply.reaction_update
    assert update is not None, reply
    return dict(update.counts), update.summary_version


async def test_a_writer_killed_before_and_after_a_reactions_commit_loses_and_doubles_none(
    workers: Workers, client: Client
) -> None:
    machine = await workers.ensure_primary()
    tenant, group = f"t-{uuid.uuid4().hex[:10]}", "g:react-crash"
    partition = conversation_partition(tenant, group, 16)
    await client.call(create_group(tenant, "alice", group, ["bob", "carol"]))
    sent = await client.call(send(tenant, "alice", group, "m1"))
    assert sent.send_ack is not None
    seq = sent.send_ack.conversation_seq
    assert counts(await client.call(react(tenant, "alice", group, seq, "like"))) == (
        {"like": 1},
        1,
    )
    await machine.stop()

    originals = {}
    for user, step in (("bob", "appended"), ("carol", "committed")):
        env = {
            "QIM_WRITER_CRASH_AT": step,
            "QIM_WRITER_CRASH_CMID": f"react:{group}:{seq}:{user}:like",
        }
        crasher = workers.new(env, workdir=machine.worker.workdir)
        await crasher.start()
        await crasher.serving([partition])
        originals[user] = react(tenant, user, group, seq, "like")
        await client.send([originals[user]])
        await crasher.exited()
    workers.primary = final = workers.new(workdir=machine.worker.workdir)
    await final.start()
    await final.serving([partition])

    first = [counts(r) for r in await client.wait(list(originals.values()))]
    assert sorted(v for _, v in first) == [2, 3]  # each decided once, in either order of crash
    retried = [counts(await client.call(react(tenant, u, group, seq, "like"))) for u in originals]
    assert retried == [({"like": 3}, 3)] * 2  # the retries are no-ops on the durable state
    after = counts(await client.call(react(tenant, "bob", group, seq, "heart")))
    assert after == ({"heart": 1, "like": 3}, 4)  # the version goes on from the log

    records = await read_outbox(client.bootstrap, tenant, group)
    reactions = [r for r in records if isinstance(r, MessageReacted)]
    assert [(r.user_id, r.reaction_key, r.summary_version) for r in reactions] == [
        ("alice", "like", 1),
        ("bob", "like", 2),
        ("carol", "like", 3),
        ("bob", "heart", 4),
    ]
    history = {m.conversation_seq: m for m in await client.history(tenant, "carol", group)}
    joined = history[seq].reactions
    assert joined is not None and joined.counts == {"heart": 1, "like": 3}
    assert joined.summary_version == 4 and joined.self_reaction_keys == ("like",)


async def test_a_1001_member_group_keeps_counts_but_serves_no_detail(
    workers: Workers, client: Client
) -> None:
    """13.6.3 item 3: above ``reaction_detail_max_members`` (1000) PULL_REACTIONS answers
    ``total`` with an empty ``users[]``; the counts and the reactors' own keys stay exact."""
    await workers.ensure_primary()
    tenant, group = f"t-{uuid.uuid4().hex[:10]}", "g:react-big"
    members = [f"m{n:04d}" for n in range(1000)]
    created = await client.call(create_group(tenant, "alice", group, members), within=120)
    assert created.error is None, created
    sent = await client.call(send(tenant, "alice", group, "big"))
    assert sent.send_ack is not None
    seq = sent.send_ack.conversation_seq
    for user in ("m0001", "m0002", "alice"):
        await client.call(react(tenant, user, group, seq, "like"))
    again = counts(await client.call(react(tenant, "m0001", group, seq, "like")))
    assert again == ({"like": 3}, 3)  # idempotent at any size
    page = await client.call(
        PullReactionsRequest(
            tenant_id=tenant,
            user_id="m0500",
            device_id="dev",
            session_epoch=1,
            connection_shard=shard_of("m0500"),
            request_id=next(_ids),
            conversation_id=group,
            conversation_seq=seq,
            reaction_key="like",
        )
    )
    assert page.reaction_list is not None, page
    assert (page.reaction_list.total, page.reaction_list.users) == (3, ())
    history = {m.conversation_seq: m for m in await client.history(tenant, "m0002", group)}
    joined = history[seq].reactions
    assert joined is not None and joined.counts == {"like": 3}
    assert joined.self_reaction_keys == ("like",)
