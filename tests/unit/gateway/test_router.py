"""ConversationRouter inside a real ConnectionNode, with an in-memory producer and transport.

Invariants: a request leaves through the producer at its conversation's partition without the
connection waiting on Kafka (other frames are answered meanwhile); a produce failure or a full
queue answers ERROR{RATE_LIMITED, retry_after_ms} (26.8 "senders get RATE_LIMITED or queue";
REGION_FAILOVER is a Home Region switch, A.6 #7), the hint measured from the queue's drain rate
when there is one, and a delivery that left the producer unusable is sent again by its
replacement instead of reaching the client (issue 15); a reply reaches only
the connection whose session_epoch it names (§15.2.2); unknown record kinds are counted, never
fatal (§27.2.1).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from aiokafka.errors import OutOfOrderSequenceNumber

from qim.gateway.auth_memory import MemoryAuthenticator
from qim.gateway.config import GatewayConfig
from qim.gateway.node import ConnectionNode, wall_clock_ms
from qim.gateway.presence_writer import MemoryPresence
from qim.gateway.routing.forwarder import RequestForwarder, RequestProducer
from qim.gateway.routing.replies import ReplyVerdict
from qim.gateway.routing.router import ConversationRouter
from qim.gateway.transport.connection import Connection
from qim.params import Settings
from qim.schemas.frames import (
    Auth,
    AuthOk,
    Body,
    Error,
    ErrorCode,
    Frame,
    FrameDecoder,
    MemberListBatch,
    Ping,
    Pong,
    PullMembers,
    Role,
    SendAck,
    SendMessage,
    encode_frame,
)
from qim.schemas.records.requests import (
    SendRequest,
    WriterReply,
    conversation_partition,
    decode_conversation_request,
    encode_record,
)
from qim.streams.producer import RecoveringProducer
from qim.streams.topics import PUSH_TASKS, TO_GATEWAY
from tests.gateway_support import wait_until

COUNT = 16


@dataclass
class FakeProducer:
    """Records sends; ``fail`` fails every delivery, ``gate`` holds ``send`` until set."""

    partitions: int = COUNT
    fail: BaseException | None = None
    gate: asyncio.Event | None = None
    hold_acks: bool = False
    sent: list[tuple[str, bytes, bytes, int]] = field(default_factory=list)
    acks: list[asyncio.Future[Any]] = field(default_factory=list)

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def flush(self) -> None:
        pass

    async def partitions_for(self, topic: str) -> set[int]:
        if topic == TO_GATEWAY.name:  # RTC's server cancels (13.5.3) go there too
            return set(range(int(Settings.load(env={}).connection_shard_count)))
        if topic == PUSH_TASKS.name:  # RTC: an offline callee's VoIP PushTask (13.5.2)
            return set(range(int(Settings.load(env={}).mailbox_shard_count)))
        return set(range(self.partitions))

    async def send(
        self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int = 0
    ) -> asyncio.Future[Any]:
        if self.gate is not None:
            await self.gate.wait()
        assert value is not None and key is not None
        self.sent.append((topic, key, value, partition))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.fail is not None:
            future.set_exception(self.fail)
        elif not self.hold_acks:
            future.set_result(None)
        self.acks.append(future)
        return future


class Pipe:
    """A WebSocket-like transport: each piece is one message, decoded as the client would."""

    def __init__(self) -> None:
        self.decoder = FrameDecoder(Role.CLIENT)
        self.frames: list[Frame] = []

    async def send(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            frame = self.decoder.receive_message(piece)
            if isinstance(frame, Frame):
                self.frames.append(frame)

    def buffered_bytes(self) -> int:
        return 0  # everything "sent" reached the client at once

    async def close(self) -> None:
        pass

    def bodies(self) -> list[Body]:
        return [f.body for f in self.frames]


@dataclass
class Harness:
    node: ConnectionNode
    auth: MemoryAuthenticator
    producer: FakeProducer
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def router(self) -> ConversationRouter:
        assert self.node.router is not None
        return self.node.router

    async def online(self, user: str = "alice", device: str = "phone") -> tuple[Connection, Pipe]:
        pipe = Pipe()
        conn = self.node.attach(pipe, "192.0.2.1")
        closed = asyncio.Event()

        async def read(c: Connection) -> None:
            await closed.wait()

        self.tasks.append(asyncio.create_task(conn.run(read)))
        token = self.auth.issue_token("t1", user, device, now_ms=wall_clock_ms(), ttl_ms=60_000)
        conn.feed_message(encode_frame(Auth(access_token=token, device_id=device), 1))
        await wait_until(lambda: any(isinstance(b, AuthOk) for b in pipe.bodies()))
        return conn, pipe


@asynccontextmanager
async def harness(
    producer: FakeProducer | None = None,
    *,
    request_producer: RequestProducer | None = None,
    **config: Any,
) -> AsyncIterator[Harness]:
    """``request_producer`` (default: ``producer``) is what the node produces through."""
    producer = producer or FakeProducer()
    auth = MemoryAuthenticator()
    cfg = GatewayConfig(
        node_id="gw-unit",
        ws_port=None,
        kafka_bootstrap="127.0.0.1:9",  # never dialled: the producer is a double
        route_requests=True,
        settings=Settings.load(env={}),
        **config,
    )
    node = ConnectionNode(
        cfg, auth, presence=MemoryPresence(), request_producer=request_producer or producer
    )
    await node.start()
    h = Harness(node, auth, producer)
    try:
        yield h
    finally:
        await node.stop()
        for task in h.tasks:
            task.cancel()
        await asyncio.gather(*h.tasks, return_exceptions=True)


def ack_for(request: SendRequest, **overrides: Any) -> WriterReply:
    fields: dict[str, Any] = {
        "tenant_id": request.tenant_id,
        "user_id": request.sender_id,
        "device_id": request.sender_device_id,
        "session_epoch": request.session_epoch,
        "connection_shard": request.connection_shard,
        "request_id": request.request_id,
        "send_ack": SendAck(client_message_id=request.message.client_message_id),
    }
    fields.update(overrides)
    return WriterReply(**fields)


def sample(node: ConnectionNode, name: str, **labels: str) -> float:
    value = node.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_a_send_is_produced_at_its_partition_and_the_ack_comes_back() -> None:
    async with harness() as h:
        conn, pipe = await h.online()
        message = SendMessage(client_message_id="m1", conversation_id="g:team", payload=b"x")
        conn.feed_message(encode_frame(message, 5))
        await wait_until(lambda: len(h.producer.sent) == 1)
        topic, key, value, partition = h.producer.sent[0]
        request = decode_conversation_request(value)
        assert topic == "qim.conversation-requests" and isinstance(request, SendRequest)
        assert partition == conversation_partition("t1", "g:team", COUNT) and key == request.key
        assert (request.sender_id, request.request_id) == ("alice", 5)
        assert request.connection_shard == h.node.logins.shard_of("t1", "alice")
        await wait_until(
            lambda: sample(h.node, "qim_gateway_requests_forwarded_total", kind="send") == 1
        )
        assert h.router.deliver(encode_record(ack_for(request))) is ReplyVerdict.DELIVER
        await wait_until(lambda: any(isinstance(b, SendAck) for b in pipe.bodies()))
        frame = pipe.frames[-1]
        assert frame.header.request_id == 5 and frame.body == SendAck(
            request_id=5, client_message_id="m1"
        )
        assert sample(h.node, "send_to_ack_latency_seconds_count") == 1
        assert h.router.in_flight == 0


async def test_the_connection_keeps_answering_while_kafka_has_not_acknowledged() -> None:
    async with harness(FakeProducer(hold_acks=True)) as h:
        conn, pipe = await h.online()
        for i in range(3):
            conn.feed_message(
                encode_frame(SendMessage(client_message_id=f"m{i}", conversation_id="g:a"), 10 + i)
            )
        conn.feed_message(encode_frame(Ping(ping_id=1, client_time=1), 20))
        await wait_until(lambda: any(isinstance(b, Pong) for b in pipe.bodies()))
        await wait_until(lambda: len(h.producer.sent) == 3)  # all handed over, none awaited
        assert not any(f.done() for f in h.producer.acks)
        assert h.router.in_flight == 3


async def test_a_produce_failure_answers_rate_limited_with_the_configured_retry_after() -> None:
    async with harness(FakeProducer(fail=ConnectionError("broker down"))) as h:
        conn, pipe = await h.online()
        conn.feed_message(
            encode_frame(SendMessage(client_message_id="m", conversation_id="g:a"), 7)
        )
        await wait_until(lambda: any(isinstance(b, Error) for b in pipe.bodies()))
        error = pipe.bodies()[-1]
        assert isinstance(error, Error) and error.code == int(ErrorCode.RATE_LIMITED)
        assert error.detail == "commit log temporarily unavailable"
        assert error.request_id == 7 and pipe.frames[-1].header.request_id == 7
        # no drain rate can be measured: region_failover_retry_after_ms (2000) ±30 %
        assert error.retry_after_ms is not None and 1400 <= error.retry_after_ms <= 2600
        assert sample(h.node, "send_reject_total", code="RATE_LIMITED") == 1
        assert sample(h.node, "qim_gateway_requests_failed_total", kind="send", reason="kafka") == 1


async def test_a_full_queue_refuses_at_once_with_rate_limited_instead_of_growing() -> None:
    gate = asyncio.Event()
    async with harness(FakeProducer(gate=gate), max_queued_requests=1) as h:
        conn, pipe = await h.online()

        def send(request_id: int) -> None:
            body = SendMessage(client_message_id=f"m{request_id}", conversation_id="g:a")
            conn.feed_message(encode_frame(body, request_id))

        send(1)  # taken by the sender, which is held inside producer.send()
        await wait_until(lambda: h.router.forwarder.queued == 0 and h.router.in_flight == 1)
        send(2)  # waits in the queue (max_queued_requests=1)
        send(3)  # refused at once
        await wait_until(lambda: any(isinstance(b, Error) for b in pipe.bodies()))
        (error,) = [f for f in pipe.frames if isinstance(f.body, Error)]
        assert error.header.request_id == 3
        assert isinstance(error.body, Error) and error.body.code == int(ErrorCode.RATE_LIMITED)
        assert error.body.detail == "gateway request queue full"
        assert error.body.retry_after_ms is not None and error.body.retry_after_ms > 0
        gate.set()
        await wait_until(lambda: len(h.producer.sent) == 2)


async def test_a_malformed_id_is_denied_without_producing() -> None:
    async with harness() as h:
        conn, pipe = await h.online()
        conn.feed_message(encode_frame(SendMessage(client_message_id="m", conversation_id="c"), 4))
        await wait_until(lambda: any(isinstance(b, Error) for b in pipe.bodies()))
        assert pipe.bodies()[-1] == Error(code=int(ErrorCode.PERMISSION_DENIED), request_id=4)
        assert h.producer.sent == []
        assert sample(h.node, "send_reject_total", code="PERMISSION_DENIED") == 1


async def test_replies_reach_only_the_session_they_name() -> None:
    async with harness() as h:
        phone, phone_pipe = await h.online("alice", "phone")
        laptop, laptop_pipe = await h.online("alice", "laptop")
        phone.feed_message(encode_frame(PullMembers(conversation_id="g:team"), 8))
        await wait_until(lambda: len(h.producer.sent) == 1)
        grant = phone.session.grant
        assert grant is not None
        base = {
            "tenant_id": "t1",
            "user_id": "alice",
            "device_id": "phone",
            "connection_shard": h.node.logins.shard_of("t1", "alice"),
            "request_id": 8,
            "members": MemberListBatch(total_hint=3),
        }
        stale = WriterReply(session_epoch=grant.session_epoch - 1, **base)  # type: ignore[arg-type]
        assert h.router.deliver(encode_record(stale)) is ReplyVerdict.STALE_EPOCH
        current = WriterReply(session_epoch=grant.session_epoch, **base)  # type: ignore[arg-type]
        assert h.router.deliver(encode_record(current)) is ReplyVerdict.DELIVER
        await wait_until(lambda: any(isinstance(b, MemberListBatch) for b in phone_pipe.bodies()))
        assert [b for b in phone_pipe.bodies() if isinstance(b, MemberListBatch)] == [
            MemberListBatch(total_hint=3)
        ]
        assert not any(isinstance(b, MemberListBatch) for b in laptop_pipe.bodies())
        result = {"kind": "reply", "result": "stale_session_epoch"}
        assert sample(h.node, "qim_gateway_to_gateway_records_total", **result) == 1
        del laptop


async def test_unknown_record_kinds_are_counted_and_the_stream_goes_on() -> None:
    import msgspec

    async with harness() as h:
        other = msgspec.msgpack.encode({"kind": "room_batch", "events": []})
        assert h.router.deliver(other) is ReplyVerdict.UNKNOWN_KIND
        assert h.router.deliver(b"garbage") is ReplyVerdict.MALFORMED
        assert h.router.deliver(None) is ReplyVerdict.MALFORMED
        broken_push = msgspec.msgpack.encode({"kind": "push_batch", "events": []})
        assert h.router.deliver(broken_push) is ReplyVerdict.MALFORMED
        labels = {"kind": "room_batch", "result": "unknown_kind"}
        assert sample(h.node, "qim_gateway_to_gateway_records_total", **labels) == 1
        labels = {"kind": "push_batch", "result": "malformed"}
        assert sample(h.node, "qim_gateway_to_gateway_records_total", **labels) == 1


async def test_the_forwarders_drain_hint_is_the_queue_over_the_measured_hand_over_rate() -> None:
    gate = asyncio.Event()
    gate.set()
    producer = FakeProducer(gate=gate)
    now = [100.0]
    forwarder = RequestForwarder(producer, "requests", COUNT, max_queued=100, clock=lambda: now[0])
    await forwarder.start()
    try:
        assert forwarder.drain_ms() is None  # nothing handed over yet: no rate, no promise
        outcomes: list[BaseException | None] = []
        routed = SimpleNamespace(key=b"k", value=b"v", partition=0)
        for _ in range(50):
            assert forwarder.submit(routed, outcomes.append)
        await wait_until(lambda: len(outcomes) == 50)
        gate.clear()  # Kafka stops taking records; ten more wait in the queue
        for _ in range(11):
            assert forwarder.submit(routed, outcomes.append)
        await wait_until(lambda: forwarder.queued == 10)
        hint = forwarder.drain_ms()
        # 50 hand-overs within the last second (the 51st is held in send): (10 + 1) / 50 per s
        assert hint == math.ceil(1000 * 11 / 50)
        now[0] += 1.5  # a second and a half without a hand-over: no rate to promise
        assert forwarder.drain_ms() is None
    finally:
        gate.set()
        await forwarder.stop()


async def test_a_send_that_broke_the_producer_is_sent_again_and_acked_without_an_error() -> None:
    """Issue 15: the delivery that shows an idempotent producer's sequence gap does not reach
    the client; the replaced producer sends the same request again and the SEND_ACK follows."""
    made: list[FakeProducer] = []

    def factory() -> FakeProducer:
        made.append(FakeProducer(fail=OutOfOrderSequenceNumber() if not made else None))
        return made[-1]

    recovering = RecoveringProducer(
        factory, name="requests", idempotent=True, resend=True, backoff_s=(0.001, 0.01)
    )
    async with harness(request_producer=recovering) as h:
        conn, pipe = await h.online()
        conn.feed_message(
            encode_frame(SendMessage(client_message_id="m", conversation_id="g:a"), 7)
        )
        await wait_until(
            lambda: sample(h.node, "qim_gateway_requests_forwarded_total", kind="send") == 1
        )
        assert len(made) == 2 and recovering.replacements == 1
        assert [v for _, _, v, _ in made[0].sent] == [v for _, _, v, _ in made[1].sent]
        assert not any(isinstance(b, Error) for b in pipe.bodies())
        request = decode_conversation_request(made[1].sent[0][2])
        assert isinstance(request, SendRequest)
        assert h.router.deliver(encode_record(ack_for(request))) is ReplyVerdict.DELIVER
        await wait_until(lambda: any(isinstance(b, SendAck) for b in pipe.bodies()))
        assert sample(h.node, "qim_gateway_requests_failed_total", kind="send", reason="kafka") == 0
