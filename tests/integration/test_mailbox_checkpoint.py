"""A MailboxShard taken over on an empty disk comes back from its shipped checkpoint (issue 18).

Spec 19.3 / 26.6.3: the node ships checkpoints of each shard (every ``checkpoint_interval``,
1 s here) to a checkpoint directory; its data folder is then wiped and a new node takes the
shards over. It must restore the checkpoint, read the dispatch log only from the checkpoint's
position on (so records before it may have left retention), and end with the same session
list, unread, pins, mutes, read positions and entries as before the wipe.

Retention is simulated with the admin API: every record of the shard's partition before the
tail is deleted (``DeleteRecords``), so a node without the checkpoint could not rebuild the first
phase at all. (Modules after this one start their mailbox workers afresh, so they fold the
partition from its new start, as their own replays do.)
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

from qim.devstack.stack import Stack
from qim.streams.topics import DISPATCH
from qim.tables.mailbox_store import MailboxStore
from tests.integration.mailbox_support import (
    Client,
    Node,
    direct_dispatches,
    eventually,
    user_state,
    users_on,
)

pytestmark = pytest.mark.integration

SHARD = 13


def _rows(path: Path, tenant: str) -> list[tuple[bytes, bytes]]:
    """Every row of ``tenant`` in the shard's live store (read as a RocksDB secondary)."""
    with tempfile.TemporaryDirectory() as secondary:
        store = MailboxStore.secondary(path, Path(secondary))
        try:
            mark = tenant.encode()
            return [(k, v) for k, v in store.items() if mark in k]
        finally:
            store.close()


async def _view(client: Client, tenant: str, users: Sequence[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for user in users:
        out[f"{user}/sessions"] = await client.session_list(tenant, user, limit=10)
        out[f"{user}/entries"] = await client.pull_all(tenant, user)
    return out


async def test_a_wiped_shard_restores_its_checkpoint_and_replays_only_the_tail(
    stack: Stack, tmp_path: Path
) -> None:
    env = {
        "QIM_MAILBOX_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "QIM_CHECKPOINT_INTERVAL": "1000",
    }
    workdir = tmp_path / "node"
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    alice, bob = users_on(tenant, SHARD, 2, "u")
    conv = f"d:{alice}:{bob}"
    async with Client(stack.cfg.kafka.bootstrap) as client:
        first = Node(stack, workdir, env)
        second: Node | None = None
        await first.start()
        try:
            await first.serving()
            # phase 1: messages, a read position, a pin and a mute
            seqs = []
            start = await client.end_offset(SHARD)
            for i in range(3):
                records = direct_dispatches(tenant, alice, bob, b"early %d" % i)
                seqs.append(records[0].conversation_seq)
                await client.dispatch(records)
            await client.send(
                user_state(tenant, bob, conv, "mark_read", read_conversation_seq=seqs[1])
            )
            await client.send(user_state(tenant, bob, conv, "pin", pin_rank=1))
            await client.send(user_state(tenant, alice, conv, "mute", flag=True))

            async def phase1_folded() -> bool:
                (b_row,) = await client.session_list(tenant, bob)
                (a_row,) = await client.session_list(tenant, alice)
                return (
                    b_row.pin_rank == 1 and b_row.read_conversation_seq == seqs[1] and a_row.muted
                )

            await _until(phase1_folded, "phase 1 folded")
            phase1_end = await client.end_offset(SHARD)
            await first.applied(SHARD, phase1_end - 1)

            def checkpointed() -> bool:
                shard = first.status().get("shards", {}).get(str(SHARD), {})
                return int(shard.get("checkpoint_offset") or -1) >= phase1_end - 1

            await eventually(checkpointed, 60, "a checkpoint past phase 1", first.worker.log_tail)
            await first.stop()  # the checkpoint taken; no newer one may cover the tail
            first = Node(stack, workdir, {**env, "QIM_CHECKPOINT_INTERVAL": "3600000"})
            await first.start()
            await first.serving()

            # phase 2, the tail: after the checkpoint
            for i in range(2):
                records = direct_dispatches(tenant, alice, bob, b"late %d" % i)
                seqs.append(records[0].conversation_seq)
                await client.dispatch(records)
            await client.send(
                user_state(tenant, bob, conv, "mark_read", read_conversation_seq=seqs[3])
            )

            async def phase2_folded() -> bool:
                (b_row,) = await client.session_list(tenant, bob)
                return b_row.read_conversation_seq == seqs[3]

            await _until(phase2_folded, "phase 2 folded")
            tail_end = await client.end_offset(SHARD)
            await first.applied(SHARD, tail_end - 1)
            before = await _view(client, tenant, (alice, bob))
            store_path = first.worker.datadir / "mailbox" / f"shard-{SHARD}"
            rows_before = await asyncio.to_thread(_rows, store_path, tenant)
            bob_rows = before[f"{bob}/sessions"]
            assert isinstance(bob_rows, list)
            (bob_row,) = bob_rows
            assert bob_row.unread_count == 1 and bob_row.pin_rank == 1

            await first.stop()
            first.worker.wipe_state()
            assert not store_path.exists()
            tp = TopicPartition(DISPATCH.name, SHARD)
            admin = AIOKafkaAdminClient(bootstrap_servers=stack.cfg.kafka.bootstrap)
            await admin.start()
            try:  # "retention": the first phase leaves the log
                deleted = await admin.delete_records({tp: RecordsToDelete(phase1_end)})
            finally:
                await admin.close()
            assert deleted[tp] == phase1_end
            second = Node(stack, workdir, env)
            await second.start()
            await second.serving()
            status = await second.applied(SHARD, tail_end - 1)
            restored_at = status["restored_checkpoint_offset"]
            assert restored_at is not None and phase1_end - 1 <= restored_at < tail_end - 1
            assert status["resumed_from"] == restored_at + 1 > start
            assert 'qim_mailbox_checkpoints_total{outcome="restored"}' in second.metrics_text()

            assert await _view(client, tenant, (alice, bob)) == before
            assert await asyncio.to_thread(_rows, store_path, tenant) == rows_before
        finally:
            for node in (first, second):
                if node is not None and node.pid is not None:
                    await node.stop()


async def _until(check: Callable[[], Awaitable[bool]], what: str, within: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        try:
            if await check():
                return
        except (AssertionError, ValueError):
            pass
        assert loop.time() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.2)
