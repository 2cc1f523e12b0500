"""Test harness of the ConversationWriter: request envelopes in, replies and the outbox out.

Requests are produced straight to ``qim.conversation-requests`` at ``conversation_partition``,
the way the gateway does; replies are read from ``qim.to-gateway`` with a read_committed
consumer (what a gateway sees), from the end offsets at harness start. The workers serving
them are in ``writer_workers``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from qim.core.conversation import direct_conversation_id
from qim.gateway.routing.replies import record_kind
from qim.schemas.frames import CreateGroup, LeaveGroup, PullHistory, PullMembers, SendMessage
from qim.schemas.frames.history import HistoryMessage
from qim.schemas.records import (
    AdminGroupRequest,
    AmendRequest,
    ConversationRequest,
    CreateGroupRequest,
    LeaveGroupRequest,
    MembershipCommitted,
    OutboxRecord,
    PullHistoryRequest,
    PullMembersRequest,
    PullReactionsRequest,
    ReactRequest,
    RtcSignalRequest,
    SendRequest,
    TypingRequest,
    WriterReply,
    conversation_partition,
    decode_outbox_record,
    decode_writer_reply,
    encode_record,
)
from qim.streams.topics import CONVERSATION_REQUESTS, OUTBOX, TO_GATEWAY
from qim.streams.transit import load_transit_sealer

TIMEOUT = 60.0
BULK_TENANT = "bulk"
"""A tenant whose admission limits the workers raise (QIM_TENANT_OVERRIDES): load tests."""

_request_ids = itertools.count(1)

TRANSIT = load_transit_sealer()
"""Opens to-gateway values sealed for the gateway hop (topology.md decision 44)."""


def shard_of(user_id: str) -> int:
    """A ConnectionShard per test user (any of the 256 partitions will do)."""
    return sum(user_id.encode()) % 256


def send(
    tenant: str, user: str, conversation_id: str, cmid: str, payload: bytes = b"hi", peer: str = ""
) -> SendRequest:
    rid = next(_request_ids)
    return SendRequest(
        tenant_id=tenant,
        sender_id=user,
        sender_device_id="dev",
        session_epoch=1,
        connection_shard=shard_of(user),
        request_id=rid,
        message=SendMessage(
            request_id=rid,
            client_message_id=cmid,
            conversation_id=conversation_id,
            message_type=1,
            payload=payload,
            peer_user_id=peer,
        ),
        peer_user_id=peer,
    )


def direct(tenant: str, user: str, peer: str, cmid: str, payload: bytes = b"hi") -> SendRequest:
    conversation_id = direct_conversation_id(tenant, user, peer)
    return send(tenant, user, conversation_id, cmid, payload, peer=peer)


def _session(tenant: str, user: str) -> dict[str, Any]:
    return {
        "tenant_id": tenant,
        "user_id": user,
        "device_id": "dev",
        "session_epoch": 1,
        "connection_shard": shard_of(user),
        "request_id": next(_request_ids),
    }


def create_group(
    tenant: str, user: str, group_id: str, members: Iterable[str]
) -> ConversationRequest:
    message = CreateGroup(group_id=group_id, member_ids=tuple(members))
    return CreateGroupRequest(**_session(tenant, user), message=message)


def leave_group(tenant: str, user: str, group_id: str) -> ConversationRequest:
    return LeaveGroupRequest(**_session(tenant, user), message=LeaveGroup(group_id=group_id))


def pull_history(
    tenant: str, user: str, conversation_id: str, *, direction: str = "newer", anchor: int = 0
) -> ConversationRequest:
    message = PullHistory(
        conversation_id=conversation_id,
        direction=direction,
        anchor_conversation_seq=anchor,
        limit=200,
    )
    return PullHistoryRequest(**_session(tenant, user), message=message)


def pull_members(tenant: str, user: str, conversation_id: str) -> ConversationRequest:
    message = PullMembers(conversation_id=conversation_id)
    return PullMembersRequest(**_session(tenant, user), message=message)


def reply_key(request: ConversationRequest) -> tuple[str, str, int]:
    if isinstance(request, SendRequest):
        return request.tenant_id, request.sender_id, request.request_id
    assert not isinstance(request, AdminGroupRequest)
    return request.tenant_id, request.user_id, request.request_id


class Client:
    """Produces requests and collects every committed reply (async context manager)."""

    def __init__(self, bootstrap: str, partitions: int = 16) -> None:
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.replies: dict[tuple[str, str, int], list[WriterReply]] = defaultdict(list)
        self._arrived = asyncio.Event()
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False
        )
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Client:
        await self._producer.start()
        await self._consumer.start()
        tps = [TopicPartition(TO_GATEWAY.name, p) for p in range(256)]
        self._consumer.assign(tps)
        for tp, end in (await self._consumer.end_offsets(tps)).items():
            self._consumer.seek(tp, end)
        self._task = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._consumer.stop()
        await self._producer.stop()

    async def _read(self) -> None:
        while True:
            fetched = await self._consumer.getmany(timeout_ms=200)
            for records in fetched.values():
                for record in records:
                    value = TRANSIT.open(record.value)  # the writer's hop seal (decision 44)
                    if record_kind(value) != "reply":
                        continue  # a PushBatch or ReactionPush shares the topic
                    reply = decode_writer_reply(value)
                    self.replies[(reply.tenant_id, reply.user_id, reply.request_id)].append(reply)
            if fetched:
                self._arrived.set()

    async def send(self, requests: Sequence[ConversationRequest]) -> None:
        futures = []
        for request in requests:
            tenant, conversation = _conversation(request)
            partition = conversation_partition(tenant, conversation, self.partitions)
            value = encode_record(request)
            futures.append(
                await self._producer.send(
                    CONVERSATION_REQUESTS.name, value, key=request.key, partition=partition
                )
            )
        await asyncio.gather(*futures)

    async def wait(
        self, requests: Sequence[ConversationRequest], within: float = TIMEOUT
    ) -> list[WriterReply]:
        """The first reply of each request, in request order."""
        keys = [reply_key(r) for r in requests]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while not all(self.replies.get(k) for k in keys):
            missing = sum(1 for k in keys if not self.replies.get(k))
            assert loop.time() < deadline, f"{missing} of {len(keys)} replies missing"
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), 0.5)
        return [self.replies[k][0] for k in keys]

    async def call(self, request: ConversationRequest, within: float = TIMEOUT) -> WriterReply:
        await self.send([request])
        return (await self.wait([request], within))[0]

    async def history(self, tenant: str, user: str, conversation_id: str) -> list[HistoryMessage]:
        """Every visible message, paging ``newer`` from the start."""
        out: list[HistoryMessage] = []
        anchor = 0
        while True:
            reply = await self.call(pull_history(tenant, user, conversation_id, anchor=anchor))
            assert reply.history is not None, reply
            out.extend(reply.history.messages)
            if not reply.history.has_more:
                return out
            anchor = out[-1].conversation_seq


def _conversation(request: ConversationRequest) -> tuple[str, str]:
    if isinstance(
        request, SendRequest | PullHistoryRequest | PullMembersRequest | RtcSignalRequest
    ):
        return request.tenant_id, request.message.conversation_id
    if isinstance(request, CreateGroupRequest | LeaveGroupRequest):
        return request.tenant_id, request.message.group_id
    if isinstance(request, AmendRequest | ReactRequest | PullReactionsRequest | TypingRequest):
        return request.tenant_id, request.conversation_id
    return request.tenant_id, request.group_id


async def read_outbox(
    bootstrap: str,
    tenant: str,
    conversation_id: str,
    *,
    committed: bool = True,
    topic: str = OUTBOX.name,
    partitions: int = 16,
) -> list[OutboxRecord]:
    """The outbox records of one conversation, read_committed (or read_uncommitted)."""
    partition = conversation_partition(tenant, conversation_id, partitions)
    tp = TopicPartition(topic, partition)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed" if committed else "read_uncommitted",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        begin = (await consumer.beginning_offsets([tp]))[tp]
        end = await _settled_end(bootstrap, consumer, tp) if committed else None
        if end is None:
            end = (await consumer.end_offsets([tp]))[tp]
        consumer.seek(tp, begin)
        out: list[Any] = []
        while await consumer.position(tp) < end:
            fetched = await consumer.getmany(tp, timeout_ms=500)
            out.extend(m for m in fetched.get(tp, ()) if m.offset < end)
    finally:
        await consumer.stop()
    records = [decode_outbox_record(m.value) for m in out]
    return [r for r in records if _conversation_of(r) == (tenant, conversation_id)]


async def _settled_end(
    bootstrap: str, consumer: AIOKafkaConsumer, tp: TopicPartition, *, within_s: float = 30.0
) -> int:
    """The read_committed end once it reached the log's end as of now.

    A transaction's commit returns to the writer (and so a SEND_ACK goes out) once the
    coordinator logged the decision; the commit markers reach the partitions after that. Until
    they do, the last stable offset stays below the acked records, so a read right after an ack
    would miss them: wait for the stable end to pass the high watermark read first.
    """
    probe = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await probe.start()
    try:
        high = int((await probe.end_offsets([tp]))[tp])
    finally:
        await probe.stop()
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        stable = int((await consumer.end_offsets([tp]))[tp])
        if stable >= high or asyncio.get_running_loop().time() >= deadline:
            return stable
        await asyncio.sleep(0.05)


def _conversation_of(record: OutboxRecord) -> tuple[str, str]:
    if isinstance(record, MembershipCommitted):
        return record.tenant_id, record.group_id
    return record.tenant_id, record.conversation_id
