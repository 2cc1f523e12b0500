"""Send-buffer bookkeeping, encode-once delivery, the node budget and the 24.1.6 names.

Spec: 11.3.1 (the pending real-time queue is dropped, stream 0 is not), 11.3.3 (largest
offender first), 10.3 / 26.3 (``body_encode_count`` == 1 per message per gateway, the same
shared bytes in every socket's frame), 24.1.6 / 24.1.5 (metric names verbatim).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import msgspec
from prometheus_client import CollectorRegistry, generate_latest

from qim.core.push import FlowState
from qim.gateway.push.delivery import deliver_push_batch
from qim.gateway.push.metrics import PushMetrics
from qim.gateway.transport.budget import NodeSendBudget
from qim.gateway.transport.outbound import OutboundQueue, PushTag
from qim.gateway.transport.sendbuf import InFlight, push_pieces
from qim.schemas.frames import (
    Frame,
    FrameDecoder,
    MailboxBatch,
    Pong,
    PushEvents,
    Role,
    SendAck,
    Stream,
    encode_fragments,
    encode_frame,
)
from qim.schemas.records.push import PushBatch, PushBody, PushRecipient
from tests.gateway_support import wait_until
from tests.unit.gateway.flow_support import live_connection, push
from tests.unit.gateway.session_support import T0

SPEC_24_1_6 = [
    "push_latency_p99", "push_e2e_latency_p99", "push_e2e_latency_cross_region_p99",
    "socket_send_queue_bytes_p99", "slow_connection_degraded_ratio",
    "slow_connection_closed_total", "mailbox_dirty_sent_total", "push_drop_by_priority_total",
    "push_batch_fanout_ratio",
]  # fmt: skip


def tag(priority: str = "direct") -> PushTag:
    return PushTag(100, 120, priority)  # type: ignore[arg-type]


def test_purge_drops_unstarted_push_frames_only() -> None:
    queue = OutboundQueue()
    ack = encode_frame(SendAck(client_message_id="m", message_id=b"\x01" * 16))
    started, waiting = tag(), tag("large_group")
    queue.push([b"a1", b"a2"], Stream.REALTIME, started)  # a 2-piece push frame
    queue.push([ack], Stream.REALTIME)  # SEND_ACK shares stream 1: never dropped
    queue.push([b"w"], Stream.REALTIME, waiting)
    queue.push([encode_frame(Pong(ping_id=1))], Stream.CONTROL)
    assert queue.pop() == encode_frame(Pong(ping_id=1))
    assert queue.pop_written(1) == [(b"a1", None)]  # the first piece is on the wire
    assert queue.queued_pushes == 2
    assert queue.purge_pushes() == [waiting]  # the started frame is never cut
    assert queue.pop_written(1 << 20) == [(b"a2", started), (ack, None)]
    assert queue.queued_pushes == 0 and queue.buffered_bytes == 0 and len(queue) == 0


def test_inflight_releases_a_frame_once_its_last_byte_left() -> None:
    inflight = InFlight()
    first, second = tag(), tag()
    inflight.wrote([(b"x" * 10, first), (b"y" * 5, None), (b"z" * 10, second)])
    assert inflight.measure(transport_buffered=25) == []
    assert inflight.measure(transport_buffered=16) == []  # 9 of first's 10 octets left
    assert inflight.measure(transport_buffered=15) == [first]
    assert inflight.buffered == 15
    assert inflight.measure(transport_buffered=0) == [second]
    assert len(inflight) == 0 and inflight.buffered == 0


def test_push_pieces_wrap_the_body_bytes_without_touching_them() -> None:
    events = PushEvents(last_pushed_user_seq=9)
    body = msgspec.msgpack.encode(MailboxBatch(covered_through_seq=1))  # never decoded here
    pieces = push_pieces(body, version=1, chunk_bytes=4, max_frame_bytes=1 << 20)
    assert len(pieces) == -(-len(body) // 4)
    assert b"".join(p[20:] for p in pieces) == body
    raw = msgspec.msgpack.encode(events)
    (frame,) = [f for f in map(FrameDecoder(Role.CLIENT).receive_message,
                               push_pieces(raw, version=1, chunk_bytes=64, max_frame_bytes=1 << 20))
                if isinstance(f, Frame)]  # fmt: skip
    assert frame.body == events and frame.header.stream_id == Stream.REALTIME
    assert encode_fragments(events, stream_id=Stream.REALTIME) == push_pieces(
        raw, version=1, chunk_bytes=64 * 1024, max_frame_bytes=1 << 20
    )  # byte-identical to a struct-encoded frame


@dataclass(frozen=True)
class Grant:
    tenant_id: str
    user_id: str
    device_id: str
    session_epoch: int


async def test_a_batch_body_is_encoded_once_and_shared_by_every_socket() -> None:
    registry, now = CollectorRegistry(), [T0]
    metrics = PushMetrics(registry, clock_ms=lambda: now[0])
    payload = b"shared-body-" * 50
    async with (
        live_connection("c1", high=1 << 20) as a,
        live_connection("c2", high=1 << 20) as b,
        live_connection("c3", high=1 << 20) as c,
    ):
        conns = {"c1": a.conn, "c2": b.conn, "c3": c.conn}
        live = {cid: Grant("t1", "u1", "d1", 7) for cid in conns}
        batch = PushBatch(
            tenant_id="t1", connection_shard=0, mailbox_shard=0, message_id=b"\x01" * 16,
            conversation_id="g:x", conversation_seq=3, last_activity_id=b"\x02" * 16,
            sender_id="s", created_at=T0 - 40, body_included=True,
            common_encoded_body=msgspec.msgpack.encode(PushBody(payload_or_ciphertext=payload)),
            recipients=tuple(
                PushRecipient(connection_id=cid, session_epoch=7, user_id="u1", device_id="d1",
                              mailbox_seq=10 + i, event_id=i)
                for i, cid in enumerate(conns)
            ),
        )  # fmt: skip
        expansion = deliver_push_batch(batch, live, conns, now[0], metrics)
        assert len(expansion.deliveries) == 3
        assert len({id(d.pending.common) for d in expansion.deliveries}) == 1
        assert metrics.body_encodes == 1  # 26.3: once per message per gateway
        for one in (a, b, c):
            await wait_until(lambda one=one: one.transport.buffered_bytes() > 0)  # type: ignore[misc]
            assert payload in bytes(one.transport.held)  # the shared bytes, as encoded
            one.transport.consume()
        seqs = sorted(
            e.mailbox_seq for one in (a, b, c) for f in one.transport.bodies()
            if isinstance(f, PushEvents) for e in f.events
        )  # fmt: skip
        assert seqs == [10, 11, 12]
    text = generate_latest(registry).decode()
    assert "body_encode_count 1.0" in text
    assert "push_batch_fanout_ratio 3.0" in text
    assert "push_e2e_latency_p99 0.05" in text  # 40 ms -> the 50 ms bucket


async def test_the_node_budget_degrades_the_largest_offender_first() -> None:
    """Each connection stays under its own soft watermark (40 KB); only the sum is too much."""
    now = [T0]
    budget = NodeSendBudget(50_000, lambda: now[0], min_interval_ms=0)
    async with (
        live_connection("big", budget=budget, high=2_000) as big,
        live_connection("small", budget=budget, high=2_000) as small,
    ):
        for seq in range(1, 21):  # ~22 KB of large-group pushes on "small"...
            small.conn.apply(small.conn.session.push(push(seq, 1_000, "large_group"), now[0]))
        for seq in range(1, 26):  # ...then ~38 KB on "big": the sum passes 50 KB
            big.conn.apply(big.conn.session.push(push(seq, 1_400, "large_group"), now[0]))
        await asyncio.sleep(0.01)
        assert big.conn.session.flow_state is FlowState.DEGRADED
        assert small.conn.session.flow_state is FlowState.NORMAL  # one shed was enough
        assert ("push_drop", "large_group") in big.hooks.counts
        assert ("push_drop", "large_group") not in small.hooks.counts
        assert ("flow", "DEGRADED") in big.hooks.counts
        assert budget.total <= 50_000


def test_the_24_1_6_names_are_exported_verbatim() -> None:
    registry = CollectorRegistry()
    PushMetrics(registry, clock_ms=lambda: T0, send_queues=lambda: [(10, False), (5, True)])
    text = generate_latest(registry).decode()
    for name in SPEC_24_1_6:
        assert f"# TYPE {name} " in text or f"# TYPE {name.removesuffix('_total')} " in text, name
    assert "cursor_advanced_by_push_total 0.0" in text  # 24.1.5: never moves
    assert "body_encode_count 0.0" in text
    assert "slow_connection_degraded_ratio 0.5" in text
