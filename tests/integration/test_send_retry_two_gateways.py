"""Issue 4's retry storm at the edge: one client_message_id sent 5 times through two gateways,
around a kill -9 of the ConversationWriter, commits exactly one message with one SEND_ACK.

Real pieces only: two routing gateways, the SDK over WebSocket, and a `faust worker` of
`qim.apps.conversation` that is SIGKILLed and restarted on the same datadir.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path

import msgspec
import pytest

from qim.client import QimClient, QimError, RequestTimeout
from qim.devstack import procs
from qim.devstack.stack import Stack
from qim.schemas.frames import SendAck
from tests.integration.test_admin_groups import WRITER_ENV, writer_serving
from tests.integration.test_gateway_routing import gateway, online
from tests.integration.workers import FaustWorker

pytestmark = pytest.mark.integration


async def send_until_acked(client: QimClient, group: str, cmid: str, payload: bytes) -> SendAck:
    """What a client does while the writer is being replaced: resend the same cmid."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 90
    while True:
        try:
            return await client.send_message(group, payload, client_message_id=cmid)
        except (RequestTimeout, QimError) as exc:
            if isinstance(exc, QimError) and exc.retry_after_ms is None:
                raise
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.5)


def kill_9(worker: FaustWorker) -> None:
    pid = procs.read_pid(worker.pid_file)
    assert pid is not None, "the writer worker is not running"
    os.kill(pid, signal.SIGKILL)
    procs.wait_until(lambda: not procs.pid_alive(pid), timeout_s=10, what="writer dead")


async def test_five_retries_through_two_gateways_around_a_writer_kill_commit_once(
    stack: Stack, tmp_path: Path
) -> None:
    worker = FaustWorker(stack, "qim.apps.conversation", tmp_path / "writer", WRITER_ENV)
    await asyncio.to_thread(worker.start)
    tenant = f"t-storm-{uuid.uuid4().hex[:6]}"
    group = f"g:{uuid.uuid4().hex[:10]}"
    try:
        await writer_serving(worker)
        async with (
            gateway(stack, "gw-storm-1") as gw1,
            gateway(stack, "gw-storm-2") as gw2,
            online(gw1, "alice", "phone", tenant=tenant) as phone,
            online(gw2, "alice", "laptop", tenant=tenant) as laptop,
        ):
            await phone.create_group(group, ("bob",))
            acks = [await send_until_acked(phone, group, "storm", b"once") for _ in range(2)]

            kill_9(worker)
            restart = asyncio.create_task(asyncio.to_thread(worker.start))
            # The client does not know the writer died: it retries through the other gateway.
            acks.append(await send_until_acked(laptop, group, "storm", b"once"))
            await restart
            await writer_serving(worker)
            acks.append(await send_until_acked(laptop, group, "storm", b"once"))
            acks.append(await send_until_acked(phone, group, "storm", b"once"))

            first = acks[0]
            for ack in acks:
                assert msgspec.structs.replace(ack, request_id=first.request_id) == first
            history = await laptop.pull_history(group, limit=50)
            stormed = [m for m in history.messages if m.client_message_id == "storm"]
            assert len(stormed) == 1
            assert stormed[0].conversation_seq == first.conversation_seq
    finally:
        await asyncio.to_thread(worker.stop)
