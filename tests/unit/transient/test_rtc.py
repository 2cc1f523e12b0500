"""RTC ring timers (spec 13.5.3, AT-65): the only call state the server keeps."""

from __future__ import annotations

from qim.core.transient import RingTimers, answer_reason


def ring(timers: RingTimers, call: str, now: int) -> None:
    timers.invite(
        "t", call, "bob", caller="alice", caller_device="phone", conversation_id="d:1", now_ms=now
    )


def test_an_unanswered_call_times_out_once_at_its_deadline() -> None:
    timers = RingTimers(60_000)
    ring(timers, "c1", 1000)
    assert timers.due(60_999) == []
    (expired,) = timers.due(61_000)
    assert (expired.call_id, expired.caller, expired.callee) == ("c1", "alice", "bob")
    assert timers.due(999_999) == [] and len(timers) == 0


def test_an_answer_stops_the_ringing_and_a_repeated_invite_restarts_it() -> None:
    timers = RingTimers(60_000)
    ring(timers, "c1", 0)
    assert timers.stop("t", "c1", "bob") is not None
    assert timers.due(60_000) == []
    ring(timers, "c2", 0)
    ring(timers, "c2", 30_000)  # the caller re-sent the invite
    assert timers.due(60_000) == []
    assert [r.call_id for r in timers.due(90_000)] == ["c2"]


def test_what_a_callee_device_tells_its_other_devices() -> None:
    assert answer_reason("accept") == "answered_elsewhere"
    assert answer_reason("reject") == answer_reason("busy") == "rejected_elsewhere"
    assert answer_reason("ringing") is None and answer_reason("bye") is None
