"""Two in-process ConnectionNodes that split the ConnectionShards between them (issue 16).

Both join ONE gateway consumer group, so each owns about half of the shards and a user's
connections can only live on the owner of that user's shard (the way production runs):
anything one user's action must bring to another user on the other node has to cross through
Kafka to the owning ConnectionShard. The real pipeline runs beside them (the conversation and
mailbox ``faust worker`` processes), so the mailbox, history, session list and unread can be
pulled afterwards to show what a transient signal did not touch.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from qim.client import QimClient
from qim.devstack.stack import CONVERSATION_PARTITION_COUNT, Stack
from qim.gateway.ownership.shards import ShardOwnership
from qim.params import Settings
from qim.schemas import mailbox_shard_id, user_bucket
from qim.schemas.frames import Body, Frame
from tests.gateway_support import Gateway, running_gateway
from tests.integration.device_support import login
from tests.integration.login_support import WAIT_S
from tests.integration.mailbox_support import Node as MailboxWorker
from tests.integration.test_admin_groups import WRITER_ENV, writer_serving
from tests.integration.test_gateway_routing import SETTINGS
from tests.integration.workers import FaustWorker

__all__ = ["Node", "collect_until", "nodes", "pipeline", "user_on"]


@dataclass
class Node:
    """One gateway of the pair and the shard ownership it shares the group through."""

    gw: Gateway
    ownership: ShardOwnership

    def owns_user(self, tenant: str, user: str) -> bool:
        return self.ownership.owns(self.gw.node.logins.shard_of(tenant, user))

    async def online(self, tenant: str, user: str, device: str) -> QimClient:
        """A logged-in, synced SDK client of ``user`` on this node (which owns the user)."""
        assert self.owns_user(tenant, user), f"{user} is not this node's"
        return (await login(self.gw, tenant, user, device)).client


@contextlib.asynccontextmanager
async def pipeline(
    stack: Stack, base: Path, writer_env: Mapping[str, str] | None = None
) -> AsyncIterator[MailboxWorker]:
    """The conversation and mailbox workers; ``writer_env`` adds to the writer's environment."""
    env = {**WRITER_ENV, **(writer_env or {})}
    writer = FaustWorker(stack, "qim.apps.conversation", base / "conversation", env)
    mailbox = MailboxWorker(stack, base / "mailbox")
    try:
        await asyncio.gather(asyncio.to_thread(writer.start), mailbox.start())
        await asyncio.gather(writer_serving(writer), mailbox.serving(WAIT_S))
        yield mailbox
    finally:
        await asyncio.gather(asyncio.to_thread(writer.stop), mailbox.stop(), return_exceptions=True)


@contextlib.asynccontextmanager
async def _node(
    stack: Stack, group: str, name: str, settings: Settings | None
) -> AsyncIterator[Node]:
    bootstrap = stack.cfg.kafka.bootstrap
    ownership = ShardOwnership(bootstrap, group, f"ws://{name}")
    await ownership.start()
    try:
        await asyncio.wait_for(ownership.wait_assigned(), WAIT_S)
        async with running_gateway(
            ownership=ownership,
            settings=settings or SETTINGS,
            node_id=name,
            kafka_bootstrap=bootstrap,
            route_requests=True,
            mailbox_sync=True,
            conversation_partition_count=CONVERSATION_PARTITION_COUNT,
        ) as gw:
            yield Node(gw, ownership)
    finally:
        await ownership.stop()


@contextlib.asynccontextmanager
async def nodes(stack: Stack, settings: Settings | None = None) -> AsyncIterator[tuple[Node, Node]]:
    """Two syncing, routing nodes of one gateway group, once the shards are split."""
    group = f"qim-gw-pair-{uuid.uuid4().hex[:8]}"
    async with (
        _node(stack, group, "gw-a", settings) as a,
        _node(stack, group, "gw-b", settings) as b,
    ):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        count = int(SETTINGS.connection_shard_count)
        while True:
            mine, theirs = a.ownership.owned, b.ownership.owned
            if mine and theirs and not mine & theirs and len(mine | theirs) == count:
                break
            assert loop.time() < deadline, "the two gateways never split the shards"
            await asyncio.sleep(0.2)
        yield a, b


def presence_partition(tenant: str, user: str) -> int:
    """The user's partition of the presence topic (its MailboxShard)."""
    bucket = user_bucket(tenant, user, int(SETTINGS.virtual_bucket_count))
    return mailbox_shard_id(bucket, int(SETTINGS.mailbox_shard_count))


def user_on(node: Node, tenant: str, prefix: str, *, near: str | None = None) -> str:
    """A user id starting with ``prefix`` whose ConnectionShard ``node`` owns (and, with
    ``near``, whose presence records share that user's partition: ordered with them)."""
    for i in range(100_000):
        user = f"{prefix}{i}"
        if not node.owns_user(tenant, user):
            continue
        if near is None or presence_partition(tenant, user) == presence_partition(tenant, near):
            return user
    raise AssertionError(f"no {prefix}* user on {node.gw.node.config.node_id}")


async def collect_until(client: QimClient, done: Callable[[Frame], bool], what: str) -> list[Body]:
    """The bodies of the client's events up to and including the first ``done`` frame."""
    bodies: list[Body] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while True:
        assert loop.time() < deadline, f"timed out waiting for {what}"
        try:
            frame = await client.next_event(timeout=0.5)
        except TimeoutError:
            continue
        bodies.append(frame.body)
        if done(frame):
            return bodies
