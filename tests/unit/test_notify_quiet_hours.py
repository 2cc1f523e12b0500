"""Quiet hours (spec 16.4, AT-113): the daily ``push_quiet_hours`` window in the device's own
time zone quiets normal alerts into badge updates, lets @me through, and ends with ONE badge
update instead of the backlog."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from qim.agents.notify.service import decode_state, encode_state
from qim.core.notify.rules import (
    DeviceState,
    PushPolicy,
    Send,
    admit,
    flush_due,
    next_flush_at,
    quiet_until,
)
from qim.params.values import QuietHours

NIGHT = QuietHours(start_minute=22 * 60, end_minute=7 * 60)  # 22:00-07:00, wraps midnight
POLICY = PushPolicy(push_quiet_hours=NIGHT)
SHANGHAI = "Asia/Shanghai"  # UTC+8, no DST


def _ms(y: int, mo: int, d: int, h: int, mi: int = 0) -> int:
    """A UTC wall time in ms."""
    return int(datetime(y, mo, d, h, mi, tzinfo=UTC).timestamp() * 1000)


def _admit(
    state: DeviceState,
    event: str,
    now: int,
    *,
    mention: str = "NONE",
    conv: str = "g",
    seq: int = 1,
    policy: PushPolicy = POLICY,
    timezone: str = SHANGHAI,
) -> tuple[DeviceState, list[Send]]:
    return admit(
        state,
        token_fingerprint="t",
        kind="alert",
        event_id=event,
        conversation_id=conv,
        mailbox_seq=seq,
        total_unread=seq,
        total_mention=0,
        muted_unread=0,
        badge_projection_mailbox_seq=seq,
        now_ms=now,
        policy=policy,
        mention_type=mention,
        timezone=timezone,
    )


def test_quiet_until_is_the_end_of_the_window_in_the_devices_local_time() -> None:
    # 23:30 in Shanghai (15:30 UTC): quiet until 07:00 Shanghai the next morning (23:00 UTC).
    assert quiet_until(NIGHT, SHANGHAI, _ms(2026, 12, 3, 15, 30)) == _ms(2026, 12, 3, 23)
    # 03:00 in Shanghai (19:00 UTC the day before): quiet until 07:00 the same morning.
    assert quiet_until(NIGHT, SHANGHAI, _ms(2026, 12, 3, 19)) == _ms(2026, 12, 3, 23)
    # 07:00 sharp and noon in Shanghai: not quiet.
    assert quiet_until(NIGHT, SHANGHAI, _ms(2026, 12, 3, 23)) is None
    assert quiet_until(NIGHT, SHANGHAI, _ms(2026, 12, 4, 4)) is None
    # The same instant is quiet in one zone and not in another.
    assert quiet_until(NIGHT, "Europe/Berlin", _ms(2026, 12, 3, 15, 30)) is None


def test_quiet_until_follows_a_dst_change_in_the_local_zone() -> None:
    # New York leaves DST on 2026-11-01: 23:00 EDT (03:00 UTC) -> 07:00 EST = 12:00 UTC.
    assert quiet_until(NIGHT, "America/New_York", _ms(2026, 11, 1, 3)) == _ms(2026, 11, 1, 12)


@pytest.mark.parametrize(
    ("quiet", "zone", "now", "expected"),
    [
        (None, SHANGHAI, _ms(2026, 12, 3, 15, 30), None),  # off by default
        (QuietHours(600, 600), SHANGHAI, _ms(2026, 12, 3, 2), None),  # empty window
        (QuietHours(13 * 60, 14 * 60), "", _ms(2026, 12, 3, 13, 10), _ms(2026, 12, 3, 14)),
        (QuietHours(13 * 60, 14 * 60), "Not/AZone", _ms(2026, 12, 3, 13), _ms(2026, 12, 3, 14)),
        (QuietHours(13 * 60, 14 * 60), "UTC", _ms(2026, 12, 3, 12, 59), None),
    ],
)
def test_quiet_until_edge_cases_and_utc_for_an_empty_or_unknown_zone(
    quiet: QuietHours | None, zone: str, now: int, expected: int | None
) -> None:
    assert quiet_until(quiet, zone, now) == expected


def test_in_quiet_hours_a_normal_alert_becomes_a_silent_badge_update() -> None:
    night = _ms(2026, 12, 3, 15, 30)
    state, sends = _admit(DeviceState(), "e1", night)
    assert [(s.kind, s.reason, s.total_unread) for s in sends] == [("badge", "quiet_hours", 1)]
    assert state.windows == ()  # no merge window: nothing is held back for later
    # The same message outside quiet hours is an alert.
    _, day = _admit(DeviceState(), "e1", _ms(2026, 12, 4, 4))
    assert [s.kind for s in day] == ["alert"]


@pytest.mark.parametrize(
    ("mention", "kind"), [("AT_ME", "alert"), ("REPLY_ME", "alert"), ("AT_ALL", "badge")]
)
def test_at_me_breaks_through_quiet_hours_and_at_all_does_not(mention: str, kind: str) -> None:
    _, sends = _admit(DeviceState(), "e1", _ms(2026, 12, 3, 15, 30), mention=mention)
    assert [s.kind for s in sends] == [kind]


def test_with_the_break_through_off_at_me_is_quiet_too() -> None:
    policy = PushPolicy(push_quiet_hours=NIGHT, quiet_hours_mentions_break_through=False)
    _, sends = _admit(DeviceState(), "e1", _ms(2026, 12, 3, 15, 30), mention="AT_ME", policy=policy)
    assert [(s.kind, s.reason) for s in sends] == [("badge", "quiet_hours")]


def test_leaving_quiet_hours_sends_one_badge_update_and_no_backlog() -> None:
    night, end = _ms(2026, 12, 3, 15, 30), _ms(2026, 12, 3, 23)
    state = DeviceState()
    for i in range(5):
        state, _ = _admit(state, f"e{i}", night + i * 60_000, conv=f"c{i % 2}", seq=10 + i)
    assert next_flush_at(state) == end
    state, early = flush_due(state, now_ms=end - 1, policy=POLICY)
    assert early == []
    state, sends = flush_due(state, now_ms=end, policy=POLICY)
    assert [(s.kind, s.reason, s.total_unread, s.badge_projection_mailbox_seq) for s in sends] == [
        ("badge", "quiet_hours_end", 14, 14)
    ]
    assert sends[0].merged_count == 5
    assert next_flush_at(state) is None
    _, again = flush_due(state, now_ms=end + 1, policy=POLICY)
    assert again == []
    # The first message after quiet hours alerts at once.
    _, after = _admit(state, "e9", end + 60_000, seq=20)
    assert [s.kind for s in after] == ["alert"]


def test_a_later_badge_during_quiet_hours_is_the_one_the_end_update_carries() -> None:
    night, end = _ms(2026, 12, 3, 15, 30), _ms(2026, 12, 3, 23)
    state, _ = _admit(DeviceState(), "e1", night, seq=10)
    state, _ = admit(
        state,
        token_fingerprint="t",
        kind="badge",
        event_id="badge:30",
        conversation_id="",
        mailbox_seq=30,
        total_unread=0,
        total_mention=0,
        muted_unread=0,
        badge_projection_mailbox_seq=30,
        now_ms=night + 1_000,
        policy=POLICY,
        timezone=SHANGHAI,
    )
    _, sends = flush_due(state, now_ms=end, policy=POLICY)
    assert [(s.total_unread, s.badge_projection_mailbox_seq) for s in sends] == [(0, 30)]


def test_the_quiet_state_survives_the_table_encoding() -> None:
    state, _ = _admit(DeviceState(), "e1", _ms(2026, 12, 3, 15, 30))
    assert state.quiet is not None
    assert decode_state(encode_state(state)) == state


def test_an_older_badge_arriving_in_quiet_hours_does_not_replace_a_newer_one() -> None:
    night, end = _ms(2026, 12, 3, 15, 30), _ms(2026, 12, 3, 23)
    state, _ = _admit(DeviceState(), "e30", night, seq=30)
    state, _ = _admit(state, "e20", night + 1_000, seq=20)
    _, sends = flush_due(state, now_ms=end, policy=POLICY)
    assert [(s.badge_projection_mailbox_seq, s.merged_count) for s in sends] == [(30, 2)]
