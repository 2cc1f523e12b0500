"""Per-connection flow control with hysteresis (11.3.1, 15.4.3, I-24, I-25, 26 #30-#32)."""

from __future__ import annotations

import pytest

from qim.core.push import (
    CLOSE_IDLE,
    CLOSE_SEND_BUFFER_HARD,
    DEFAULT_FLOW_LIMITS,
    FLOW_TABLE,
    CloseConnection,
    ConnectionPush,
    DroppedWhileDegraded,
    FlowControl,
    FlowEvent,
    FlowLimits,
    FlowState,
    IllegalTransition,
    SendControl,
    SignalDirty,
    WritePush,
)
from qim.params import Settings
from qim.params.values import Watermark

from .support import flow_state, pending

KiB, MiB = 1024, 1024 * 1024
L = DEFAULT_FLOW_LIMITS


def _online(sync_to: int = 0) -> ConnectionPush:
    push = ConnectionPush(sync_to)
    push.sync_complete()
    return push


def test_b5_default_limits_are_appendix_b_and_the_item_floor_is_a_quarter_of_soft() -> None:
    assert L.soft == Watermark(bytes=MiB, items=2000)
    assert L.hard == Watermark(bytes=4 * MiB, items=8000)
    assert (L.low_bytes, L.low_items) == (256 * KiB, 500)
    assert FlowLimits.from_settings(Settings.load()) == L
    with pytest.raises(ValueError):
        FlowLimits(L.soft, L.hard, low_bytes=MiB, low_items=1)


@pytest.mark.parametrize(
    ("level", "event"),
    [
        ((256 * KiB, 500), FlowEvent.BELOW_LOW),
        ((256 * KiB + 1, 1), FlowEvent.BETWEEN),
        ((1, 501), FlowEvent.BETWEEN),
        ((MiB - 1, 1999), FlowEvent.BETWEEN),
        ((MiB, 1), FlowEvent.AT_SOFT),
        ((1, 2000), FlowEvent.AT_SOFT),
        ((4 * MiB - 1, 7999), FlowEvent.AT_SOFT),
        ((4 * MiB, 1), FlowEvent.AT_HARD),
        ((1, 8000), FlowEvent.AT_HARD),
    ],
)
def test_11_3_1_the_watermarks_themselves_are_the_switching_points(
    level: tuple[int, int], event: FlowEvent
) -> None:
    assert L.classify(*level) is event


def test_26_30_one_mib_degrades_900_kib_stays_degraded_256_kib_recovers() -> None:
    push = _online()
    frame = 64 * KiB
    actions: list[object] = []
    for seq in range(1, 17):  # 16 x 64 KiB = exactly 1 MiB
        actions = list(push.offer(pending(seq, ledger_bytes=frame)))
        if seq < 16:
            assert flow_state(push) is FlowState.NORMAL
    assert [type(a) for a in actions] == [WritePush, SignalDirty]  # ERROR{MAILBOX_DIRTY} at once
    assert flow_state(push) is FlowState.DEGRADED
    assert push.drained(124 * KiB, 1) == []  # 900 KiB left (hysteresis)
    assert flow_state(push) is FlowState.DEGRADED
    push.drained(900 * KiB - 256 * KiB - 1, 1)  # 256 KiB + 1
    assert flow_state(push) is FlowState.DEGRADED
    push.drained(1, 0)  # exactly 256 KiB
    assert flow_state(push) is FlowState.NORMAL


def test_11_3_1_degraded_drops_new_pushes_and_pong_says_dirty_once() -> None:
    push = _online()
    push.offer(pending(1, ledger_bytes=MiB))
    assert flow_state(push) is FlowState.DEGRADED
    assert push.pong() == (1, False)  # the ERROR already reported the degradation
    assert push.offer(pending(2)) == [DroppedWhileDegraded(2)]  # nothing on stream 1 in DEGRADED
    assert push.audit() == []
    assert push.pong() == (1, True)
    assert push.pong() == (1, False)


def test_11_3_1_degraded_drops_the_realtime_queue_and_signals_dirty() -> None:
    push = ConnectionPush(0, queue_limit=Watermark(bytes=8 * MiB, items=100_000))
    for seq in range(1, 1_000):  # the login queue fills the ledger up to soft
        push.offer(pending(seq, ledger_bytes=KiB))
    assert flow_state(push) is FlowState.NORMAL and push.barrier.queued_items == 999
    assert push.offer(pending(1_000, ledger_bytes=25 * KiB)) == [SignalDirty()]
    assert push.barrier.queued_items == 0 and push.level == (0, 0)
    assert push.sync_complete() == []  # nothing left to release
    assert flow_state(push) is FlowState.NORMAL  # an empty ledger is below low


def test_11_3_1_hard_watermark_closes() -> None:
    push = _online()
    actions = push.offer(pending(1, ledger_bytes=4 * MiB))
    assert actions[-1] == CloseConnection(CLOSE_SEND_BUFFER_HARD)
    assert flow_state(push) is FlowState.CLOSING
    assert push.offer(pending(2)) == []  # closing: the next session's sync covers it
    flow = FlowControl()
    flow.level(MiB, 1)
    flow.level(4 * MiB, 1)
    assert flow.state is FlowState.CLOSING  # DEGRADED -> CLOSING too (I-24)


@pytest.mark.parametrize("ledger", [0, MiB])
def test_11_3_1_idle_timeout_closes_from_any_state(ledger: int) -> None:
    push = _online()
    if ledger:
        push.offer(pending(1, ledger_bytes=ledger))
    assert push.idle_timeout() == [CloseConnection(CLOSE_IDLE)]
    assert flow_state(push) is FlowState.CLOSING


def test_i25_control_frames_pass_in_every_state_but_closed() -> None:
    push = _online()
    assert push.control(b"pong") == SendControl(b"pong")
    push.offer(pending(1, ledger_bytes=MiB))
    assert flow_state(push) is FlowState.DEGRADED
    assert push.control(b"pong") == SendControl(b"pong")
    assert push.level == (MiB, 1)  # control frames are not on the realtime ledger
    push.idle_timeout()
    assert push.control(b"kicked") == SendControl(b"kicked")
    push.socket_closed()
    with pytest.raises(IllegalTransition):
        push.control(b"late")


def test_style_6_illegal_flow_transitions_raise_and_leave_the_state() -> None:
    flow = FlowControl()
    flow.socket_closed()
    with pytest.raises(IllegalTransition):
        flow.level(0, 0)
    with pytest.raises(IllegalTransition):
        flow.over_budget()
    assert flow.state is FlowState.CLOSED
    push = _online()
    push.socket_closed()
    with pytest.raises(IllegalTransition):
        push.offer(pending(5))


def test_style_6_flow_diagram_is_generated_from_the_table() -> None:
    diagram = FLOW_TABLE.render_mermaid()
    assert "DEGRADED --> NORMAL: BELOW_LOW / RECOVER" in diagram
    assert "NORMAL --> DEGRADED: AT_SOFT, OVER_BUDGET / DEGRADE" in diagram
    assert "DEGRADED --> DEGRADED: BETWEEN, AT_SOFT, OVER_BUDGET" in diagram
    for state in FlowState:
        assert state.name in diagram
