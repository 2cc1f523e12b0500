"""The login barrier as a transition table (9.4, 9.3.4, style.md 6)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from qim.core.push import (
    BARRIER_TABLE,
    BarrierAction,
    BarrierEvent,
    BarrierState,
    ConnectionPush,
    IllegalTransition,
    LoginBarrier,
    SignalDirty,
    WritePush,
)
from qim.params.values import Watermark

from .support import barrier_state, pending

SYNC_TO = 1_000


def _written(actions: Sequence[object]) -> list[int]:
    return [a.mailbox_seq for a in actions if isinstance(a, WritePush)]


def test_9_4_1_nothing_at_or_below_sync_to_seq_is_pushed_before_or_after_online_ready() -> None:
    push = ConnectionPush(SYNC_TO)
    assert push.offer(pending(SYNC_TO)) == []
    assert push.offer(pending(3)) == []
    assert push.barrier.queued_items == 0
    assert push.sync_complete() == []
    assert push.offer(pending(SYNC_TO)) == []  # a late batch: covered by the pull
    assert _written(push.offer(pending(SYNC_TO + 1))) == [SYNC_TO + 1]
    assert push.mailbox_dirty is False  # skipping a covered event is not a loss


def test_9_4_1_newer_events_wait_and_flow_in_mailbox_seq_order_after_online_ready() -> None:
    push = ConnectionPush(SYNC_TO)
    for seq in (1_005, 1_002, 1_009, 1_003):
        assert push.offer(pending(seq)) == []
    assert [p.mailbox_seq for p in push.barrier.queued] == [1_005, 1_002, 1_009, 1_003]
    assert push.level == (4 * 164, 4)  # the queue is on the connection's ledger (9.4.2)
    assert _written(push.sync_complete()) == [1_002, 1_003, 1_005, 1_009]
    assert push.barrier.state is BarrierState.ONLINE_READY
    assert push.pong() == (1_009, False)


def test_9_3_4_a_failed_sync_complete_keeps_the_barrier_and_the_queue() -> None:
    push = ConnectionPush(SYNC_TO)
    push.offer(pending(1_001))
    push.sync_incomplete()
    assert push.barrier.state is BarrierState.SYNCING
    assert push.barrier.queued_items == 1
    assert _written(push.sync_complete()) == [1_001]


def test_9_4_2_queue_overflow_drops_the_queue_and_signals_mailbox_dirty() -> None:
    push = ConnectionPush(SYNC_TO, queue_limit=Watermark(bytes=1 << 20, items=3))
    assert push.offer(pending(1_001)) == []
    assert push.offer(pending(1_002)) == []
    actions = push.offer(pending(1_003))  # the third item reaches the bound
    assert actions == [SignalDirty()]
    assert SignalDirty().error.code == 4  # ERROR{code=MAILBOX_DIRTY}
    assert push.barrier.queued_items == 0 and push.level == (0, 0)
    assert push.offer(pending(1_004)) == []  # later events queue again
    assert _written(push.sync_complete()) == [1_004]


def test_9_4_2_overflow_by_bytes_at_exactly_the_bound() -> None:
    barrier = LoginBarrier(SYNC_TO, Watermark(bytes=1_000, items=100))
    assert barrier.offer(pending(1_001, ledger_bytes=999)).action is BarrierAction.QUEUE
    barrier.drop_queue()
    result = barrier.offer(pending(1_002, ledger_bytes=1_000))
    assert result.action is BarrierAction.OVERFLOW
    assert [p.mailbox_seq for p in result.dropped] == [1_002]


def test_style_6_illegal_barrier_transitions_raise_and_leave_the_state() -> None:
    push = ConnectionPush(SYNC_TO)
    push.sync_complete()
    with pytest.raises(IllegalTransition):
        push.sync_complete()
    with pytest.raises(IllegalTransition):
        push.sync_incomplete()
    assert barrier_state(push) is BarrierState.ONLINE_READY
    push.socket_closed()
    with pytest.raises(IllegalTransition):
        push.barrier.offer(pending(SYNC_TO + 1))
    assert barrier_state(push) is BarrierState.CLOSED


def test_style_6_every_barrier_cell_is_declared_and_queue_full_only_while_syncing() -> None:
    assert BARRIER_TABLE.is_legal(BarrierState.SYNCING, BarrierEvent.QUEUE_FULL)
    assert not BARRIER_TABLE.is_legal(BarrierState.ONLINE_READY, BarrierEvent.QUEUE_FULL)
    assert not BARRIER_TABLE.is_legal(BarrierState.ONLINE_READY, BarrierEvent.SYNC_COMPLETE)
    cell = BARRIER_TABLE.step(BarrierState.SYNCING, BarrierEvent.SYNC_COMPLETE)
    assert (cell.target, cell.action) == (BarrierState.ONLINE_READY, BarrierAction.RELEASE)


def test_style_6_barrier_diagram_is_generated_from_the_table() -> None:
    diagram = BARRIER_TABLE.render_mermaid()
    assert diagram.startswith("stateDiagram-v2\n    [*] --> SYNCING")
    assert "SYNCING --> ONLINE_READY: SYNC_COMPLETE / RELEASE" in diagram
    assert len(diagram.splitlines()) == 2 + len(
        {(s, t.target, t.action) for s, _, t in BARRIER_TABLE.cells()}
    )
    table = BARRIER_TABLE.render_markdown(list(BarrierEvent))
    assert "| ONLINE_READY |" in table
