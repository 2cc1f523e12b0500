"""One owned partition's batches, each executed as ONE Kafka transaction.

Why a transaction per batch (direction.md 4.6, spec 8 Kafka mapping): the outbox appends, the
member slices (dispatch topic, partition = MailboxShard), the replies (to-gateway, partition =
ConnectionShard), the admin replies, a checkpoint now and then, and the consumed request offsets
commit together or not at all. Readers use read_committed, so a SEND_ACK is visible exactly when
its outbox record is durable, and a fenced former owner's output never is: its transactional
producer (``transactional_id = qim-conversation-writer-<p>``) was fenced by the new owner's
InitProducerId, so its next send or commit fails with ProducerFenced.

Order inside a batch: requests are decided in log order, each on top of the records appended
before it (the writer state is applied at once, ``PartitionWriter.append``); replies are produced
in decision order. A PULL_HISTORY or a RECALL / EDIT of a conversation that already has an
append in the open transaction cuts the batch there (commit, write the MessageStore, go on):
history and an amend's target are read from the store, which only holds committed records (a
double-tap recall in one batch must see the first recall's mark: one CONTROL event, 13.4.4).
The store is written after the commit, with the outbox offsets the broker assigned. Any
failure propagates: the caller drops this partition's state (it may be ahead of the log) and
restores it from the checkpoint and the outbox.

``CrashHook`` is the test hook of spec 8.3's crash table: with ``QIM_WRITER_CRASH_AT=<step>`` and
``QIM_WRITER_CRASH_CMID=<client_message_id>`` the process exits at that step of the batch that
carries the message (``amend:<conversation_id>:<target_seq>`` names a RECALL / EDIT instead,
``react:<conversation_id>:<seq>:<user_id>:<reaction_key>`` a REACT).
Steps: ``decided`` (coordinates allocated, nothing appended), ``appended`` (outbox records
acknowledged inside the open transaction), ``committed`` (transaction committed and its replies
acknowledged, MessageStore not written), ``stored`` (everything done).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from qim.agents.trace_lines import committed as trace_committed
from qim.agents.writer.metrics import WriterMetrics
from qim.agents.writer.partition import PartitionWriter, Plan, conversation_of
from qim.agents.writer.requests import (
    RequestContext,
    conversation_of_request,
    conversations_to_seal,
    handle_request,
)
from qim.agents.writer.snapshot import checkpoint_records
from qim.core.reactions.push import ReactionPushMerge, push_records
from qim.schemas.frames.errors import ErrorCode
from qim.schemas.records import (
    DIRECT,
    AmendRequest,
    MessageReacted,
    PullHistoryRequest,
    PullReactionsRequest,
    ReactRequest,
    SendRequest,
    conversation_key,
    decode_conversation_request,
    encode_membership_record,
    encode_outbox_record,
    encode_record,
)
from qim.schemas.records.reactions import encode_reaction_push
from qim.schemas.records.transient import encode_transient
from qim.streams.transit import TransitError, load_transit_sealer

__all__ = [
    "CRASH_EXIT_CODE",
    "CRASH_STEPS",
    "CrashHook",
    "OwnedPartition",
    "SelfFencedError",
    "Topics",
]

log = logging.getLogger(__name__)

CRASH_STEPS: Final = ("decided", "appended", "committed", "stored")
CRASH_EXIT_CODE: Final = 70


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class SelfFencedError(RuntimeError):
    """The group lease may have lapsed (no heartbeat for writer_self_fence_deadline)."""


@dataclass(frozen=True, slots=True)
class Topics:
    """Names and partition counts of the topics a transaction writes."""

    requests: str
    outbox: str
    snapshots: str
    to_gateway: str
    dispatch: str
    admin_replies: str
    to_gateway_partitions: int


@dataclass(frozen=True, slots=True)
class CrashHook:
    """Exit the process at ``step`` of the batch carrying ``client_message_id`` (tests only)."""

    step: str | None = None
    client_message_id: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CrashHook:
        step = env.get("QIM_WRITER_CRASH_AT") or None
        if step is not None and step not in CRASH_STEPS:
            raise ValueError(f"QIM_WRITER_CRASH_AT must be one of {CRASH_STEPS}, got {step!r}")
        return cls(step, env.get("QIM_WRITER_CRASH_CMID", ""))

    def armed(self, requests: Sequence[object]) -> bool:
        return self.step is not None and any(self._matches(r) for r in requests)

    def _matches(self, request: object) -> bool:
        """A send by its client_message_id; a RECALL / EDIT / REACT by its name (module doc)."""
        if isinstance(request, SendRequest):
            return request.message.client_message_id == self.client_message_id
        if isinstance(request, AmendRequest):
            name = f"amend:{request.conversation_id}:{request.target_conversation_seq}"
            return name == self.client_message_id
        if isinstance(request, ReactRequest):
            name = (
                f"react:{request.conversation_id}:{request.conversation_seq}:"
                f"{request.user_id}:{request.reaction_key}"
            )
            return name == self.client_message_id
        return False

    def __call__(self, step: str, armed: bool) -> None:
        if armed and step == self.step:
            log.warning("crash hook: exiting at step %r", step)
            logging.shutdown()
            os._exit(CRASH_EXIT_CODE)


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _cuts(request: Any, plan: Plan) -> bool:
    """Whether ``request`` must be decided on the committed store: a read or an amend of a
    conversation with an append in ``plan``; a REACT of one with a sequenced append (its
    target may be in the open batch; earlier REACTs it reads through ``plan.reaction_writes``)."""
    if isinstance(request, PullHistoryRequest | AmendRequest | PullReactionsRequest):
        return conversation_of_request(request) in plan.touched
    if isinstance(request, ReactRequest):
        return conversation_of_request(request) in plan.sequenced
    return False


class OwnedPartition:
    """A partition this worker serves: its state, its transactional producer, its counters."""

    def __init__(
        self,
        writer: PartitionWriter,
        producer: AIOKafkaProducer,
        *,
        topics: Topics,
        group_id: str,
        ctx: RequestContext,
        checkpoint_every: int,
        checkpoint_interval_s: float,
        lease_valid: Callable[[], bool],
        crash: CrashHook,
        metrics: WriterMetrics | None = None,
        reply_producer: Any = None,
        reaction_merge_window_ms: int = 0,
        connection_shard: Callable[[str, str], int] | None = None,
        early_offsets: bool = True,
    ) -> None:
        """``reply_producer`` (non-transactional, shared by the process's partitions) sends the
        replies after the commit; without one they ride the transaction (unit tests), and no
        REACTION_UPDATE is pushed. ``connection_shard(tenant, user)`` addresses the pushes.

        ``early_offsets``: the request offsets are handed to the transaction right after the
        sends are enqueued, so their AddOffsetsToTxn + TxnOffsetCommit run while the produce
        acknowledgements are awaited (aiokafka's sender runs one coordinator request at a time
        beside the produce requests, and ``commit_transaction`` still flushes every send first).
        """
        self.writer = writer
        self.metrics = metrics
        self.producer = producer
        self.reply_producer = reply_producer
        self.topics = topics
        self.group_id = group_id
        self.ctx = ctx
        self.checkpoint_every = checkpoint_every
        self.checkpoint_interval_s = checkpoint_interval_s
        self.lease_valid = lease_valid
        self.crash = crash
        self.last_checkpoint = time.monotonic()
        self.committed = 0
        self.lock = asyncio.Lock()
        self._tp = TopicPartition(topics.requests, writer.partition)
        self.reaction_merge = ReactionPushMerge(reaction_merge_window_ms)
        self._connection_shard = connection_shard
        self.reaction_pushes = 0
        """ReactionPush records handed to the reply producer (the service's status page)."""
        self.early_offsets = early_offsets
        self.transit = load_transit_sealer()

    @property
    def partition(self) -> int:
        return self.writer.partition

    async def process(self, records: Sequence[Any]) -> None:
        """Decide and commit ``records`` (consumer records of this partition, in order).

        The caller checks the lease first; a failure here leaves the state ahead of the log.
        """
        decoded: list[tuple[int, Any]] = []
        for record in records:
            try:
                value = self.transit.open(record.value)  # the gateway's hop seal (decision 44)
                decoded.append((record.offset, decode_conversation_request(value)))
            except (msgspec.DecodeError, msgspec.ValidationError, TypeError, TransitError) as exc:
                log.error("p%d: undecodable request at %d: %s", self.partition, record.offset, exc)
                decoded.append((record.offset, None))
        armed = self.crash.armed([r for _, r in decoded])
        if self.ctx.ensure_keys is not None:  # keys durable before anything is sealed with them
            wanted = conversations_to_seal(self.writer, self.ctx, (r for _, r in decoded))
            if wanted:
                await self.ctx.ensure_keys(wanted)
        now_ms = int(time.time() * 1000)
        plan = Plan()
        for offset, request in decoded:
            if _cuts(request, plan):
                await self._commit(plan, offset, armed)
                plan = Plan()
            if request is not None:
                self._decide(request, now_ms, plan)
        await self._commit(plan, decoded[-1][0] + 1, armed)

    def _decide(self, request: Any, now_ms: int, plan: Plan) -> None:
        """One request into the plan; a send's decision time is ``conversation_seq_alloc``."""
        metrics = self.metrics
        if metrics is None or not isinstance(request, SendRequest):
            handle_request(self.writer, self.ctx, request, now_ms, plan)
            return
        replies = len(plan.replies)
        started = time.perf_counter()
        handle_request(self.writer, self.ctx, request, now_ms, plan)
        metrics.seq_alloc.observe(time.perf_counter() - started)
        for reply in plan.replies[replies:]:
            if reply.error is not None and reply.error.code == ErrorCode.CLOCK_UNSAFE:
                metrics.clock_unsafe.inc()

    async def _commit(self, plan: Plan, next_offset: int, armed: bool) -> None:
        """One transaction: the plan's records, a checkpoint if due, the request offsets."""
        self.crash("decided", armed)
        producer, topics, p = self.producer, self.topics, self.partition
        started = time.perf_counter()
        offsets = {self._tp: OffsetAndMetadata(next_offset, "")}
        await producer.begin_transaction()
        try:
            outbox, others = await self._enqueue(plan, replies=self.reply_producer is None)
            sent_offsets: asyncio.Future[None] | None = None
            if self.early_offsets:  # the offsets do not depend on the acknowledgements
                sent_offsets = asyncio.ensure_future(
                    producer.send_offsets_to_transaction(offsets, self.group_id)
                )
                sent_offsets.add_done_callback(_retrieve)  # a failed send is what raises
            metadata = await asyncio.gather(*outbox)
            await asyncio.gather(*others)
            appended = [(r, m.offset) for r, m in zip(plan.outbox, metadata, strict=True)]
            self.crash("appended", armed)
            checkpointed = self._checkpoint_due()
            if checkpointed:
                covers = appended[-1][1] if appended else self.writer.applied_offset
                for key, value in checkpoint_records(self.writer.checkpoint(covers)):
                    await self._produce(topics.snapshots, value, key, p)
            if sent_offsets is None:
                await producer.send_offsets_to_transaction(offsets, self.group_id)
            else:
                await sent_offsets
            if not self.lease_valid():
                raise SelfFencedError("lease lapsed before the commit")
            await producer.commit_transaction()
        except BaseException:
            await self._abort()
            raise
        self.committed += 1
        if self.metrics is not None:
            self.metrics.transactions.inc()
            self.metrics.outbox_records.inc(len(appended))
            self.metrics.txn_seconds.observe(time.perf_counter() - started)
        trace_committed(log, appended)
        if checkpointed:
            self.writer.debt = 0
            self.last_checkpoint = time.monotonic()
        if self.reply_producer is not None:
            await self._reply(plan)
            now = _monotonic_ms()
            for reaction in plan.reactions:
                self.reaction_merge.offer(reaction, now)
            if plan.reactions and not self.reaction_merge.window_ms:
                await self.flush_reactions(now)
        self.crash("committed", armed)
        self.writer.stored(appended)
        self.crash("stored", armed)

    async def _enqueue(
        self, plan: Plan, *, replies: bool
    ) -> tuple[list[asyncio.Future[Any]], list[asyncio.Future[Any]]]:
        """Produce the plan in decision order; returns the outbox records' acknowledgements
        and the others'.

        ``replies``: the replies ride the transaction too (only without a reply producer)."""
        topics, p = self.topics, self.partition
        outbox = [
            await self._produce(
                topics.outbox,
                encode_outbox_record(record),
                conversation_key(*conversation_of(record)),
                p,
            )
            for record in plan.outbox
        ]
        others = [
            await self._produce(
                topics.dispatch,
                encode_membership_record(member_slice),
                conversation_key(member_slice.tenant_id, member_slice.group_id),
                member_slice.partition,
            )
            for member_slice in plan.slices
        ]
        if replies:
            others.extend(await self._replies(plan, self._produce))
        return outbox, others

    async def _reply(self, plan: Plan) -> None:
        """The replies of a committed batch, in decision order, acknowledged before returning.

        Outside the transaction (issue 13): the transaction then touches the outbox partition,
        the member slices' shards and the offsets, not one ``qim.to-gateway`` partition per
        sender. A reply is sent only after its records are durable, so SEND_ACK still means a
        committed record, and a fenced writer (whose commit failed) never replies. A crash
        between the commit and the replies leaves the client to retry, which ClientDedup
        answers with the first acknowledgement (spec 8.3). The partition waits for the
        acknowledgements: handing them to a background task made its transactions longer, not
        its cycle shorter (bench/README.md round 5).
        """
        producer = self.reply_producer

        async def send(topic: str, value: bytes, key: bytes, partition: int) -> asyncio.Future[Any]:
            future: asyncio.Future[Any] = await producer.send(
                topic, value, key=key, partition=partition
            )
            future.add_done_callback(_retrieve)
            return future

        futures = await self._replies(plan, send)
        results = await asyncio.gather(*futures, return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:  # the records are committed: the client's retry gets the same answer
            log.warning("p%d: %d replies not delivered: %r", self.partition, len(failed), failed[0])

    async def flush_reactions(self, now_ms: int | None = None) -> int:
        """Push every ended ``reaction_push_merge_window`` (``qim.core.reactions.push``) to
        the conversation's members on their ConnectionShards, fire-and-forget like a reply;
        returns how many records went out."""
        producer, shard_of = self.reply_producer, self._connection_shard
        due = self.reaction_merge.due(_monotonic_ms() if now_ms is None else now_ms)
        if producer is None or shard_of is None or not due:
            return 0
        futures: list[asyncio.Future[Any]] = []
        for merged in due:
            record = merged.record
            users = self._recipients(record)
            for push in push_records(merged, users, functools.partial(shard_of, record.tenant_id)):
                if not 0 <= push.partition < self.topics.to_gateway_partitions:
                    continue
                future: asyncio.Future[Any] = await producer.send(
                    self.topics.to_gateway,
                    encode_reaction_push(push),
                    key=push.key,
                    partition=push.partition,
                )
                future.add_done_callback(_retrieve)
                futures.append(future)
        results = await asyncio.gather(*futures, return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:  # the aggregate is durable: a reader joins it with the message
            log.warning(
                "p%d: %d reaction pushes not delivered: %r", self.partition, len(failed), failed[0]
            )
        self.reaction_pushes += len(futures) - len(failed)
        return len(futures) - len(failed)

    def _recipients(self, record: MessageReacted) -> list[str]:
        """Who may see the message's reactions now: the participants of a one-to-one
        conversation, a group's ACTIVE members (the gateways keep those online)."""
        if record.conversation_kind == DIRECT:
            return list(record.participants)
        group = self.writer.membership.group(record.tenant_id, record.conversation_id)
        if group is None:
            return []
        return [user for user, row in group.rows.items() if row.active]

    async def _replies(
        self,
        plan: Plan,
        produce: Callable[[str, bytes, bytes, int], Any],
    ) -> list[asyncio.Future[Any]]:
        topics = self.topics
        futures: list[asyncio.Future[Any]] = []
        for reply in plan.replies:
            if not 0 <= reply.partition < topics.to_gateway_partitions:
                log.error("reply for connection_shard %d dropped: no such shard", reply.partition)
                continue
            value = encode_record(reply)
            futures.append(await produce(topics.to_gateway, value, reply.key, reply.partition))
        for admin in plan.admin_replies:
            value = encode_record(admin)
            futures.append(await produce(topics.admin_replies, value, admin.key, 0))
        for relay in plan.transient:  # 13.2: after the replies, never inside a cut batch's state
            if not 0 <= relay.partition < topics.to_gateway_partitions:
                log.error("transient relay for connection_shard %d dropped", relay.partition)
                continue
            value = encode_transient(relay)
            futures.append(await produce(topics.to_gateway, value, relay.key, relay.partition))
        return futures

    async def _produce(
        self, topic: str, value: bytes, key: bytes, partition: int
    ) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = await self.producer.send(
            topic, value, key=key, partition=partition
        )
        # when a later send fails first, this one's failure must not go unretrieved
        future.add_done_callback(_retrieve)
        return future

    def _checkpoint_due(self) -> bool:
        """Every ``checkpoint_every`` applied records, or after an interval with any."""
        debt = self.writer.debt
        if debt >= self.checkpoint_every:
            return True
        return debt > 0 and time.monotonic() - self.last_checkpoint >= self.checkpoint_interval_s

    async def _abort(self) -> None:
        try:
            await self.producer.abort_transaction()
        except Exception as exc:  # fenced or broken: the caller gives the partition up anyway
            log.info("p%d: abort after a failed transaction failed too: %r", self.partition, exc)

    async def close(self) -> None:
        """Stop the producer (an open transaction is aborted by the broker or the next owner)."""
        try:
            await self.producer.stop()
        except Exception as exc:
            log.info("p%d: producer stop: %r", self.partition, exc)
