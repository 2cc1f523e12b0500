"""The gateway's request/reply path against the suite's real Kafka, without a ConversationWriter.

The test plays the writer: it reads what the gateway produced to ``qim.conversation-requests``
and answers with ``WriterReply`` records on ``qim.to-gateway`` at the user's ConnectionShard,
in Kafka transactions (committed and aborted) and without. Everything else is real: an
in-process ConnectionNode with ShardOwnership of the to-gateway topic (read_committed), the SDK
over WebSocket.

Spec: §5.3 (one ConnectionShard owner delivers), §15.2.2 (session_epoch decides), §20.1
(identity from the session), direction.md §3 (explicit partitions) and §4.6 (SEND_ACK =
durable: an aborted transaction's reply never reaches the client).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from qim.client import HeartbeatConfig, Identity, QimClient, QimError
from qim.core.conversation.ids import direct_conversation_id
from qim.devstack.stack import CONVERSATION_PARTITION_COUNT, Stack
from qim.params import Settings
from qim.schemas.frames import Error, ErrorCode, HistoryBatch, MemberListBatch, SendAck
from qim.schemas.records.requests import (
    ConversationRequest,
    CreateGroupRequest,
    LeaveGroupRequest,
    PullHistoryRequest,
    PullMembersRequest,
    SendRequest,
    WriterReply,
    conversation_partition,
    decode_conversation_request,
    encode_record,
)
from qim.streams.topics import CONVERSATION_REQUESTS, TO_GATEWAY
from qim.streams.transit import load_transit_sealer
from tests.gateway_support import Gateway, owning_gateway

pytestmark = pytest.mark.integration

TENANT = "t-route"
SETTINGS = Settings.load(
    overrides={"per_ip_connect_rate": {"count": 100_000, "period_ms": 1000}}, env={}
)
WAIT_S = 20.0

TRANSIT = load_transit_sealer()
"""Opens the gateway's hop seal on conversation requests (topology.md decision 44)."""


def uid(prefix: str = "u") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class Requests:
    """Reads qim.conversation-requests from the end at start: what the gateways produced."""

    def __init__(self, bootstrap: str) -> None:
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, isolation_level="read_committed"
        )
        self.seen: list[tuple[int, ConversationRequest]] = []

    async def start(self) -> None:
        await self.consumer.start()
        tps = [
            TopicPartition(CONVERSATION_REQUESTS.name, p)
            for p in range(CONVERSATION_PARTITION_COUNT)
        ]
        self.consumer.assign(tps)
        await self.consumer.seek_to_end(*tps)
        for tp in tps:
            await self.consumer.position(tp)

    async def next(self, match: Callable[[ConversationRequest], bool]) -> tuple[int, Any]:
        """The first (partition, request) that ``match`` accepts."""
        async with asyncio.timeout(WAIT_S):
            while True:
                for seen in self.seen:
                    if match(seen[1]):
                        self.seen.remove(seen)
                        return seen
                fetched = await self.consumer.getmany(timeout_ms=200)
                for tp, records in fetched.items():
                    for r in records:
                        self.seen.append(
                            (tp.partition, decode_conversation_request(TRANSIT.open(r.value)))
                        )


def reply_to(request: Any, **body: Any) -> WriterReply:
    """The WriterReply a writer would send for ``request`` (any kind)."""
    user = request.sender_id if isinstance(request, SendRequest) else request.user_id
    device = request.sender_device_id if isinstance(request, SendRequest) else request.device_id
    fields = {
        "tenant_id": request.tenant_id,
        "user_id": user,
        "device_id": device,
        "session_epoch": request.session_epoch,
        "connection_shard": request.connection_shard,
        "request_id": request.request_id,
    }
    return WriterReply(**(fields | body))


@pytest.fixture(scope="module")
async def requests(stack: Stack) -> AsyncIterator[Requests]:
    reader = Requests(stack.cfg.kafka.bootstrap)
    await reader.start()
    try:
        yield reader
    finally:
        await reader.consumer.stop()


@pytest.fixture(scope="module")
async def producer(stack: Stack) -> AsyncIterator[AIOKafkaProducer]:
    plain = AIOKafkaProducer(bootstrap_servers=stack.cfg.kafka.bootstrap, acks="all")
    await plain.start()
    try:
        yield plain
    finally:
        await plain.stop()


@contextlib.asynccontextmanager
async def gateway(stack: Stack, name: str) -> AsyncIterator[Gateway]:
    """A routing node owning every ConnectionShard through its own consumer group."""
    async with owning_gateway(
        stack.cfg.kafka.bootstrap,
        f"qim-gw-routing-{uid()}",
        f"ws://{name}",
        settings=SETTINGS,
        node_id=name,
        route_requests=True,
        conversation_partition_count=CONVERSATION_PARTITION_COUNT,
    ) as gw:
        yield gw


@pytest.fixture(scope="module")
async def gw(stack: Stack) -> AsyncIterator[Gateway]:
    async with gateway(stack, "gw-route-1") as node:
        yield node


@contextlib.asynccontextmanager
async def online(
    gw: Gateway, user: str, device: str = "phone", tenant: str = TENANT
) -> AsyncIterator[QimClient]:
    """An SDK client logged in over WebSocket (tokens of the node's in-process authenticator)."""
    client = QimClient(heartbeat=HeartbeatConfig(enabled=False), request_timeout=WAIT_S)
    async with client:
        await client.connect(gw.ws_url, await gw.token(user, device, tenant), device)
        yield client


async def send_to_gateway(producer: AIOKafkaProducer, reply: WriterReply) -> None:
    await producer.send_and_wait(
        TO_GATEWAY.name, encode_record(reply), key=reply.key, partition=reply.partition
    )


def by_cmid(cmid: str) -> Callable[[ConversationRequest], bool]:
    return lambda r: isinstance(r, SendRequest) and r.message.client_message_id == cmid


async def test_a_send_reaches_its_partition_and_a_plain_reply_reaches_the_sdk(
    gw: Gateway, requests: Requests, producer: AIOKafkaProducer
) -> None:
    alice, group = uid("alice"), f"g:{uid('team')}"
    async with online(gw, alice) as client:
        pending = asyncio.create_task(client.send_message(group, b"hi", client_message_id="c1"))
        partition, request = await requests.next(by_cmid("c1"))
        assert partition == conversation_partition(TENANT, group, CONVERSATION_PARTITION_COUNT)
        assert (request.tenant_id, request.sender_id, request.sender_device_id) == (
            TENANT,
            alice,
            "phone",
        )
        assert request.session_epoch == client.auth_ok.session_epoch  # type: ignore[union-attr]
        assert request.connection_shard == gw.node.logins.shard_of(TENANT, alice)
        ack = SendAck(client_message_id="c1", conversation_seq=1, message_id=b"\x01" * 16)
        await send_to_gateway(producer, reply_to(request, send_ack=ack))
        got = await pending
    assert got == SendAck(
        request_id=request.request_id,
        client_message_id="c1",
        conversation_seq=1,
        message_id=b"\x01" * 16,
    )


async def test_an_aborted_transactions_reply_never_reaches_the_client(
    stack: Stack, gw: Gateway, requests: Requests
) -> None:
    """read_committed: the aborted SEND_ACK (seq 666) is invisible, the committed one wins."""
    txn = AIOKafkaProducer(
        bootstrap_servers=stack.cfg.kafka.bootstrap, transactional_id=f"test-writer-{uid()}"
    )
    await txn.start()
    try:
        async with online(gw, uid("alice")) as client:
            pending = asyncio.create_task(
                client.send_message("g:txn", b"x", client_message_id="c-txn")
            )
            _, request = await requests.next(by_cmid("c-txn"))
            aborted = reply_to(
                request, send_ack=SendAck(client_message_id="c-txn", conversation_seq=666)
            )
            await txn.begin_transaction()
            await send_to_gateway(txn, aborted)
            await txn.abort_transaction()
            committed = reply_to(
                request, send_ack=SendAck(client_message_id="c-txn", conversation_seq=7)
            )
            async with txn.transaction():
                await send_to_gateway(txn, committed)
            got = await pending
    finally:
        await txn.stop()
    assert got.conversation_seq == 7


async def test_a_reply_to_an_older_session_epoch_is_dropped(
    gw: Gateway, requests: Requests, producer: AIOKafkaProducer
) -> None:
    async with online(gw, uid("alice")) as client:
        pending = asyncio.create_task(client.send_message("g:ep", b"x", client_message_id="c-ep"))
        _, request = await requests.next(by_cmid("c-ep"))
        stale = reply_to(request, send_ack=SendAck(client_message_id="c-ep", conversation_seq=1))
        stale = WriterReply(**{**_fields(stale), "session_epoch": request.session_epoch - 1})
        await send_to_gateway(producer, stale)
        good = reply_to(request, send_ack=SendAck(client_message_id="c-ep", conversation_seq=2))
        await send_to_gateway(producer, good)
        assert (await pending).conversation_seq == 2


def _fields(reply: WriterReply) -> dict[str, Any]:
    return {f: getattr(reply, f) for f in reply.__struct_fields__}


async def test_errors_reads_and_group_frames_round_trip(
    gw: Gateway, requests: Requests, producer: AIOKafkaProducer
) -> None:
    user, group = uid("bob"), f"g:{uid('club')}"
    async with online(gw, user) as client:
        calls = {
            CreateGroupRequest: client.create_group(group, ("carol",)),
            PullMembersRequest: client.pull_members(group),
            PullHistoryRequest: client.pull_history(group, limit=5),
            LeaveGroupRequest: client.leave_group(group),
        }
        for envelope, call in calls.items():
            pending = asyncio.ensure_future(call)
            partition, request = await requests.next(
                lambda r, e=envelope: isinstance(r, e) and r.user_id == user  # type: ignore[misc]
            )
            assert partition == conversation_partition(TENANT, group, CONVERSATION_PARTITION_COUNT)
            body: dict[str, Any] = (
                {"history": HistoryBatch(latest_conversation_seq=3)}
                if envelope is PullHistoryRequest
                else {"members": MemberListBatch(total_hint=2)}
            )
            await send_to_gateway(producer, reply_to(request, **body))
            got = await pending
            assert got == next(iter(body.values()))
        pending = asyncio.ensure_future(client.send_message(group, b"x", client_message_id="c-no"))
        _, request = await requests.next(by_cmid("c-no"))
        denied = Error(code=int(ErrorCode.PERMISSION_DENIED))
        await send_to_gateway(producer, reply_to(request, error=denied))
        with pytest.raises(QimError) as info:
            await pending
        assert info.value.code is ErrorCode.PERMISSION_DENIED


async def test_a_malformed_conversation_id_is_denied_at_the_gateway(gw: Gateway) -> None:
    async with online(gw, uid("eve")) as client:
        with pytest.raises(QimError) as info:
            await client.send_message("not-a-conversation", b"x")
    assert info.value.code is ErrorCode.PERMISSION_DENIED


async def test_one_conversation_lands_on_one_partition_from_two_gateways(
    stack: Stack, gw: Gateway, requests: Requests, producer: AIOKafkaProducer
) -> None:
    """Two gateways, two users, one direct conversation: one partition, one writer (§6.3)."""
    alice, bob = uid("alice"), uid("bob")
    conversation = direct_conversation_id(TENANT, alice, bob)
    async with gateway(stack, "gw-route-2") as gw2, online(gw, alice) as a, online(gw2, bob) as b:
        a.identity, b.identity = Identity(TENANT, alice), Identity(TENANT, bob)
        sends = [
            asyncio.ensure_future(a.send_direct(bob, b"1", client_message_id="d-a")),
            asyncio.ensure_future(b.send_direct(alice, b"2", client_message_id="d-b")),
        ]
        got = [await requests.next(by_cmid(c)) for c in ("d-a", "d-b")]
        for _, request in got:
            ack = SendAck(client_message_id=request.message.client_message_id)
            await send_to_gateway(producer, reply_to(request, send_ack=ack))
        await asyncio.gather(*sends)
    (pa, ra), (pb, rb) = got
    assert pa == pb == conversation_partition(TENANT, conversation, CONVERSATION_PARTITION_COUNT)
    assert ra.message.conversation_id == rb.message.conversation_id == conversation
    assert (ra.peer_user_id, rb.peer_user_id) == (bob, alice)
