"""The ConversationWriter against a real Kafka, run as real `faust worker` processes (issue 4).

One worker ("primary") serves most tests; the crash, kill and fencing tests replace it and leave
a primary running for the next test. Every test uses its own conversation ids.
"""

from __future__ import annotations

import gc
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka.errors import ProducerFenced

from qim.core.history import ArchiveWrite
from qim.devstack.stack import Stack
from qim.schemas.frames.errors import ErrorCode
from qim.schemas.records import (
    MembershipCommitted,
    MessageCommitted,
    WriterReply,
    conversation_partition,
)
from qim.tables.message_store import MessageStore
from tests.integration.writer_support import (
    BULK_TENANT,
    Client,
    create_group,
    direct,
    leave_group,
    pull_history,
    pull_members,
    read_outbox,
    send,
)
from tests.integration.writer_workers import PrivatePartition, Workers, eventually

pytestmark = pytest.mark.integration


def uid() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture(scope="module")
async def workers(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Workers]:
    pool = Workers(stack, tmp_path_factory.mktemp("writers"))
    try:
        yield pool
    finally:
        await pool.stop_all()


@pytest.fixture(scope="module")
async def client(stack: Stack) -> AsyncIterator[Client]:
    async with Client(stack.cfg.kafka.bootstrap) as c:
        yield c


def ack_fields(reply: WriterReply) -> tuple[bytes, int, bytes, str]:
    assert reply.send_ack is not None, reply
    a = reply.send_ack
    return (a.message_id, a.conversation_seq, a.last_activity_id, a.client_message_id)


def code(reply: WriterReply) -> ErrorCode:
    assert reply.error is not None, reply
    return ErrorCode(reply.error.code)


async def test_1000_concurrent_sends_are_acked_in_seq_order_and_match_history(
    workers: Workers, client: Client
) -> None:
    """Spec 6.3/8.4: one writer per conversation, seqs strictly increasing without holes,
    SEND_ACK == the committed record that history serves."""
    await workers.ensure_primary()
    group = f"g:load-{uid()}"
    senders = [f"s{i}" for i in range(10)]
    created = await client.call(create_group(BULK_TENANT, senders[0], group, senders[1:]))
    assert created.members is not None and created.members.total_hint == 10

    requests = [send(BULK_TENANT, senders[i % 10], group, f"m{i}") for i in range(1000)]
    t0 = time.monotonic()
    await client.send(requests)
    replies = await client.wait(requests)
    elapsed = time.monotonic() - t0
    acks = [ack_fields(r) for r in replies]
    print(f"1000 sends acked in {elapsed:.2f} s")

    # the create is seq 1: the messages are exactly 2..1001, each sender's in send order
    assert sorted(seq for _, seq, _, _ in acks) == list(range(2, 1002))
    for sender in senders:
        mine = [a[1] for r, a in zip(requests, acks, strict=True) if r.sender_id == sender]
        assert mine == sorted(mine)
    assert all(len(client.replies[(BULK_TENANT, r.sender_id, r.request_id)]) == 1 for r in requests)

    history = await client.history(BULK_TENANT, senders[3], group)
    rows = [(m.message_id, m.conversation_seq, m.last_activity_id, m.client_message_id)
            for m in history if m.conversation_seq > 1]  # fmt: skip
    assert rows == sorted(acks, key=lambda a: a[1])


async def test_refusals_consume_nothing(workers: Workers, client: Client) -> None:
    """Spec 8.1/8.2 (T1, T2, T3/T5, T7): refusals allocate no seq and append nothing."""
    await workers.ensure_primary()
    tenant, group = f"t-{uid()}", "g:refusals"
    await client.call(create_group(tenant, "alice", group, ["bob"]))

    assert (
        code(await client.call(send(tenant, "mallory", group, "x1"))) == ErrorCode.PERMISSION_DENIED
    )
    big = send(tenant, "alice", group, "big", payload=b"x" * (32 * 1024 + 1))
    assert code(await client.call(big)) == ErrorCode.PAYLOAD_TOO_LARGE

    burst = [send(tenant, "alice", group, f"b{i}") for i in range(30)]
    await client.send(burst)
    replies = await client.wait(burst)
    limited = [r for r in replies if r.error is not None]
    accepted = [ack_fields(r)[1] for r in replies if r.send_ack is not None]
    assert limited and all(code(r) == ErrorCode.RATE_LIMITED for r in limited)
    assert all((r.error.retry_after_ms or 0) > 0 for r in limited if r.error is not None)
    assert accepted == list(range(2, len(accepted) + 2)), "a refusal consumed a seq"

    records = await read_outbox(client.bootstrap, tenant, group)
    messages = [r for r in records if isinstance(r, MessageCommitted)]
    assert [m.conversation_seq for m in messages] == accepted


async def test_a_leaver_reads_what_came_before_its_leave_and_nothing_after(
    workers: Workers, client: Client
) -> None:
    """Spec 7.5 / A.3 LEAVE_GROUP: visible = (joined_at, left_at), left_at = the leave's seq."""
    await workers.ensure_primary()
    tenant, group = f"t-{uid()}", "g:leave"
    await client.call(create_group(tenant, "alice", group, ["bob"]))
    before = [send(tenant, "alice", group, f"before{i}") for i in range(2)]
    await client.send(before)
    await client.wait(before)
    left = await client.call(leave_group(tenant, "bob", group))
    assert left.members is not None and left.members.total_hint == 1
    after = await client.call(send(tenant, "alice", group, "after"))
    assert ack_fields(after)[1] == 5  # the create took seq 1, the leave's CONTROL message 4

    reply = await client.call(pull_history(tenant, "bob", group))
    assert reply.history is not None
    assert [m.client_message_id for m in reply.history.messages] == [None, "before0", "before1"]
    assert reply.history.latest_conversation_seq == 3
    assert [m.conversation_seq for m in await client.history(tenant, "alice", group)] == [
        1,
        2,
        3,
        4,
        5,
    ]
    assert (
        code(await client.call(send(tenant, "bob", group, "ghost"))) == ErrorCode.PERMISSION_DENIED
    )
    assert (
        code(await client.call(pull_members(tenant, "bob", group))) == ErrorCode.PERMISSION_DENIED
    )


async def test_tenants_are_isolated(workers: Workers, client: Client) -> None:
    """Spec 20.1: the same user id in another tenant is another user."""
    await workers.ensure_primary()
    a, b, group = f"ta-{uid()}", f"tb-{uid()}", "g:shared-name"
    await client.call(create_group(a, "alice", group, ["bob"]))
    await client.call(send(a, "alice", group, "secret"))
    dm = await client.call(direct(a, "alice", "bob", "dm-secret"))
    assert dm.send_ack is not None
    dm_id = direct(a, "alice", "bob", "x").message.conversation_id

    denied = ErrorCode.PERMISSION_DENIED
    assert code(await client.call(send(b, "alice", group, "intrude"))) == denied
    assert code(await client.call(pull_history(b, "alice", group))) == denied
    assert code(await client.call(pull_members(b, "alice", group))) == denied
    assert code(await client.call(send(b, "alice", dm_id, "intrude", peer="bob"))) == denied
    assert code(await client.call(pull_history(b, "alice", dm_id))) == denied

    # tenant b's own group of the same name stays apart
    await client.call(create_group(b, "alice", group, ["eve"]))
    await client.call(send(b, "alice", group, "b-only"))
    assert [m.client_message_id for m in await client.history(a, "bob", group)] == [None, "secret"]
    members = await client.call(pull_members(a, "bob", group))
    assert members.members is not None
    assert {m.user_id for m in members.members.members} == {"alice", "bob"}
    assert [m.client_message_id for m in await client.history(a, "bob", dm_id)] == ["dm-secret"]


async def test_a_retry_storm_around_a_kill_commits_one_message(
    workers: Workers, client: Client
) -> None:
    """Spec 8.3: one (tenant, sender, client_message_id) -> one seq, the same SEND_ACK."""
    old = await workers.ensure_primary()
    tenant, group = f"t-{uid()}", "g:storm"
    await client.call(create_group(tenant, "alice", group, ["bob"]))
    noise_group = f"g:noise-{uid()}"
    await client.call(create_group(BULK_TENANT, "bob", noise_group, []))

    retries = [send(tenant, "alice", group, "the-one") for _ in range(5)]
    noise = [send(BULK_TENANT, "bob", noise_group, f"n{i}") for i in range(300)]
    await client.send(noise[:150] + retries[:2])
    old.signal(signal.SIGKILL)  # mid-stream: some of it committed, some not
    await old.exited()
    await client.send(noise[150:] + retries[2:])
    workers.primary = new = workers.new(workdir=old.worker.workdir)
    t0 = time.monotonic()
    await new.start()
    replies = await client.wait(retries + noise, within=90)
    print(f"kill -9 -> all replies in {time.monotonic() - t0:.1f} s")

    assert len({ack_fields(r) for r in replies[:5]}) == 1
    history = await client.history(tenant, "bob", group)
    assert [m.client_message_id for m in history] == [None, "the-one"]  # create, message
    committed = await read_outbox(client.bootstrap, tenant, group)
    assert sum(isinstance(r, MessageCommitted) for r in committed) == 1
    noise_seqs = sorted(ack_fields(r)[1] for r in replies[5:])
    assert noise_seqs == list(range(2, 302))  # the create is seq 1


async def test_a_crash_at_each_commit_step_leaves_one_message_one_seq_one_head(
    workers: Workers, client: Client
) -> None:
    """Spec 8.3 crash table: a crash between dedup, outbox append and head update is redone
    idempotently; after restart the message, its seq and the head exist exactly once.

    One machine restarted: every worker keeps the same datadir, so a crash after the commit
    leaves the local MessageStore behind the outbox and the next start catches it up."""
    machine = await workers.ensure_primary()
    tenant, group = f"t-{uid()}", f"g:crash-{uid()}"
    partition = conversation_partition(tenant, group, 16)
    await client.call(create_group(tenant, "alice", group, ["bob"]))
    await machine.stop()

    sent = {}
    for step in ("decided", "appended", "committed", "stored"):
        env = {"QIM_WRITER_CRASH_AT": step, "QIM_WRITER_CRASH_CMID": step}
        crasher = workers.new(env, workdir=machine.worker.workdir)
        await crasher.start()
        await crasher.serving([partition])
        sent[step] = send(tenant, "alice", group, step)
        await client.send([sent[step]])
        await crasher.exited()
    workers.primary = final = workers.new(workdir=machine.worker.workdir)
    await final.start()
    await final.serving([partition])

    originals = await client.wait(list(sent.values()))
    retries = [send(tenant, "alice", group, step) for step in sent]
    again = [await client.call(r) for r in retries]
    for step, first, second in zip(sent, originals, again, strict=True):
        assert ack_fields(first) == ack_fields(second), step
        assert len(client.replies[(tenant, "alice", sent[step].request_id)]) == 1, step
    assert [ack_fields(r)[1] for r in originals] == [2, 3, 4, 5]  # the create is 1

    history = await client.history(tenant, "bob", group)
    assert [m.client_message_id for m in history] == [None, *sent]
    head = await client.call(pull_history(tenant, "bob", group))
    assert head.history is not None and head.history.latest_conversation_seq == 5  # create + 4
    committed = await read_outbox(client.bootstrap, tenant, group)
    assert [r.client_message_id for r in committed if isinstance(r, MessageCommitted)] == list(sent)


async def test_a_paused_writer_is_fenced_after_its_session(
    workers: Workers, client: Client
) -> None:
    """Spec 26.6.1 / 19.2: an old owner that wakes up after the takeover appends nothing that a
    read_committed consumer sees, and no conversation_seq is ever allocated twice."""
    old = await workers.ensure_primary()
    tenant, group = f"t-{uid()}", f"g:fence-{uid()}"
    await client.call(create_group(tenant, "alice", group, ["bob"]))
    first = [send(tenant, "alice", group, f"a{i}") for i in range(5)]
    await client.send(first)
    await client.wait(first)

    old.signal(signal.SIGSTOP)
    stopped = time.monotonic()
    new = workers.new()
    try:
        await new.start()
        await new.serving()
        takeover = time.monotonic() - stopped
        during = [send(tenant, "alice", group, f"b{i}") for i in range(5)]
        await client.send(during)
        assert all(r.send_ack for r in await client.wait(during))
        print(f"takeover {takeover:.1f} s after SIGSTOP (session 6 s)")
    finally:
        old.signal(signal.SIGCONT)

    # the old owner rejoins as a new member: the group splits the partitions, and it serves its
    # share from its dormant state plus what the new owner committed meanwhile
    def split() -> bool:
        mine, theirs = set(old.status().get("serving", ())), set(new.status().get("serving", ()))
        return bool(mine) and not mine & theirs and mine | theirs == set(range(16))

    await eventually(split, 60, "both workers serving", diagnose=old.worker.log_tail)
    late = [send(tenant, "alice", group, f"c{i}") for i in range(5)]
    await client.send(late)
    replies = await client.wait(late, within=90)
    assert all(r.send_ack for r in replies)

    committed = [
        r
        for r in await read_outbox(client.bootstrap, tenant, group)
        if isinstance(r, MessageCommitted)
    ]
    assert [r.conversation_seq for r in committed] == list(range(2, 17)), "a seq repeated or lost"
    assert len({r.message_id for r in committed}) == 15
    old_epoch = committed[0].fencing_epoch
    assert {r.fencing_epoch for r in committed[:5]} == {old_epoch}
    # nothing the paused owner decided after the takeover became visible
    assert all(r.fencing_epoch > old_epoch for r in committed[5:])
    uncommitted = await read_outbox(client.bootstrap, tenant, group, committed=False)
    aborted = [r for r in uncommitted if r not in committed and isinstance(r, MessageCommitted)]
    status = {k: v for k, v in old.status().items() if k != "takeover_ms"}
    print(f"old owner after SIGCONT: {status}; aborted outbox records: {len(aborted)}")
    await old.stop()
    workers.primary = new


@pytest.fixture
async def private(stack: Stack, tmp_path: Path) -> AsyncIterator[PrivatePartition]:
    part = await PrivatePartition.create(stack.cfg.kafka.bootstrap, tmp_path)
    try:
        yield part
    finally:
        await part.close()
        # run the finalizers of the fenced producer's failed futures now: run inside a later
        # ast.parse (pytest's assertion rewriting) they trip CPython 3.11's AST recursion-depth
        # check (python/cpython#106905)
        gc.collect()


async def test_a_fenced_producer_can_neither_append_nor_commit(private: PrivatePartition) -> None:
    """The mechanism under the worker-level fencing test, in-process on private topics: the new
    owner's InitProducerId fences the old owner's transactional producer, whose next batch fails
    with ProducerFenced and leaves nothing for a read_committed reader."""
    tenant, group = private.tenant, "g:fenced"
    old = await private.take_over("old")
    await private.process(old, create_group(tenant, "alice", group, ["bob"]))
    await private.process(old, send(tenant, "alice", group, "before"))
    new = await private.take_over("new")
    with pytest.raises(ProducerFenced):
        await private.process(old, send(tenant, "alice", group, "from-the-old-owner"))
    await private.process(new, send(tenant, "alice", group, "from-the-new-owner"))
    assert await private.messages(group) == [
        ("before", 2, 1),  # the create is seq 1
        ("from-the-new-owner", 3, 2),
    ]


async def test_a_takeover_restores_from_the_checkpoint_and_rebuilds_a_bad_store(
    private: PrivatePartition,
) -> None:
    """Restore = newest checkpoint + the outbox after it; a MessageStore that claims more of the
    outbox than the log holds is wiped and rebuilt from the log."""
    tenant, group = private.tenant, "g:restore"
    first = await private.take_over("first", checkpoint_every=3)
    await private.process(first, create_group(tenant, "alice", group, ["bob"]))
    for i in range(4):
        await private.process(first, send(tenant, "alice", group, f"m{i}"))
        if i == 1:
            checkpointed = first.writer.applied_offset  # the third record (commit markers
            # take offsets too, so outbox offsets are not record counts)
    assert first.writer.debt == 2, "a checkpoint after the third record, two since"

    bogus = MessageStore(private.store_path("second"))
    bogus.commit([ArchiveWrite(b"m-bogus", b"x")], [], 999)
    bogus.close()
    second = await private.take_over("second")
    assert second.writer.checkpoint_offset == checkpointed
    assert second.writer.debt == 2, "only the records after the checkpoint were replayed"
    assert second.writer.state.snapshot() == first.writer.state.snapshot()
    assert second.writer.store.get(b"m-bogus") is None
    assert second.writer.store.applied_offset == first.writer.store.applied_offset
    await private.process(second, send(tenant, "alice", group, "after"))
    assert [m[:2] for m in await private.messages(group)] == [
        *((f"m{i}", i + 2) for i in range(4)),  # the create is seq 1
        ("after", 6),
    ]


async def test_history_survives_a_wiped_message_store(workers: Workers, client: Client) -> None:
    """The MessageStore is a function of the outbox: a worker with no local state rebuilds it."""
    writer = await workers.ensure_primary()
    tenant, group = f"t-{uid()}", "g:wipe"
    await client.call(create_group(tenant, "alice", group, ["bob"]))
    batch = [send(tenant, "alice", group, f"w{i}", payload=bytes([i]) * 100) for i in range(10)]
    await client.send(batch)
    await client.wait(batch)
    before = await client.history(tenant, "bob", group)

    await writer.stop()
    shutil.rmtree(writer.worker.datadir)
    await writer.start()
    await writer.serving()
    assert await client.history(tenant, "bob", group) == before
    assert len(before) == 11  # the create's CONTROL row and the 10 messages


async def test_a_group_of_10000_members_is_created_in_chunks_and_works(
    workers: Workers, client: Client
) -> None:
    """Issue 4: groups of at least 10,000 members; creation in chunks, one logical version."""
    await workers.ensure_primary()
    tenant, group = f"t-{uid()}", "g:big"
    members = [f"m-{i:05d}" for i in range(10_000)]
    created = await client.call(create_group(tenant, "owner", group, members))
    assert created.members is not None and created.members.total_hint == 10_001

    # The last invitee is a member: it can send and page the member list.
    ack = await client.call(send(tenant, "m-09999", group, "from-the-last-member"))
    assert ack_fields(ack)[1] == 2  # the create is the group's first CONTROL message (12.9)
    page = await client.call(pull_members(tenant, "m-00000", group))
    assert page.members is not None and page.members.total_hint == 10_001
    assert page.members.has_more and len(page.members.members) > 0
    assert code(await client.call(send(tenant, "m-10000", group, "x"))) == (
        ErrorCode.PERMISSION_DENIED
    )

    # One logical version, published as several chunks (spec 7.9; chunk size 4096).
    records = await read_outbox(client.bootstrap, tenant, group)
    chunks = [r for r in records if isinstance(r, MembershipCommitted)]
    assert len(chunks) == chunks[0].chunk_count >= 3
    assert sorted(c.chunk_index for c in chunks) == list(range(chunks[0].chunk_count))
    assert {c.membership_version for c in chunks} == {chunks[0].membership_version}


def _replay_history(
    stack: Stack, datadir: Path, out: Path, *which: str
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "qim.cli", "replay", "history", *which]
    argv += ["--datadir", str(datadir), "--out", str(out)]
    argv += ["--bootstrap", stack.cfg.kafka.bootstrap]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)


async def test_replay_history_rebuilds_every_store_row_for_row_and_names_a_tampered_row(
    workers: Workers, client: Client, stack: Stack, tmp_path: Path
) -> None:
    """Issue 8: `qim replay history` rebuilds the live MessageStores from the outbox while the
    writer runs and finds them identical; a row changed behind the writer's back is found."""
    writer = await workers.ensure_primary()
    tenant, group = f"t-{uid()}", "g:replay"
    await client.call(create_group(tenant, "alice", group, ["bob", "carol"]))
    batch = [send(tenant, "alice", group, f"r{i}", payload=bytes([i]) * 50) for i in range(12)]
    batch.append(direct(tenant, "bob", "carol", "rd", b"direct"))
    await client.send(batch)
    await client.wait(batch)

    done = _replay_history(stack, writer.worker.datadir, tmp_path / "all", "--all")
    assert done.returncode == 0, done.stdout + done.stderr
    verdicts = [line for line in done.stdout.splitlines() if line.startswith("partition ")]
    assert verdicts and all(": identical" in v for v in verdicts), done.stdout

    partition = conversation_partition(tenant, group, 16)
    await writer.stop()
    store = MessageStore(writer.worker.datadir / "message-store" / f"p{partition}")
    try:
        key, value = next((k, v) for k, v in store.items() if tenant.encode() in k)
        store.put(key, value + b"tampered")
    finally:
        store.close()
    try:
        out = tmp_path / "one"
        bad = _replay_history(stack, writer.worker.datadir, out, "--partition", str(partition))
        assert bad.returncode == 1, bad.stdout + bad.stderr
        assert "DIFFERENT" in bad.stdout and repr(key)[:40] in bad.stdout
    finally:
        store = MessageStore(writer.worker.datadir / "message-store" / f"p{partition}")
        store.put(key, value)
        store.close()
        await writer.start()
        await writer.serving()
