"""The FanoutCoordinator shell against a real Kafka (issue 5, spec 10.1, ADR-0012, ADR-0017).

Each test gets private topics (outbox: 4 partitions, dispatch: 64, writer snapshots: 4) and its
own consumer group. The ConversationWriter is emulated by :class:`FakeWriter`: outbox records,
their member slices and (optionally) a writer checkpoint in one Kafka transaction, built with
``qim.core.membership`` through the fanout tests' writer double. The service runs in-process,
except where a test kills it: there it runs in a real ``faust worker`` that gets SIGKILL (no
shutdown hook, no last commit). Every check polls with a timeout; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import GroupCoordinatorNotAvailableError

from qim.agents.fanout.coordinator import FanoutCoordinatorService
from qim.agents.fanout.options import FanoutOptions
from qim.agents.writer.snapshot import checkpoint_records
from qim.core.fanout import FanoutConfig, FindingKind, audit_fanout
from qim.devstack.stack import Stack, wait_topics_visible
from qim.schemas.records import (
    DispatchLogRecord,
    GroupDispatch,
    MembershipCommitted,
    OutboxRecord,
    conversation_key,
    conversation_partition,
    decode_dispatch_record,
    decode_outbox_record,
    encode_membership_record,
    encode_outbox_record,
)
from qim.schemas.records.user_state import UserStateCommand
from qim.streams.identity import fetch_log_identity
from tests.integration.workers import FaustWorker
from tests.unit.agents.test_fanout_seed import checkpoint_of
from tests.unit.fanout.support import Outbox, shard_of

pytestmark = pytest.mark.integration

SHARDS = 64
PARTITIONS = 4
CONFIG = FanoutConfig(mailbox_shard_count=SHARDS)
TIMEOUT = 30.0
T = TypeVar("T")


@dataclass(frozen=True)
class Pipeline:
    """Private topics and group of one test."""

    bootstrap: str
    name: str

    @property
    def outbox(self) -> str:
        return f"{self.name}.outbox"

    @property
    def dispatch(self) -> str:
        return f"{self.name}.dispatch"

    @property
    def snapshots(self) -> str:
        return f"{self.name}.writer-snapshots"

    def options(self, **overrides: Any) -> FanoutOptions:
        values: dict[str, Any] = {
            "bootstrap": self.bootstrap,
            "config": CONFIG,
            "group_id": f"{self.name}.fanout",
            "client_id": self.name,
            "outbox_topic": self.outbox,
            "dispatch_topic": self.dispatch,
            "snapshots_topic": self.snapshots,
            "session_timeout_ms": 10_000,
            "heartbeat_interval_ms": 1_000,
        }
        return FanoutOptions(**{**values, **overrides})


@pytest.fixture
async def pipeline(stack: Stack) -> Pipeline:
    p = Pipeline(stack.cfg.kafka.bootstrap, f"fanout-{uuid.uuid4().hex[:8]}")
    admin = AIOKafkaAdminClient(bootstrap_servers=p.bootstrap)
    await admin.start()
    try:
        compact = {"cleanup.policy": "compact"}
        await admin.create_topics(
            [
                NewTopic(p.outbox, PARTITIONS, 1),
                NewTopic(p.dispatch, SHARDS, 1),
                NewTopic(p.snapshots, PARTITIONS, 1, topic_configs=compact),
            ]
        )
        await wait_topics_visible(admin, {p.outbox: PARTITIONS, p.dispatch: SHARDS})
    finally:
        await admin.close()
    return p


def conversation_of(record: OutboxRecord) -> str:
    return record.group_id if isinstance(record, MembershipCommitted) else record.conversation_id


def partition_of(record: OutboxRecord) -> int:
    return conversation_partition(record.tenant_id, conversation_of(record), PARTITIONS)


class FakeWriter:
    """Commits the writer double's records as the ConversationWriter does (module docstring)."""

    def __init__(self, pipeline: Pipeline, outbox: Outbox) -> None:
        self.p = pipeline
        self.outbox = outbox
        self.producer = AIOKafkaProducer(
            bootstrap_servers=pipeline.bootstrap,
            transactional_id=f"{pipeline.name}-writer",
            enable_idempotence=True,
            acks="all",
        )
        self.offsets: dict[int, tuple[int, int]] = {}
        """Log position in the double -> (outbox partition, offset)."""

    async def __aenter__(self) -> FakeWriter:
        await self.producer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.producer.stop()

    async def commit(
        self, positions: Sequence[int], *, abort: bool = False, checkpoint: bool = False
    ) -> None:
        """One transaction: the records at ``positions``, their slices, maybe a checkpoint."""
        producer, log = self.producer, self.outbox.log
        await producer.begin_transaction()
        futures = []
        for pos in positions:
            record = log[pos]
            key = conversation_key(record.tenant_id, conversation_of(record))
            value = encode_outbox_record(record)
            partition = partition_of(record)
            futures.append(await producer.send(self.p.outbox, value, key=key, partition=partition))
            for piece in self.outbox.slices.get(pos, ()):
                value = encode_membership_record(piece)
                await producer.send(self.p.dispatch, value, key=key, partition=piece.partition)
        metadata = await asyncio.gather(*futures)
        for pos, meta in zip(positions, metadata, strict=True):
            self.offsets[pos] = (meta.partition, meta.offset)
        if checkpoint:
            partition, offset = self.offsets[positions[-1]]
            cp = checkpoint_of(self.outbox, positions[-1], partition=partition)
            identity = await fetch_log_identity(self.p.bootstrap, self.p.outbox)
            cp = msgspec.structs.replace(cp, outbox_offset=offset, outbox_identity=identity)
            for key, value in checkpoint_records(cp):
                await producer.send(self.p.snapshots, value, key=key, partition=partition)
        if abort:
            await producer.abort_transaction()
        else:
            await producer.commit_transaction()


async def read_topic(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, int, bytes]]:
    """Every committed ``(partition, offset, value)`` of ``topic``, partition by partition."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, i) for i in range(partitions)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        for tp in tps:  # a plain seek: seek_to_beginning can lose a race with the first reset
            consumer.seek(tp, 0)
        rows: list[tuple[int, int, bytes]] = []
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            fetched = await consumer.getmany(timeout_ms=1000)
            rows += [(tp.partition, m.offset, m.value) for tp, ms in fetched.items() for m in ms]
        return sorted(rows, key=lambda row: row[:2])
    finally:
        await consumer.stop()


async def outbox_log(p: Pipeline) -> list[tuple[int, int, OutboxRecord]]:
    rows = await read_topic(p.bootstrap, p.outbox, PARTITIONS)
    return [(part, offset, decode_outbox_record(value)) for part, offset, value in rows]


async def dispatch_log(p: Pipeline) -> list[tuple[int, DispatchLogRecord]]:
    rows = await read_topic(p.bootstrap, p.dispatch, SHARDS)
    decoded = [(part, decode_dispatch_record(value)) for part, _, value in rows]
    return [(part, r) for part, r in decoded if not isinstance(r, UserStateCommand)]


async def committed(p: Pipeline) -> dict[int, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=p.bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(f"{p.name}.fanout")
    except GroupCoordinatorNotAvailableError:  # the group's coordinator is still being elected
        return {}
    finally:
        await admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == p.outbox}


async def caught_up(p: Pipeline) -> bool:
    consumer = AIOKafkaConsumer(bootstrap_servers=p.bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        tps = [TopicPartition(p.outbox, i) for i in range(PARTITIONS)]
        ends = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
    done = await committed(p)
    return all(done.get(tp.partition, 0) >= end for tp, end in ends.items() if end > 0)


async def eventually(check: Callable[[], Awaitable[T]], what: str, within_s: float = TIMEOUT) -> T:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        result = await check()
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {within_s}s waiting for {what}; last {result!r}")
        await asyncio.sleep(0.2)


@asynccontextmanager
async def running(service: FanoutCoordinatorService) -> AsyncIterator[FanoutCoordinatorService]:
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


async def audit(p: Pipeline) -> list[str]:
    """``audit_fanout`` over everything committed to the outbox and the dispatch log."""
    outbox = [record for _, _, record in await outbox_log(p)]
    findings = audit_fanout(outbox, await dispatch_log(p), config=CONFIG)
    return [f"{f.kind}:{f.message_id[:8]}@{f.shard}:{f.detail}" for f in findings]


async def assert_audit_clean(p: Pipeline) -> None:
    """Poll: the writer's transaction markers reach the dispatch partitions asynchronously, so a
    read_committed reader may see the fanout's dispatches a moment after their slices' marker."""
    findings: list[str] = []

    async def clean() -> bool:
        nonlocal findings
        findings = await audit(p)
        return not findings

    try:
        await eventually(clean, "a clean audit", within_s=10)
    except AssertionError:
        raise AssertionError(f"audit findings: {findings}") from None


def dispatches_of(
    log: list[tuple[int, DispatchLogRecord]], message_id: bytes
) -> list[tuple[int, GroupDispatch]]:
    """``(partition, dispatch)`` of one message, in log order."""
    return [
        (part, r) for part, r in log if isinstance(r, GroupDispatch) and r.message_id == message_id
    ]


def users_on_new_shards(taken: set[int], count: int, prefix: str) -> list[str]:
    found: list[str] = []
    for n in range(10_000):
        user = f"{prefix}{n}"
        if shard_of(user, SHARDS) not in taken:
            taken.add(shard_of(user, SHARDS))
            found.append(user)
            if len(found) == count:
                return found
    raise AssertionError("no free shard found")


# -- tests -------------------------------------------------------------------------------------


async def test_one_group_dispatch_per_target_shard_at_its_explicit_partition(
    pipeline: Pipeline,
) -> None:
    """Spec 7.8 / 6.5: exactly one GroupDispatch per target MailboxShard, partition = shard."""
    outbox = Outbox(shards=SHARDS)
    outbox.create("g:team", "owner", [f"u{i}" for i in range(12)])
    group_msg = outbox.send("g:team", "u3")
    group_shards = _shards(outbox, "g:team")
    pair = outbox.direct("alice", "bob")
    lone = outbox.direct("carol", "carol")  # a note to self: one participant, one shard
    async with FakeWriter(pipeline, outbox) as writer:
        await writer.commit([0])
        await writer.commit([1, 2, 3])
    service = FanoutCoordinatorService(pipeline.options())
    async with running(service):
        await eventually(lambda: caught_up(pipeline), "the fanout to catch up")
    await assert_audit_clean(pipeline)
    log = await dispatch_log(pipeline)
    create = outbox.log[0]  # the create's MEMBERSHIP entries reach every member (12.9)
    expected = {
        create.message_id: group_shards,
        group_msg.message_id: group_shards,
        pair.message_id: sorted({shard_of("alice", SHARDS), shard_of("bob", SHARDS)}),
        lone.message_id: [shard_of("carol", SHARDS)],
    }
    for message_id, shards in expected.items():
        got = dispatches_of(log, message_id)
        assert sorted(d.target_mailbox_shard for _, d in got) == shards
        assert all(part == d.target_mailbox_shard for part, d in got)
    assert len(group_shards) > 3  # the group really spans shards
    sample = service.registry.get_sample_value
    assert sample("qim_fanout_dispatches_total") == sum(len(s) for s in expected.values())
    assert sample("fanout_target_shards_per_message_count") == 3  # messages only
    assert sample("fanout_lag_seconds_count") == 4  # the create's dispatches too


async def test_an_aborted_outbox_transaction_is_never_fanned_out(pipeline: Pipeline) -> None:
    """read_committed: a send whose transaction aborted was never acknowledged (direction 4.6)."""
    outbox = Outbox(shards=SHARDS)
    aborted = outbox.direct("alice", "bob")
    outbox.create("g:ghost", "owner", ["u1", "u2"])
    ghost_msg = outbox.send("g:ghost", "u1")
    kept = outbox.direct("alice", "bob")
    async with FakeWriter(pipeline, outbox) as writer:
        await writer.commit([0, 1, 2], abort=True)
        await writer.commit([3])
    async with running(FanoutCoordinatorService(pipeline.options())):
        await eventually(lambda: caught_up(pipeline), "the fanout to catch up")
    await assert_audit_clean(pipeline)
    log = await dispatch_log(pipeline)
    assert dispatches_of(log, aborted.message_id) == []
    assert dispatches_of(log, ghost_msg.message_id) == []
    shards = sorted({shard_of("alice", SHARDS), shard_of("bob", SHARDS)})
    assert sorted(d.target_mailbox_shard for _, d in dispatches_of(log, kept.message_id)) == shards


async def test_a_group_message_before_its_membership_version_waits_then_goes_out(
    pipeline: Pipeline,
) -> None:
    """Spec 10.1 step 3: NotReady holds the record and the commit; it is never dropped."""
    outbox = Outbox(shards=SHARDS)
    outbox.create("g:late", "owner", [f"u{i}" for i in range(6)])
    message = outbox.send("g:late", "u2")
    partition = partition_of(message)
    service = FanoutCoordinatorService(pipeline.options())
    sample = service.registry.get_sample_value
    unknown = {"reason": "membership_version_unknown"}

    async def held() -> bool:
        return bool(sample("qim_fanout_not_ready_total", unknown))

    async def out() -> list[tuple[int, GroupDispatch]]:
        return dispatches_of(await dispatch_log(pipeline), message.message_id)

    async with running(service), FakeWriter(pipeline, outbox) as writer:
        await writer.commit([1])  # the message first: its version 1 is unknown
        await eventually(held, "the message to be held")
        _, offset = writer.offsets[1]
        assert (await committed(pipeline)).get(partition, 0) <= offset
        assert await out() == []
        assert service.status()["held"] == {partition: 1}
        await writer.commit([0])  # the create (and its slices) arrives
        await eventually(out, "the held message to go out")
        await eventually(lambda: caught_up(pipeline), "the commit to pass it")
        got = await out()  # read after the commit: every dispatch of the record is acknowledged
    assert sorted(d.target_mailbox_shard for _, d in got) == _shards(outbox, "g:late")
    assert sample("qim_fanout_released_total") == 1
    assert service.status()["held"] == {}


def _shards(outbox: Outbox, group: str) -> list[int]:
    state = outbox.membership.group(outbox.tenant, group)
    assert state is not None
    return state.shards()


class CrashBeforeCommit:
    """A ``before_commit`` hook that never returns once a round carried records after an earlier
    round committed: the process "dies" after the acks, before the commit."""

    def __init__(self) -> None:
        self.calls = 0
        self.allowed: dict[int, int] = {}
        self.blocked: dict[int, int] = {}
        self.hit = asyncio.Event()

    async def __call__(self, offsets: Mapping[int, int]) -> None:
        self.calls += 1
        # a jump of >= 2 carries a record (only a transaction marker moves the offset by 1 alone)
        if self.calls > 1 and any(o >= self.allowed.get(p, 0) + 2 for p, o in offsets.items()):
            self.blocked = dict(offsets)
            self.hit.set()
            await asyncio.Future()
        self.allowed.update(offsets)


def _busy_outbox() -> Outbox:
    outbox = Outbox(shards=SHARDS)
    for g in range(3):
        outbox.create(f"g:{g}", f"owner{g}", [f"u{g}-{i}" for i in range(8)])
    for n in range(24):
        outbox.send(f"g:{n % 3}", f"u{n % 3}-{n % 8}")
        outbox.direct(f"a{n % 5}", f"b{n % 7}")
    outbox.add("g:1", ["late1", "late2"])
    outbox.leave("g:2", "u2-3")
    outbox.send("g:1", "late1")
    return outbox


async def test_a_crash_between_produce_and_commit_redispatches_the_same_dispatch_ids(
    pipeline: Pipeline,
) -> None:
    """ADR-0012: the commit never passes a record whose dispatches were not acknowledged, so a
    crash after the acks and before the commit sends them again -- same ``dispatch_id``, same
    bytes -- and the MailboxNode's dedup absorbs them."""
    outbox = _busy_outbox()
    async with FakeWriter(pipeline, outbox) as writer:
        for start in range(0, len(outbox.log), 5):
            await writer.commit(list(range(start, min(start + 5, len(outbox.log)))))
    hook = CrashBeforeCommit()
    first = FanoutCoordinatorService(pipeline.options(max_records=4), before_commit=hook)
    async with running(first):
        await asyncio.wait_for(hook.hit.wait(), TIMEOUT)
        done = await committed(pipeline)
        assert all(done.get(p, 0) == o for p, o in hook.allowed.items())
        rows = await outbox_log(pipeline)

        async def committed_ones_dispatched() -> bool:  # every record below the commit is out
            below = [r for p, o, r in rows if o < done.get(p, 0)]
            findings = audit_fanout(below, await dispatch_log(pipeline), config=CONFIG)
            return not [f for f in findings if f.kind == FindingKind.COMMIT_WITHOUT_DISPATCH]

        await eventually(committed_ones_dispatched, "the committed records' dispatches")
    # the kill: stopped inside the hook, the round's offsets were never committed
    window = [r for p, o, r in rows if done.get(p, 0) <= o < hook.blocked.get(p, 0)]
    async with running(FanoutCoordinatorService(pipeline.options())):
        await eventually(lambda: caught_up(pipeline), "the restarted fanout to catch up")
    await assert_audit_clean(pipeline)
    log = await dispatch_log(pipeline)
    counts = Counter(d.dispatch_id for _, d in log if isinstance(d, GroupDispatch))
    again = [d for r in window for _, d in dispatches_of(log, r.message_id)]
    assert again, "the crashed round carried dispatches"
    assert all(counts[d.dispatch_id] == 2 for d in again)


class HoldFirstCommit:
    """A ``before_commit`` hook that holds the first OffsetCommit until released."""

    def __init__(self) -> None:
        self.calls: list[dict[int, int]] = []
        self.release = asyncio.Event()

    async def __call__(self, offsets: Mapping[int, int]) -> None:
        self.calls.append(dict(offsets))
        if len(self.calls) == 1:
            await self.release.wait()


async def test_a_held_offset_commit_holds_back_no_dispatch_and_the_next_carries_every_partition(
    pipeline: Pipeline,
) -> None:
    """Issue 13: a step hands its acknowledged offset to the committer and ends, so the
    partitions keep fanning out while an OffsetCommit is in flight, and what they handed over
    meanwhile goes out as one request (one commit at a time, every partition in it)."""
    outbox = _busy_outbox()
    hook = HoldFirstCommit()
    async with running(
        FanoutCoordinatorService(pipeline.options(max_records=4), before_commit=hook)
    ):
        await eventually(lambda: asyncio.sleep(0, bool(hook.calls)), "the first commit")
        async with FakeWriter(pipeline, outbox) as writer:
            for start in range(0, len(outbox.log), 5):
                await writer.commit(list(range(start, min(start + 5, len(outbox.log)))))
        await assert_audit_clean(pipeline)  # every record fanned out, the first commit held
        assert len(hook.calls) == 1
        hook.release.set()
        await eventually(lambda: caught_up(pipeline), "the held offsets to be committed")
    partitions = {partition_of(record) for record in outbox.log}
    assert len(partitions) > 1
    assert partitions <= set(hook.calls[1]), hook.calls


async def test_a_restart_rebuilds_membership_from_the_writer_checkpoint_below_its_commit(
    pipeline: Pipeline,
) -> None:
    """Recovery: the newest writer checkpoint is ahead of the group's commit; the one below it
    is taken, the records between are replayed without producing, and versions the newer
    checkpoint no longer knows are still fanned out exactly."""
    outbox = Outbox(shards=SHARDS)
    outbox.create("g:club", "owner", ["m1", "m2", "m3"])  # 0: v1
    first = outbox.send("g:club", "m1")  # 1
    v1 = _shards(outbox, "g:club")
    x, y = users_on_new_shards(set(v1), 2, "new")
    outbox.add("g:club", [x])  # 2: v2
    second = outbox.send("g:club", "m2")  # 3: pins v2
    outbox.add("g:club", [y])  # 4: v3
    third = outbox.send("g:club", x)  # 5: pins v3
    fourth = outbox.send("g:club", y)  # 6
    partition = partition_of(first)
    async with FakeWriter(pipeline, outbox) as writer:
        await writer.commit([0], checkpoint=True)  # the checkpoint covers the create
        await writer.commit([1])
        async with running(FanoutCoordinatorService(pipeline.options())):
            await eventually(lambda: caught_up(pipeline), "the first fanout to catch up")
        await writer.commit([2, 3])
        await writer.commit([4, 5], checkpoint=True)  # newer than the group's commit
        await writer.commit([6])
        checkpoint_offset = writer.offsets[0][1]
    service = FanoutCoordinatorService(pipeline.options())
    async with running(service):
        await eventually(lambda: caught_up(pipeline), "the restarted fanout to catch up")
        recovery = service.status()["recoveries"][partition]
    assert recovery["basis"] == "checkpoint"
    assert recovery["checkpoint_offset"] == checkpoint_offset
    assert recovery["replayed"] == 1  # the first message, rebuilt but not produced again
    await assert_audit_clean(pipeline)
    log = await dispatch_log(pipeline)
    assert len(dispatches_of(log, first.message_id)) == len(v1)
    for message, version in ((second, 2), (third, 3), (fourth, 3)):
        got = dispatches_of(log, message.message_id)
        assert {d.membership_version for _, d in got} == {version}
    second_shards = {d.target_mailbox_shard for _, d in dispatches_of(log, second.message_id)}
    assert shard_of(x, SHARDS) in second_shards  # v2 reaches the shard it added


async def test_a_sigkill_mid_stream_and_a_restart_lose_no_dispatch(
    stack: Stack, pipeline: Pipeline, tmp_path: Path
) -> None:
    """SIGKILL the coordinator's ``faust worker`` once a third of the outbox is committed
    (rounds of two records, so one is usually in flight; no shutdown hook runs), write the
    second half, restart: the audit over all of it finds nothing missing; duplicates are
    allowed and must be byte-identical."""
    outbox = _busy_outbox()
    half = len(outbox.log) // 2
    env = {
        "QIM_TEST_APP_ID": f"{pipeline.name}-app",
        "QIM_TEST_FANOUT": pipeline.name,
        "QIM_TEST_FANOUT_MAX_RECORDS": "2",
    }
    worker = FaustWorker(stack, "tests.integration.faust_apps.fanout", tmp_path, env)
    async with FakeWriter(pipeline, outbox) as writer:
        for start in range(0, half, 3):
            positions = list(range(start, min(start + 3, half)))
            await writer.commit(positions, checkpoint=start % 12 == 0)

        async def some_committed() -> bool:
            return sum((await committed(pipeline)).values()) >= half // 3

        await asyncio.to_thread(worker.start)
        try:
            await eventually(some_committed, "a third of the outbox to be committed", 90)
            print("caught up with the first half at the kill:", await caught_up(pipeline))
        finally:
            await asyncio.to_thread(worker.kill)
        for start in range(half, len(outbox.log), 3):
            positions = list(range(start, min(start + 3, len(outbox.log))))
            await writer.commit(positions, checkpoint=start % 12 == 0)
    # the dead member's session must expire before its partitions move: a longer wait
    async with running(FanoutCoordinatorService(pipeline.options())):
        await eventually(lambda: caught_up(pipeline), "the restarted fanout to catch up", 90)
    await assert_audit_clean(pipeline)


async def test_register_runs_the_coordinator_in_a_faust_worker(
    stack: Stack, pipeline: Pipeline, tmp_path: Path
) -> None:
    """``register(app)`` is all the conversation app needs: a real ``faust worker`` fans out."""
    outbox = Outbox(shards=SHARDS)
    outbox.direct("alice", "bob")
    env = {"QIM_TEST_APP_ID": f"{pipeline.name}-app", "QIM_TEST_FANOUT": pipeline.name}
    worker = FaustWorker(stack, "tests.integration.faust_apps.fanout", tmp_path, env)
    worker.start()
    try:
        async with FakeWriter(pipeline, outbox) as writer:
            await writer.commit([0])
        await eventually(
            lambda: caught_up(pipeline), "the worker's fanout to catch up", within_s=60
        )
    finally:
        worker.stop()
    await assert_audit_clean(pipeline)
