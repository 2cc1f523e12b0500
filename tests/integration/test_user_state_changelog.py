"""UserConversationState outlives the dispatch log (issue 18, topology decision 41).

1. Users change read positions, pins and mutes; the MailboxNode publishes every changed ``U``
   row to ``qim-mailbox-UserConversationState-changelog``. The head of the shard's dispatch
   partition is then deleted (``DeleteRecords``, as retention would), the node's data folder is
   wiped and no checkpoint exists: the new owner restores the rows from the changelog and
   replays the retained tail on top -- which holds commands the rows already reflect -- and
   every user's ``U`` rows equal the live ones, byte for byte.
2. kill -9 between the WriteBatch and the changelog produce (``QIM_MAILBOX_CRASH_AT=ustate``):
   the changelog misses the row the store has; after the restart the takeover re-publishes it
   and the changelog equals the store.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

from qim.core.mailbox.session_store import CONV_STATE, decode_state, state_key
from qim.devstack.stack import Stack
from qim.streams.topics import DISPATCH, USER_CONVERSATION_STATE_CHANGELOG
from qim.tables.mailbox_store import MailboxStore
from qim.tables.user_state_changelog import decode_changelog_value, read_changelog, store_key
from tests.integration.mailbox_support import (
    Client,
    Node,
    crash_env,
    direct_dispatches,
    eventually,
    user_state,
    users_on,
)

pytestmark = pytest.mark.integration

RESTORE_SHARD = 21
CRASH_SHARD = 22


def _u_rows(path: Path, tenant: str) -> dict[bytes, bytes]:
    """The ``U`` rows of ``tenant`` in a live store (read as a RocksDB secondary)."""
    prefix = CONV_STATE + tenant.encode() + b"\x00"
    with tempfile.TemporaryDirectory() as secondary:
        store = MailboxStore.secondary(path, Path(secondary))
        try:
            return dict(store.scan(prefix, prefix, False))
        finally:
            store.close()


async def _changelog_rows(stack: Stack, shard: int, tenant: str) -> dict[bytes, bytes]:
    """The changelog's rows of ``tenant`` as store pairs (``U`` key -> stored row)."""
    rows = await read_changelog(
        stack.cfg.kafka.bootstrap, USER_CONVERSATION_STATE_CHANGELOG.name, shard
    )
    mark = tenant.encode() + b"\x00"
    out = {}
    for key, value in rows.items():
        if key.startswith(mark):
            decoded = decode_changelog_value(value)
            assert decoded.mailbox_shard == shard
            out[store_key(key)] = decoded.row
    return out


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


def _store(node: Node, shard: int) -> Path:
    return node.worker.datadir / "mailbox" / f"shard-{shard}"


async def test_a_wiped_shard_after_retention_restores_every_users_state_from_the_changelog(
    stack: Stack, tmp_path: Path
) -> None:
    workdir = tmp_path / "node"
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    alice, bob, carol = users_on(tenant, RESTORE_SHARD, 3, "u")
    ab, bc = f"d:{alice}:{bob}", f"d:{bob}:{carol}"
    async with Client(stack.cfg.kafka.bootstrap) as client:
        first = Node(stack, workdir)
        second: Node | None = None
        await first.start()
        try:
            await first.serving()
            seqs: dict[str, list[int]] = {ab: [], bc: []}
            for i in range(3):
                for conv, (x, y) in ((ab, (alice, bob)), (bc, (bob, carol))):
                    records = direct_dispatches(tenant, x, y, b"early %d" % i)
                    seqs[conv].append(records[0].conversation_seq)
                    await client.dispatch(records)
            await client.send(
                user_state(tenant, bob, ab, "mark_read", read_conversation_seq=seqs[ab][1])
            )
            await client.send(user_state(tenant, bob, ab, "pin", pin_rank=1))
            await client.send(user_state(tenant, alice, ab, "mute", flag=True))
            await client.send(user_state(tenant, carol, bc, "archive", flag=True))
            await client.send(
                user_state(tenant, bob, bc, "mark_read", read_conversation_seq=seqs[bc][2])
            )

            async def head_folded() -> bool:
                rows = {(r.conversation_id): r for r in await client.session_list(tenant, bob)}
                (a_row,) = await client.session_list(tenant, alice)
                (c_row,) = await client.session_list(tenant, carol)
                return (
                    rows[ab].pin_rank == 1
                    and rows[ab].read_conversation_seq == seqs[ab][1]
                    and rows[bc].read_conversation_seq == seqs[bc][2]
                    and a_row.muted
                    and c_row.archived
                )

            await _until(head_folded, "the head folded")
            head_end = await client.end_offset(RESTORE_SHARD)
            await first.applied(RESTORE_SHARD, head_end - 1)

            # the tail: a message and commands; the pin changes a row published before
            records = direct_dispatches(tenant, alice, bob, b"late")
            late = records[0].conversation_seq
            await client.dispatch(records)
            await client.send(user_state(tenant, bob, ab, "pin", pin_rank=2))
            await client.send(user_state(tenant, bob, ab, "mark_read", read_conversation_seq=late))
            await client.send(user_state(tenant, alice, ab, "mute", flag=False))

            async def tail_folded() -> bool:
                rows = {(r.conversation_id): r for r in await client.session_list(tenant, bob)}
                (a_row,) = await client.session_list(tenant, alice)
                return (
                    rows[ab].pin_rank == 2
                    and rows[ab].read_conversation_seq == late
                    and not a_row.muted
                )

            await _until(tail_folded, "the tail folded")
            tail_end = await client.end_offset(RESTORE_SHARD)
            status = await first.applied(RESTORE_SHARD, tail_end - 1)
            live = await asyncio.to_thread(_u_rows, _store(first, RESTORE_SHARD), tenant)
            assert set(live) == {
                state_key(tenant, u, c) for u, c in ((alice, ab), (bob, ab), (bob, bc), (carol, bc))
            }
            assert decode_state(live[state_key(tenant, bob, ab)]).pin_rank == 2
            assert status["ucs_changed_offset"] >= head_end  # the tail changed rows

            async def published() -> bool:
                return await _changelog_rows(stack, RESTORE_SHARD, tenant) == live

            await _until(published, "the changelog holds every live row")

            await first.stop()
            first.worker.wipe_state()
            assert not _store(first, RESTORE_SHARD).exists()
            tp = TopicPartition(DISPATCH.name, RESTORE_SHARD)
            admin = AIOKafkaAdminClient(bootstrap_servers=stack.cfg.kafka.bootstrap)
            await admin.start()
            try:  # "retention": the head leaves the log
                deleted = await admin.delete_records({tp: RecordsToDelete(head_end)})
            finally:
                await admin.close()
            assert deleted[tp] == head_end

            second = Node(stack, workdir)
            await second.start()
            await second.serving()
            status = await second.applied(RESTORE_SHARD, tail_end - 1)
            assert status["resumed_from"] < head_end  # the store was empty: W = 0
            # the session's shared changelog partition also holds other tests' users of this shard
            assert status["ucs_restored_rows"] >= len(live)
            rebuilt = await asyncio.to_thread(_u_rows, _store(second, RESTORE_SHARD), tenant)
            assert rebuilt == live
            # what clients see of it: pins, mutes, archive, read positions
            (a_row,) = await client.session_list(tenant, alice)
            assert not a_row.muted
            (b_ab,) = [r for r in await client.session_list(tenant, bob) if r.conversation_id == ab]
            assert (b_ab.pin_rank, b_ab.read_conversation_seq, b_ab.unread_count) == (2, late, 0)
        finally:
            for node in (first, second):
                if node is not None and node.pid is not None:
                    await node.stop()


async def test_kill_9_between_the_writebatch_and_the_changelog_produce_loses_no_row(
    stack: Stack, tmp_path: Path
) -> None:
    workdir = tmp_path / "node"
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    dana, eve = users_on(tenant, CRASH_SHARD, 2, "u")
    conv = f"d:{dana}:{eve}"
    async with Client(stack.cfg.kafka.bootstrap) as client:
        node = Node(stack, workdir)
        crasher: Node | None = None
        restarted: Node | None = None
        await node.start()
        try:
            await node.serving()
            records = direct_dispatches(tenant, dana, eve, b"hello")
            await client.dispatch(records)
            await client.send(user_state(tenant, eve, conv, "mute", flag=True))

            async def muted() -> bool:
                (row,) = await client.session_list(tenant, eve)
                return row.muted

            await _until(muted, "the mute folded")
            before = await _changelog_rows(stack, CRASH_SHARD, tenant)
            assert decode_state(before[state_key(tenant, eve, conv)]).muted
            await node.stop()

            # The MARK_READ's offset on the shard log. (A MARK_READ because the killed node had
            # not committed the request's offset: the restart appends the command once more,
            # and a repeated MARK_READ changes nothing, where a repeated pin re-stamps the row.)
            target = await client.end_offset(CRASH_SHARD)
            crasher = Node(stack, workdir, crash_env("ustate", CRASH_SHARD, target))
            await crasher.start()
            await crasher.serving()
            seq = records[0].conversation_seq
            await client.send(user_state(tenant, eve, conv, "mark_read", read_conversation_seq=seq))
            await crasher.exited()
            assert await client.end_offset(CRASH_SHARD) == target + 1
            stored = await asyncio.to_thread(_u_rows, _store(crasher, CRASH_SHARD), tenant)
            state = decode_state(stored[state_key(tenant, eve, conv)])
            assert state.read_conversation_seq == seq and state.muted  # written
            assert await _changelog_rows(stack, CRASH_SHARD, tenant) == before  # not published

            restarted = Node(stack, workdir)
            await restarted.start()
            await restarted.serving()
            await restarted.applied(CRASH_SHARD, target)

            def republished() -> bool:  # the takeover re-publishes after the shard is owned
                status = restarted.status()["shards"][str(CRASH_SHARD)]
                return int(status["ucs_published_offset"]) >= target

            await eventually(republished, 60, "the re-publish", restarted.worker.log_tail)
            status = restarted.status()["shards"][str(CRASH_SHARD)]
            assert status["ucs_published_offset"] == status["ucs_changed_offset"] == target
            after = await asyncio.to_thread(_u_rows, _store(restarted, CRASH_SHARD), tenant)
            assert after == stored  # nothing applied twice
            assert await _changelog_rows(stack, CRASH_SHARD, tenant) == after
        finally:
            for n in (node, crasher, restarted):
                if n is not None and n.pid is not None:
                    await n.stop()
