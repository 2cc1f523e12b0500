"""The node-level send-buffer budget ladder (11.3.3, I-27, 26 #34)."""

from __future__ import annotations

from qim.core.push import (
    ConnectionLoad,
    ConnectionPush,
    FlowState,
    SignalDirty,
    enforce_node_budget,
)

from .support import flow_state, pending

MiB = 1024 * 1024


def test_11_3_3_within_budget_nothing_happens() -> None:
    decision = enforce_node_budget([ConnectionLoad("a", 10), ConnectionLoad("b", 10)], 20)
    assert not decision.over_budget and decision.total_after == 20


def test_11_3_3_chatroom_frames_go_first_and_the_ladder_stops_under_budget() -> None:
    loads = [
        ConnectionLoad("a", 100, room_bytes=50, large_group_bytes=50),
        ConnectionLoad("b", 100, room_bytes=30, large_group_bytes=70),
    ]
    decision = enforce_node_budget(loads, 150)
    assert decision.steps == (1,)
    assert decision.drop_room == ("a",) and decision.degrade == ()
    assert decision.total_after == 150


def test_11_3_3_largest_large_group_offenders_are_degraded_first() -> None:
    loads = [
        ConnectionLoad("a", 300, large_group_bytes=100),
        ConnectionLoad("b", 500, large_group_bytes=400),
        ConnectionLoad("c", 200, large_group_bytes=150, small_group_bytes=50),
    ]
    decision = enforce_node_budget(loads, 650)
    assert decision.steps == (2,)
    assert decision.drop_large_group == ("b",)
    assert decision.degrade == ("b",)


def test_11_3_3_then_small_groups_then_longer_pings_then_closes_by_size() -> None:
    loads = [
        ConnectionLoad("a", 400, small_group_bytes=100),
        ConnectionLoad("b", 300, large_group_bytes=100),
        ConnectionLoad("c", 300),  # 1:1 and control only: nothing droppable
    ]
    decision = enforce_node_budget(loads, 300)
    assert decision.steps == (2, 3, 4, 5)
    assert decision.drop_large_group == ("b",) and decision.drop_small_group == ("a",)
    assert decision.degrade == ("b", "a")
    assert decision.lengthen_ping
    # Remaining: a=300, b=200, c=300 -> close the largest first (ties by id) until <= 300.
    assert decision.close == ("a", "c")
    assert decision.total_after == 200


def test_11_3_3_a_budget_degraded_connection_reports_the_purged_pushes() -> None:
    push = ConnectionPush(0)
    push.sync_complete()
    for seq in (1, 2, 3):
        push.offer(pending(seq, ledger_bytes=100 * 1024))
    assert push.over_budget(purged_bytes=200 * 1024, purged_items=2) == [SignalDirty()]
    assert flow_state(push) is FlowState.DEGRADED
    assert push.level == (100 * 1024, 1)
    assert push.over_budget(purged_bytes=100 * 1024, purged_items=1) == []  # already DEGRADED
    assert push.pong() == (3, True)  # ... so the purge is reported with the next PONG
    assert push.drained(0, 0) == []  # ledger empty -> at or below low
    assert flow_state(push) is FlowState.NORMAL
