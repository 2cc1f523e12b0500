"""Mailbox requests while the MailboxNode is down get an answer (issue 15.3, spec A.6 #6).

A user request is produced to ``qim.user-requests`` at the user's MailboxShard and answered by
whichever mailbox worker owns that shard. With no worker, Kafka takes the request and nobody
answers: the gateway's deadline (``mailbox_request_timeout_ms``) answers it instead,
``ERROR{SHARD_MOVED, retry_after_ms}`` with the request's id -- never silence, and the
connection stays open. Once a worker owns the shard again, the client's retry is served.

Real mailbox worker (started here, stopped by its pid), an in-process syncing gateway, an SDK
device logged in before the worker is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from qim.client import Identity, QimError
from qim.devstack.stack import CONVERSATION_PARTITION_COUNT, Stack
from qim.gateway.ownership.shards import ShardOwnership
from qim.schemas.frames import ErrorCode, MailboxBatch, SessionListBatch
from tests.gateway_support import Gateway, running_gateway
from tests.integration.login_support import WAIT_S
from tests.integration.mailbox_support import Node as MailboxWorker
from tests.integration.online_support import Device, connect
from tests.integration.test_gateway_routing import SETTINGS

pytestmark = pytest.mark.integration

DEADLINE_MS = 3_000


@contextlib.asynccontextmanager
async def gateway(stack: Stack) -> AsyncIterator[Gateway]:
    bootstrap = stack.cfg.kafka.bootstrap
    ownership = ShardOwnership(bootstrap, f"qim-gw-down-{uuid.uuid4().hex[:8]}", "ws://gw")
    await ownership.start()
    try:
        await asyncio.wait_for(ownership.wait_assigned(), 60)
        async with running_gateway(
            ownership=ownership,
            settings=SETTINGS,
            node_id="gw-down",
            kafka_bootstrap=bootstrap,
            route_requests=True,
            mailbox_sync=True,
            conversation_partition_count=CONVERSATION_PARTITION_COUNT,
            mailbox_request_timeout_ms=DEADLINE_MS,
        ) as gw:
            yield gw
    finally:
        await ownership.stop()


def requests(gw: Gateway, kind: str, result: str) -> float:
    value = gw.node.metrics.registry.get_sample_value(
        "qim_gateway_mailbox_requests_total", {"kind": kind, "result": result}
    )
    assert value is not None, f"qim_gateway_mailbox_requests_total{{{kind},{result}}} missing"
    return value


async def test_pulls_while_the_mailbox_node_is_down_are_answered_shard_moved_at_the_deadline(
    stack: Stack, tmp_path: Path
) -> None:
    tenant = f"t-down-{uuid.uuid4().hex[:6]}"
    worker = MailboxWorker(stack, tmp_path / "mailbox")
    await worker.start()
    try:
        await worker.serving(WAIT_S)
        async with gateway(stack) as gw:
            token = await gw.token("alice", "phone", tenant)
            alice: Device = await connect(gw.ws_url, token, Identity(tenant, "alice"), "phone")
            try:
                client = alice.result.client
                served = await client.pull_mailbox(0)  # the worker answers while it runs
                assert isinstance(served, MailboxBatch)

                pid = worker.pid
                assert pid is not None
                await worker.stop()  # by its pid file; nobody owns the shard now
                assert worker.pid is None

                with pytest.raises(QimError) as pulled:
                    await client.pull_mailbox(0, timeout=60)
                with pytest.raises(QimError) as listed:
                    await client.pull_session_list(timeout=60)
                for refused in (pulled.value, listed.value):
                    assert refused.code == ErrorCode.SHARD_MOVED
                    assert refused.retry_after_ms is not None and refused.retry_after_ms > 0
                    assert "unreachable (timeout)" in refused.detail
                assert requests(gw, "pull_mailbox", "timeout") == 1
                assert requests(gw, "pull_session_list", "timeout") == 1
                assert gw.node.router is not None and gw.node.router.mailbox is not None
                assert gw.node.router.mailbox.awaiting == 0  # nothing left waiting
                assert await client.ping()  # the connection is still open

                # a worker owns the shard again: the client's retry is served
                await worker.start()
                await worker.serving(WAIT_S)
                again = await client.pull_mailbox(0, timeout=60)
                assert isinstance(again, MailboxBatch)
                listed_again = await client.pull_session_list(timeout=60)
                assert isinstance(listed_again, SessionListBatch)
            finally:
                await alice.close()
    finally:
        await worker.stop()
