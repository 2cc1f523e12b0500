"""The second check for online devices (spec 16.1.2, PD-1, AT-103..106): pure, time injected."""

from __future__ import annotations

import pytest

from qim.core.notify.second_check import SecondCheck
from qim.core.notify.tasks import Badge, DigestCache, UserFold, plan_device_tasks
from qim.schemas.frames.base import EntryFlags, EventType
from qim.schemas.frames.mailbox import SyncEntry
from qim.schemas.records.notify import DeviceKey, DeviceTokenDigest, PushTask

DESKTOP = ("t", "alice", "desktop")
PHONE = ("t", "alice", "phone")


def _task(seq: int, device: str = "desktop") -> PushTask:
    return PushTask(
        tenant_id="t", user_id="alice", device_id=device, event_id=str(seq), mailbox_seq=seq
    )


def _check(**kw: int) -> SecondCheck:
    return SecondCheck(grace_ms=3000, extended_ms=18000, tick_ms=100, now_ms=0, **kw)


def test_no_evidence_within_the_grace_window_pushes_that_device_only() -> None:
    check = _check()
    check.hold([_task(10), _task(10, "phone")], now_ms=0)
    check.evidence(PHONE, pushed_seq=0, applied_seq=10)  # the phone applied: its task goes
    assert check.advance(2900) == []
    due = check.advance(3000)
    assert [(t.device_id, t.mailbox_seq) for t in due] == [("desktop", 10)]
    assert len(check) == 0


def test_applied_within_the_window_cancels_and_is_not_borrowed_across_devices() -> None:
    check = _check()
    check.hold([_task(10), _task(10, "phone")], now_ms=0)
    check.evidence(DESKTOP, pushed_seq=10, applied_seq=10)
    assert [t.device_id for t in check.advance(5000)] == ["phone"]
    assert check.pending(DESKTOP) == ()


def test_pushed_without_applied_extends_to_the_extended_window_then_pushes() -> None:
    check = _check()
    check.hold([_task(10)], now_ms=0)
    check.evidence(DESKTOP, pushed_seq=10, applied_seq=0)
    assert check.advance(3000) == []
    assert check.advance(17900) == []
    assert [t.mailbox_seq for t in check.advance(18000)] == [10]


def test_pushed_covers_only_entries_up_to_its_seq() -> None:
    check = _check()
    check.hold([_task(10), _task(20)], now_ms=0)
    check.evidence(DESKTOP, pushed_seq=10, applied_seq=0)
    assert [t.mailbox_seq for t in check.advance(3000)] == [20]
    assert check.pending(DESKTOP) == (10,)


def test_conn_closed_pushes_the_unapplied_entries_at_once() -> None:
    check = _check()
    check.hold([_task(10), _task(20), _task(30)], now_ms=0)
    check.evidence(DESKTOP, pushed_seq=30, applied_seq=10)
    due = check.closed(DESKTOP, applied_seq=20)  # the close carries the freshest APPLIED
    assert [t.mailbox_seq for t in due] == [30]
    assert check.advance(60000) == []


def test_each_entry_keeps_its_own_window() -> None:
    check = _check()
    check.hold([_task(10)], now_ms=0)
    check.hold([_task(20)], now_ms=2000)
    assert [t.mailbox_seq for t in check.advance(3000)] == [10]
    assert check.advance(4900) == []
    assert [t.mailbox_seq for t in check.advance(5000)] == [20]


def test_forget_drops_without_emitting_and_the_hold_is_bounded() -> None:
    check = _check(max_held=2)
    check.hold([_task(10), _task(20), _task(30)], now_ms=0)
    assert check.pending(DESKTOP) == (20, 30)
    check.forget(DESKTOP)
    assert check.advance(60000) == [] and len(check) == 0


def test_windows_must_be_ordered() -> None:
    with pytest.raises(ValueError):
        SecondCheck(grace_ms=5000, extended_ms=1000)


def test_planner_holds_alerts_for_online_devices_and_sends_offline_ones() -> None:
    cache = DigestCache()
    for d in ("phone", "desktop"):
        cache.apply(DeviceKey("t", "alice", d), DeviceTokenDigest(provider="APNS"))
    entry = SyncEntry(
        mailbox_seq=90,
        event_id=7,
        event_type=EventType.MESSAGE,
        conversation_id="d:1",
        flags=EntryFlags.COUNTS_UNREAD,
        message_id=bytes(16),
    )
    fold = UserFold("t", "alice", (entry,), Badge(1, 0, 0, 90), True)
    now, held = plan_device_tasks([fold], digests=cache, online={("t", "alice"): ["desktop"]})
    assert [(t.device_id, t.kind) for t in now] == [("phone", "alert")]
    assert [(t.device_id, t.kind, t.mailbox_seq) for t in held] == [("desktop", "alert", 90)]
    badge_only = UserFold("t", "alice", (), Badge(0, 0, 0, 91), True)
    now, held = plan_device_tasks([badge_only], digests=cache, online={("t", "alice"): ["desktop"]})
    assert [(t.device_id, t.kind) for t in now] == [("phone", "badge")] and held == []


def test_delivered_to_the_peer_kernel_ends_the_extended_window_without_a_push() -> None:
    check = _check()
    check.hold([_task(10), _task(20)], now_ms=0)
    check.evidence(DESKTOP, pushed_seq=20, applied_seq=0, delivered_seq=10)
    assert check.advance(17900) == []
    assert [t.mailbox_seq for t in check.advance(18000)] == [20]  # 20 never reached the peer
    assert check.confirmed_alive == 1 and len(check) == 0


def test_a_close_pushes_even_what_was_delivered_but_not_applied() -> None:
    check = _check()
    check.hold([_task(10)], now_ms=0)
    check.evidence(DESKTOP, pushed_seq=10, applied_seq=0, delivered_seq=10)
    assert [t.mailbox_seq for t in check.closed(DESKTOP, applied_seq=0)] == [10]
