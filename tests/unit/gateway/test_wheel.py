"""The timing wheel with lazy checks (§15.1.5, B.4 heartbeat_wheel_tick / slots)."""

from __future__ import annotations

from qim.gateway.wheel import TimingWheel


def test_keys_come_due_at_their_tick() -> None:
    wheel: TimingWheel[str] = TimingWheel(1000, 8, now_ms=0)
    wheel.schedule("a", 2500)
    wheel.schedule("b", 1000)
    assert wheel.advance(999) == []
    assert wheel.advance(1000) == ["b"]
    assert wheel.advance(2999) == []
    assert wheel.advance(3000) == ["a"] and len(wheel) == 0


def test_rescheduling_moves_and_cancel_removes() -> None:
    wheel: TimingWheel[str] = TimingWheel(100, 8, now_ms=0)
    wheel.schedule("a", 100)
    wheel.schedule("a", 500)
    assert wheel.advance(400) == [] and "a" in wheel
    wheel.cancel("a")
    assert wheel.advance(1000) == [] and "a" not in wheel


def test_far_and_past_deadlines() -> None:
    """A deadline past one rotation comes back early (the caller re-checks and re-inserts);
    a deadline already past comes due on the next tick."""
    wheel: TimingWheel[str] = TimingWheel(1000, 4, now_ms=0)
    wheel.schedule("far", 60_000)
    wheel.schedule("past", -5)
    assert wheel.advance(1000) == ["past"]
    assert wheel.advance(4000) == ["far"]


def test_a_long_pause_processes_each_slot_once() -> None:
    wheel: TimingWheel[int] = TimingWheel(10, 16, now_ms=0)
    for i in range(100):
        wheel.schedule(i, 10 * (i % 16 + 1))
    assert sorted(wheel.advance(10**6)) == list(range(100))
