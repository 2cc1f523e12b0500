"""Flow control on a live Connection (spec 11.3.1, 26 #30-#32, I-24, I-25).

Invariants: a PUSH_EVENTS stays on the ledger until its bytes have left the transport (a
client that stops reading is seen); NORMAL -> DEGRADED at the soft watermark, back to NORMAL
only at or below low (not just below soft); DEGRADED drops the queued push frames, signals
MAILBOX_DIRTY once and writes no push; stream 0 (PONG) still goes out; the hard watermark and
``idle_timeout`` without consumption close the connection as a slow consumer.
"""

from __future__ import annotations

import asyncio

from qim.core.push import FlowState
from qim.gateway.actions import CloseReason, Send
from qim.schemas.frames import Error, ErrorCode, Ping, Pong, PushEvents, SendAck
from qim.schemas.frames.history import BadgeUpdate, SessionDelta
from tests.gateway_support import wait_until
from tests.unit.gateway.flow_support import LIMITS, Live, live_connection, push
from tests.unit.gateway.session_support import wire


def level(live: Live) -> tuple[int, int]:
    pushes = live.conn.session.pushes
    assert pushes is not None
    return pushes.level


def state(live: Live) -> FlowState | None:
    return live.conn.session.flow_state


def offer(live: Live, seq: int, payload: int = 1_000) -> None:
    live.conn.apply(live.conn.session.push(push(seq, payload), live.clock[0]))


def pushed_seqs(live: Live) -> list[int]:
    return [e.mailbox_seq for b in live.transport.bodies() if isinstance(b, PushEvents)
            for e in b.events]  # fmt: skip


async def settle() -> None:
    for _ in range(20):  # let the writer run its loop a few times
        await asyncio.sleep(0.005)


async def test_a_push_counts_until_its_bytes_left_the_transport() -> None:
    async with live_connection(high=1 << 20) as live:
        for seq in range(1, 6):
            offer(live, seq)
        await wait_until(lambda: live.conn.outbound.push_tags() == [])
        await settle()
        charged = sum(push(s).ledger_bytes for s in range(1, 6))
        assert level(live) == (charged, 5)  # written to the transport is not sent
        assert live.hooks.pushed_seqs == []  # and is no PUSHED evidence either (16.1.2)
        live.transport.consume(live.transport.buffered_bytes() // 2)
        await wait_until(lambda: 0 < level(live)[1] < 5)
        live.transport.consume()
        await wait_until(lambda: level(live) == (0, 0))
        assert pushed_seqs(live) == [1, 2, 3, 4, 5]
        assert live.hooks.pushed_seqs[-1] == 5 and live.hooks.pushed_seqs[0] < 5
        assert state(live) is FlowState.NORMAL


async def test_degraded_at_soft_stays_above_low_and_recovers_at_low() -> None:
    """26 #30 scaled: a buffer that holds everything (like a big kernel buffer)."""
    async with live_connection(high=1 << 20) as live:
        seq = 0
        while state(live) is FlowState.NORMAL:
            seq += 1
            offer(live, seq)
            await wait_until(lambda: live.conn.outbound.push_tags() == [])  # in the transport
            assert seq < 100
        # the push that reached soft was still queued: the degradation dropped it
        assert LIMITS.soft.bytes - push(seq).ledger_bytes <= level(live)[0] < LIMITS.soft.bytes
        assert ("mailbox_dirty_sent", "error") in live.hooks.counts
        assert ("flow", "DEGRADED") in live.hooks.counts
        offer(live, seq + 1)  # DEGRADED writes no push
        await settle()
        written = level(live)
        # drain to between low and soft: still DEGRADED (below soft is not enough)
        held = live.transport.buffered_bytes()
        live.transport.consume(held - (LIMITS.soft.bytes + LIMITS.low_bytes) // 2)
        await wait_until(lambda: level(live)[0] < written[0])
        await settle()
        assert LIMITS.low_bytes < level(live)[0] < LIMITS.soft.bytes
        assert state(live) is FlowState.DEGRADED
        live.transport.consume()
        await wait_until(lambda: state(live) is FlowState.NORMAL)
        flows = [label for name, label in live.hooks.counts if name == "flow"]
        assert flows == ["DEGRADED", "NORMAL"]  # one round, no flapping
        errors = [b for b in live.transport.bodies() if isinstance(b, Error)]
        assert [e.code for e in errors] == [ErrorCode.MAILBOX_DIRTY]  # once, on stream 0
        assert seq + 1 not in pushed_seqs(live)
        offer(live, seq + 2)  # NORMAL again: pushes flow
        await settle()
        live.transport.consume()
        assert pushed_seqs(live)[-1] == seq + 2


async def test_degradation_drops_the_queued_pushes_and_a_pong_still_goes_out() -> None:
    async with live_connection(high=4_000) as live:  # a small buffer: the backlog is ours
        seq = 0
        while state(live) is FlowState.NORMAL:
            seq += 1
            offer(live, seq)
            await asyncio.sleep(0)
        assert live.conn.outbound.push_tags() == []  # the pending real-time queue is gone
        assert level(live)[1] == len(live.conn.inflight) < seq  # only what the transport holds
        offer(live, seq + 1)  # dropped while DEGRADED: only a flag is kept
        live.conn.feed_message(wire(Ping(ping_id=9, client_time=1), 4))

        def read_pong() -> bool:
            live.transport.consume()  # the client reads again
            return any(isinstance(b, Pong) for b in live.transport.bodies())

        await wait_until(read_pong)
        (pong,) = [b for b in live.transport.bodies() if isinstance(b, Pong)]
        assert pong.mailbox_dirty  # the flag goes out with the next PONG (11.3.1)
        errors = [b for b in live.transport.bodies() if isinstance(b, Error)]
        assert [e.code for e in errors] == [ErrorCode.MAILBOX_DIRTY]  # and one ERROR at once
        assert len(pushed_seqs(live)) < seq
        await wait_until(lambda: state(live) is FlowState.NORMAL)


async def test_the_hard_watermark_closes_a_slow_consumer() -> None:
    async with live_connection(high=1 << 20) as live:
        offer(live, 1, payload=LIMITS.hard.bytes)  # one burst past hard (26 #31)
        await wait_until(lambda: live.conn.closing)
        assert live.hooks.closed == [CloseReason.SLOW_CONSUMER]
        assert ("slow_connection_closed", "send_buffer_hard") in live.hooks.counts


async def test_idle_timeout_without_consumption_closes_and_control_is_not_counted() -> None:
    async with live_connection(high=1 << 20) as live:
        for seq in range(1, 4):
            offer(live, seq)
        await settle()
        assert not live.conn.closing
        live.clock[0] += live.conn.session.config.idle_timeout_ms  # nothing was read since
        await wait_until(lambda: live.conn.closing)
        assert live.hooks.closed == [CloseReason.SLOW_CONSUMER]
        assert ("slow_connection_closed", "idle_timeout") in live.hooks.counts


async def test_a_reading_client_is_never_closed_for_idleness_of_the_socket() -> None:
    async with live_connection(high=1 << 20) as live:
        offer(live, 1)
        await settle()
        live.transport.consume()
        await wait_until(lambda: level(live) == (0, 0))
        live.clock[0] += 10 * live.conn.session.config.idle_timeout_ms
        offer(live, 2)
        await settle()
        assert not live.conn.closing


async def test_degradation_drops_queued_session_frames_too_but_never_a_reply() -> None:
    """11.3.1: "drop the pending real-time queue" is every notice on stream 1, not only the
    PUSH_EVENTS; a SEND_ACK on the same stream is a reply and still goes out."""
    async with live_connection(high=4_000) as live:  # a small buffer: the backlog is ours
        seq = 0
        while state(live) is FlowState.NORMAL:
            seq += 1
            offer(live, seq)
            live.conn.apply(
                [
                    Send(SessionDelta(conversation_id=f"c{seq}", driving_mailbox_seq=seq)),
                    Send(BadgeUpdate(total_unread=seq)),
                    Send(SendAck(client_message_id=f"m{seq}"), request_id=seq),
                ]
            )
            await asyncio.sleep(0)
            assert seq < 100
        assert live.conn.outbound.queued_notices == 0  # purged with the pushes
        purged = [label for name, label in live.hooks.counts if name == "degraded_drop"]
        assert "SESSION_DELTA" in purged and "BADGE_UPDATE" in purged
        # while DEGRADED a new notice is not even queued
        live.conn.apply([Send(SessionDelta(conversation_id="late"))])
        assert live.conn.outbound.queued_notices == 0
        live.conn.feed_message(wire(Ping(ping_id=9, client_time=1), 4))

        def read_pong() -> bool:
            live.transport.consume()
            return any(isinstance(b, Pong) for b in live.transport.bodies())

        def read_acks() -> bool:
            live.transport.consume()
            return len([b for b in live.transport.bodies() if isinstance(b, SendAck)]) == seq

        await wait_until(read_pong)
        await wait_until(read_acks)
        bodies = live.transport.bodies()
        (pong,) = [b for b in bodies if isinstance(b, Pong)]
        assert pong.mailbox_dirty  # the client pulls its mailbox and session list
        deltas = [b.conversation_id for b in bodies if isinstance(b, SessionDelta)]
        assert "late" not in deltas and len(deltas) < seq  # stale queued ones never left
        acks = [b.client_message_id for b in bodies if isinstance(b, SendAck)]
        assert acks == [f"m{i}" for i in range(1, seq + 1)]  # every reply, in order
