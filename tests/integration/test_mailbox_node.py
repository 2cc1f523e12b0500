"""The MailboxNode against a real Kafka, run as real `faust worker` processes (issue 5).

One worker ("primary") serves most tests; the crash tests replace it with a worker that kills
itself (-9) at a chosen step, then restart a normal worker on the same datadir, and leave that
one as the primary for the next test. Every test uses its own tenant.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from qim.agents.mailbox.options import MailboxOptions
from qim.agents.mailbox.replay import replay_worker_shard
from qim.devstack.stack import Stack
from qim.params import Settings
from qim.schemas import compose_mailbox_seq
from qim.schemas.frames import ErrorCode, MailboxCursor
from tests.integration.mailbox_support import (
    WORKER_ENV,
    Client,
    Node,
    crash_env,
    direct_dispatches,
    group_records,
    pull,
    shard_of,
    sync_auth,
    users_on,
)

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000
NOW_MS = int(time.time() * 1000)
EXPIRY_SHARD = 5  # distinct shards, so the sweep of one test never touches another's
M2_SHARD = 9
GROUP_SHARD = 7


def uid() -> str:
    return uuid.uuid4().hex[:8]


class Pool:
    """The primary worker and its datadir (shared by restarts, so the store survives them)."""

    def __init__(self, stack: Stack, base: Path) -> None:
        self.stack = stack
        self.workdir = base / "node"
        self.primary: Node | None = None
        self.started: list[Node] = []

    def node(self, env: dict[str, str] | None = None) -> Node:
        node = Node(self.stack, self.workdir, env)
        self.started.append(node)
        return node

    async def ensure_primary(self) -> Node:
        if self.primary is None or self.primary.pid is None:
            self.primary = self.node()
            await self.primary.start()
        await self.primary.serving()
        return self.primary

    async def stop_all(self) -> None:
        for node in self.started:
            if node.pid is not None:
                await node.stop()


@pytest.fixture(scope="module")
async def pool(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Pool]:
    p = Pool(stack, tmp_path_factory.mktemp("mailbox"))
    try:
        yield p
    finally:
        await p.stop_all()


@pytest.fixture(scope="module")
async def client(stack: Stack) -> AsyncIterator[Client]:
    async with Client(stack.cfg.kafka.bootstrap) as c:
        yield c


async def test_direct_dispatch_materializes_for_both_and_pull_joins_the_body(
    pool: Pool, client: Client
) -> None:
    """Spec 7.8/10.1: one dispatch per target shard -> an entry for each participant at
    (epoch 1, offset); PULL_MAILBOX returns it with the shard's body copy joined (18.3.1)."""
    node = await pool.ensure_primary()
    tenant = f"t-{uid()}"
    records = direct_dispatches(tenant, "alice", "bob", b"hello bob")
    offsets = await client.dispatch(records)
    for record, offset in zip(records, offsets, strict=True):
        await node.applied(record.target_mailbox_shard, offset)

    for user in ("alice", "bob"):
        entries = await client.pull_all(tenant, user)
        record, offset = next(
            (r, o)
            for r, o in zip(records, offsets, strict=True)
            if r.target_mailbox_shard == shard_of(tenant, user)
        )
        assert [e.mailbox_seq for e in entries] == [compose_mailbox_seq(1, offset)]
        assert entries[0].message_id == record.message_id
        assert entries[0].body_included and entries[0].payload_or_ciphertext == b"hello bob"
        assert entries[0].sender_id == "alice"
    text = await asyncio.to_thread(node.metrics_text)
    for name in ("lane_watermark_stall_ms{", "mailbox_entries_written_total{", "login_total"):
        assert name in text


async def test_new_device_sync_auth_returns_sync_to_seq_equal_to_w(
    pool: Pool, client: Client
) -> None:
    """Spec 9.3.1 step 4 / 9.6.1: a new device gets sync_to_seq = W[lane] at AUTH, starts at the
    trim line, has_offline reflects its entries, and a signed cursor token to keep."""
    node = await pool.ensure_primary()
    tenant = f"t-{uid()}"
    records = direct_dispatches(tenant, "carol", "dave", b"x")
    offsets = await client.dispatch(records)
    for record, offset in zip(records, offsets, strict=True):
        await node.applied(record.target_mailbox_shard, offset)

    reply = await client.call(sync_auth(tenant, "dave"))
    sync = reply.auth_sync
    assert sync is not None, reply
    shard = shard_of(tenant, "dave")
    assert reply.mailbox_shard == shard
    status = node.status()["shards"][str(shard)]
    assert sync.sync_to_seq == sync.lane_watermark >= status["watermark_min"]
    assert sync.sync_to_seq >= max(
        compose_mailbox_seq(1, o)
        for r, o in zip(records, offsets, strict=True)
        if r.target_mailbox_shard == shard
    )
    assert sync.kind == "new_device" and sync.start_seq == sync.trim_watermark == 0
    assert sync.has_offline and sync.pending_entry_count_hint == 1
    assert sync.mailbox_cursor_token

    # the same device, fully applied: a resume with nothing pending
    cursor = MailboxCursor(
        token=sync.mailbox_cursor_token, last_applied_mailbox_seq=sync.sync_to_seq
    )
    again = await client.call(sync_auth(tenant, "dave", cursor))
    assert again.auth_sync is not None and again.auth_sync.kind == "resume"
    assert not again.auth_sync.has_offline
    # a token is bound to its device
    forged = await client.call(sync_auth(tenant, "carol", cursor))
    assert forged.error is not None and forged.error.code == ErrorCode.CURSOR_INVALID


async def test_long_offline_device_below_the_trim_line_gets_cursor_expired(
    pool: Pool, client: Client
) -> None:
    """Spec 9.3.1 check 2, 18.3.3, 26.2.6: a device whose unapplied range was trimmed by the
    retention sweep (log time) gets CURSOR_EXPIRED{trim_watermark, rebuild_required}, at AUTH
    and at PULL_MAILBOX, never an AUTH_OK with has_offline."""
    node = await pool.ensure_primary()
    tenant = f"t-{uid()}"
    erin, frank = users_on(tenant, EXPIRY_SHARD, 2, "u")
    t0 = NOW_MS - 40 * DAY_MS
    first = direct_dispatches(tenant, frank, erin, b"d0", committed_at=t0)
    second = direct_dispatches(tenant, frank, erin, b"d1", committed_at=t0 + 3_600_000)
    later = direct_dispatches(tenant, frank, erin, b"d2", committed_at=t0 + 12 * DAY_MS)
    (d0,) = await client.dispatch(first)
    login = await client.call(sync_auth(tenant, erin))
    assert login.auth_sync is not None, login
    (d1,) = await client.dispatch(second)
    (d2,) = await client.dispatch(later)
    await node.applied(EXPIRY_SHARD, d2)

    cursor = MailboxCursor(
        token=login.auth_sync.mailbox_cursor_token,
        last_applied_mailbox_seq=compose_mailbox_seq(1, d0),
    )
    for _ in range(120):  # the sweep runs every second
        reply = await client.call(sync_auth(tenant, erin, cursor))
        if reply.error is not None:
            break
        await asyncio.sleep(0.5)
    error = reply.error
    assert error is not None and error.code == ErrorCode.CURSOR_EXPIRED, reply
    assert error.rebuild_required is True
    assert error.trim_watermark is not None and error.trim_watermark >= compose_mailbox_seq(1, d1)
    pulled = await client.call(pull(tenant, erin, after=compose_mailbox_seq(1, d0)))
    assert pulled.error is not None and pulled.error.code == ErrorCode.CURSOR_EXPIRED
    assert node.totals().get("cursor_expired_total", 0) >= 1


async def test_m2_crash_after_offset_commit_before_writebatch_loses_nothing(
    pool: Pool, client: Client
) -> None:
    """Seed 003 M-2, spec 10.4.2 (1), I-14: the offset (and floor) are committed, the process
    is killed -9 before the WriteBatch; the restart resumes at offset(min W)+1, not at the
    committed offset, so the dispatch is materialized and no entry is missing."""
    node = await pool.ensure_primary()
    await node.stop()
    tenant = f"t-{uid()}"
    gina, hal = users_on(tenant, M2_SHARD, 2, "u")
    target = await client.end_offset(M2_SHARD)
    crasher = pool.node(crash_env("committed", M2_SHARD, target))
    await crasher.start()
    await crasher.serving()
    records = direct_dispatches(tenant, gina, hal, b"survives")
    assert await client.dispatch(records) == [target]
    await crasher.exited()

    pool.primary = restarted = pool.node()
    await restarted.start()
    await restarted.serving()
    status = await restarted.applied(M2_SHARD, target)
    assert status["committed_at_takeover"] == target + 1  # the crashed commit went through
    assert status["resumed_from"] <= target  # ... and was not trusted
    for user in (gina, hal):
        entries = await client.pull_all(tenant, user)
        assert [e.mailbox_seq for e in entries] == [compose_mailbox_seq(1, target)]
        assert entries[0].payload_or_ciphertext == b"survives"
    assert restarted.totals().get("mailbox_seq_regression_count", 0) == 0


async def test_5000_member_group_dispatch_survives_kill_9_mid_batch_exactly_once(
    pool: Pool, client: Client
) -> None:
    """Spec 10.4 (I-12, I-13, I-14), seed 003 M-1/M-2: a 5,000-member group dispatch; the
    worker is killed -9 inside that large batch (committed, not written). After the restart
    every member has the entry exactly once at the dispatch's mailbox_seq, a re-appended copy
    of the dispatch is suppressed, and no mailbox_seq regressed."""
    node = await pool.ensure_primary()
    await node.stop()
    tenant = f"t-{uid()}"
    members = users_on(tenant, GROUP_SHARD, 5000, "m")
    chunks, dispatch = group_records(tenant, "g:big", members, GROUP_SHARD, b"to all")
    olga, oscar = users_on(tenant, GROUP_SHARD, 2, "o")
    fillers = [d for i in range(20) for d in direct_dispatches(tenant, olga, oscar, b"%d" % i)]
    start = await client.end_offset(GROUP_SHARD)
    at = start + len(chunks)
    crasher = pool.node(crash_env("committed", GROUP_SHARD, at))
    await crasher.start()
    await crasher.serving()
    offsets = await client.dispatch([*chunks, dispatch, *fillers])
    assert offsets[len(chunks)] == at
    await crasher.exited()

    pool.primary = restarted = pool.node()
    await restarted.start()
    await restarted.serving()
    (again,) = await client.dispatch([dispatch])  # a retried fanout re-appends it
    await restarted.applied(GROUP_SHARD, again)

    seq = compose_mailbox_seq(1, at)
    stored = await asyncio.to_thread(restarted.store_entries, tenant, members, GROUP_SHARD)
    wrong = {user: seqs for user, seqs in stored.items() if seqs != [seq]}
    assert wrong == {}, f"{len(wrong)} members without exactly one entry"
    totals = restarted.totals()
    assert totals.get("dispatch_duplicate_suppressed_total", 0) >= 1
    assert totals.get("mailbox_seq_regression_count", 0) == 0
    assert totals.get("stale_epoch_dispatch_dropped_total", 0) == 0
    for user in (members[0], members[2500], members[-1]):
        entries = await client.pull_all(tenant, user)
        assert [(e.mailbox_seq, e.payload_or_ciphertext) for e in entries] == [(seq, b"to all")]


async def test_replay_of_the_dispatch_partition_is_byte_identical_to_the_live_store(
    pool: Pool, client: Client, tmp_path: Path
) -> None:
    """Direction 4.2, spec 26 case 26 (I-5): rebuilding a shard from its dispatch partition
    into a fresh store gives the live worker's store byte for byte (store_digest)."""
    node = await pool.ensure_primary()
    tenant = f"t-{uid()}"
    a, b = users_on(tenant, GROUP_SHARD, 2, "r")
    (last,) = await client.dispatch(direct_dispatches(tenant, a, b, b"replayed"))
    await node.applied(GROUP_SHARD, last)

    seen: list[tuple[int, int]] = []
    options = MailboxOptions.load(
        Settings.load(env=WORKER_ENV),
        WORKER_ENV,
        bootstrap=pool.stack.cfg.kafka.bootstrap,
        datadir=node.worker.datadir,
    )
    report = await replay_worker_shard(
        options,
        GROUP_SHARD,
        tmp_path / "replay",
        progress=lambda done, total: seen.append((done, total)),
    )
    print("\n".join(report.lines()))
    assert report.identical, report.lines()
    assert report.applied_offset >= last
    # Other tests' transactions leave commit markers in the same partition: markers take
    # offsets but are not records, so the offsets bound the count from above.
    assert 0 < report.records_read <= report.applied_offset - report.log_start + 1
    # Progress counts records read against the offset span (markers included).
    assert seen and seen[-1][0] == report.records_read <= seen[-1][1]
