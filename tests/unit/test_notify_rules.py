"""The NotificationService's pure rules (spec 16.1 PD-1, 16.2 dedup / merge, 16.5 rate and
retries, 16.6 token verdicts) and the registration validation (16.6 bad input)."""

from __future__ import annotations

from typing import Any

import pytest

from qim.core.notify.registration import Refusal, validate_registration
from qim.core.notify.rules import (
    DeviceState,
    PushPolicy,
    Send,
    admit,
    classify,
    collapse_id,
    flush_due,
    next_flush_at,
    pd1_push,
    retry_delay_ms,
)

POLICY = PushPolicy()


def _admit(
    state: DeviceState, event: str, now: int, *, conv: str = "g", kind: str = "alert", fp: str = "t"
) -> tuple[DeviceState, list[Send]]:
    return admit(
        state,
        token_fingerprint=fp,
        kind=kind,
        event_id=event,
        conversation_id=conv,
        mailbox_seq=int(now),
        total_unread=int(now // 100),
        total_mention=0,
        muted_unread=0,
        badge_projection_mailbox_seq=int(now),
        now_ms=now,
        policy=POLICY,
    )


def test_same_event_to_the_same_token_notifies_once_within_the_dedup_ttl() -> None:
    state, first = _admit(DeviceState(), "e1", 1_000)
    state, again = _admit(state, "e1", 1_000 + POLICY.push_dedup_ttl - 1)
    assert len(first) == 1 and again == []


def test_a_new_token_for_the_device_starts_a_fresh_dedup_set() -> None:
    state, _ = _admit(DeviceState(), "e1", 1_000)
    _, sends = _admit(state, "e1", 2_000, fp="new-token")
    assert len(sends) == 1


def test_event_seen_after_the_dedup_ttl_is_sent_again() -> None:
    state, _ = _admit(DeviceState(), "e1", 1_000)
    _, sends = _admit(state, "e1", 1_000 + POLICY.push_dedup_ttl, conv="other")
    assert len(sends) == 1


def test_ten_messages_in_five_seconds_make_one_immediate_and_one_merged_notification() -> None:
    state, sends = DeviceState(), []
    for i in range(10):
        state, out = _admit(state, f"e{i}", 10_000 + i * 400)
        sends += out
    assert [s.kind for s in sends] == ["alert"]
    assert sends[0].collapse_id == collapse_id("g")
    assert next_flush_at(state) == 10_000 + POLICY.push_merge_window
    state, early = flush_due(state, now_ms=14_999, policy=POLICY)
    assert early == []
    state, merged = flush_due(state, now_ms=15_000, policy=POLICY)
    assert [(m.kind, m.merged_count, m.collapse_id) for m in merged] == [
        ("alert", 9, collapse_id("g"))
    ]
    assert merged[0].total_unread == (10_000 + 9 * 400) // 100  # the latest absolute badge
    assert next_flush_at(state) is None


def test_badge_tasks_are_sent_at_once_and_silent_even_inside_a_merge_window() -> None:
    state, _ = _admit(DeviceState(), "e1", 1_000)
    _, sends = _admit(state, "read-1", 1_500, kind="badge")
    assert [s.kind for s in sends] == ["badge"]


def test_fourth_alert_of_a_conversation_in_a_minute_becomes_a_silent_badge_update() -> None:
    state, kinds = DeviceState(), []
    for i in range(4):  # each after the merge window, so each is a first notification
        state, out = _admit(state, f"e{i}", 1_000 + i * 6_000)
        kinds += [(s.kind, s.reason) for s in out]
    assert kinds == [("alert", ""), ("alert", ""), ("alert", ""), ("badge", "rate_conversation")]


def test_eleventh_alert_of_a_device_in_a_minute_becomes_a_silent_badge_update() -> None:
    state, kinds = DeviceState(), []
    for i in range(11):
        state, out = _admit(state, f"e{i}", 1_000 + i * 100, conv=f"c{i}")
        kinds += [(s.kind, s.reason) for s in out]
    assert kinds[:10] == [("alert", "")] * 10
    assert kinds[10] == ("badge", "rate_user")


def test_rate_limit_frees_up_after_a_minute() -> None:
    state = DeviceState()
    for i in range(3):
        state, _ = _admit(state, f"e{i}", 1_000 + i * 6_000)
    _, out = _admit(state, "late", 1_000 + 60_000 + 1)
    assert [s.kind for s in out] == ["alert"]


def test_retry_schedule_is_1_4_16_seconds() -> None:
    assert [retry_delay_ms(i) for i in (1, 2, 3)] == [1_000, 4_000, 16_000]
    with pytest.raises(ValueError):
        retry_delay_ms(0)


@pytest.mark.parametrize(
    ("provider", "status", "reason", "outcome"),
    [
        ("APNS", 200, "", "delivered"),
        ("APNS", 410, "Unregistered", "delete_token"),
        ("APNS", 400, "BadDeviceToken", "delete_token"),
        ("APNS", 500, "InternalServerError", "retry"),
        ("APNS", 503, "ServiceUnavailable", "retry"),
        ("APNS", None, "ReadTimeout", "retry"),
        ("APNS", 429, "TooManyRequests", "failed"),
        ("APNS", 403, "InvalidProviderToken", "failed"),
        ("FCM", 404, "UNREGISTERED", "delete_token"),
        ("FCM", 400, "INVALID_ARGUMENT", "delete_token"),
        ("FCM", 503, "UNAVAILABLE", "retry"),
        ("FCM", 429, "QUOTA_EXCEEDED", "failed"),
    ],
)
def test_provider_answers_map_to_the_16_6_verdicts(
    provider: str, status: int | None, reason: str, outcome: str
) -> None:
    assert classify(provider, status, reason) == outcome


def _pd1(**kw: Any) -> str:
    base: dict[str, Any] = {
        "has_token": True,
        "online": False,
        "pushed_at": None,
        "applied_seq": 0,
        "entry_seq": 10,
        "materialized_at": 1_000,
        "now_ms": 1_000,
        "grace_ms": 3_000,
        "extended_ms": 18_000,
    }
    base.update(kw)
    return str(pd1_push(**base))


def test_pd1_phone_offline_desktop_online_pushes_the_phone_not_the_desktop() -> None:
    phone = _pd1(online=False)
    desktop = _pd1(online=True, pushed_at=1_000, applied_seq=10)
    assert (phone, desktop) == ("push", "skip")


def test_pd1_online_device_without_evidence_is_pushed_after_the_grace_window() -> None:
    assert _pd1(online=True, now_ms=3_999) == "wait"
    assert _pd1(online=True, now_ms=4_000) == "push"


def test_pd1_pushed_without_applied_waits_for_the_extended_window() -> None:
    assert _pd1(online=True, pushed_at=1_100, now_ms=10_000) == "wait"
    assert _pd1(online=True, pushed_at=1_100, now_ms=19_000) == "push"


def test_pd1_device_without_a_token_is_never_pushed() -> None:
    assert _pd1(has_token=False) == "skip"


def _body(**kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "device_id": "phone",
        "provider": "APNS",
        "token": "ab" * 32,
        "bundle_env": "sandbox",
    }
    body.update(kw)
    return body


def _validate(body: dict[str, Any], token_device: str | None = "phone") -> Any:
    return validate_registration(
        body,
        tenant_id="t",
        user_id="alice",
        token_device_id=token_device,
        connection_device_id="phone",
    )


def test_valid_registration_keeps_the_fields() -> None:
    reg = _validate(_body(token="AB" * 32, capabilities=["silent_push"]))
    assert (reg.provider, reg.token, reg.bundle_env, reg.capabilities) == (
        "APNS",
        "ab" * 32,
        "sandbox",
        ("silent_push",),
    )


@pytest.mark.parametrize(
    ("body", "detail", "status"),
    [
        (_body(user_id="bob"), "other_user", 403),
        (_body(tenant_id="t2"), "other_tenant", 403),
        (_body(device_id="desktop"), "other_device", 403),
        (_body(provider="PIGEON"), "unknown_provider", 400),
        (_body(provider="HUAWEI"), "unknown_provider", 400),
        (_body(token="zz" * 32), "malformed_token", 400),
        (_body(token="ab"), "malformed_token", 400),
        (_body(provider="FCM", token="bad token with spaces" * 3), "malformed_token", 400),
        (_body(bundle_env="staging"), "bad_bundle_env", 400),
        (_body(capabilities=["telepathy"]), "bad_capabilities", 400),
    ],
)
def test_bad_registrations_are_refused_with_permission_denied(
    body: dict[str, Any], detail: str, status: int
) -> None:
    with pytest.raises(Refusal) as err:
        _validate(body)
    assert (err.value.code, err.value.detail, err.value.status) == (
        "PERMISSION_DENIED",
        detail,
        status,
    )


def test_registration_without_a_current_connection_is_refused() -> None:
    with pytest.raises(Refusal) as err:
        validate_registration(
            _body(), tenant_id="t", user_id="alice", token_device_id=None, connection_device_id=None
        )
    assert err.value.detail == "not_authenticated_on_a_connection"


def test_ended_windows_that_held_nothing_are_forgotten_and_held_ones_kept() -> None:
    """The device's state stays bounded by its open windows, not by every conversation it
    was ever pushed for (it is re-encoded on every PushTask)."""
    state = DeviceState()
    window = POLICY.push_merge_window
    state, _ = _admit(state, "held-1", 1_000, conv="busy")
    state, held = _admit(state, "held-2", 1_001, conv="busy")  # held back in busy's window
    assert held == []
    for i in range(50):
        state, sends = _admit(state, f"e{i}", 1_000 + i * window, conv=f"c{i}")
        assert len(sends) == 1
    open_windows = {c for c, _ in state.windows}
    assert open_windows == {"busy", "c49"}  # busy still holds held-2 for its merged alert
    state, sends = flush_due(state, now_ms=1_000 + 50 * window, policy=POLICY)
    assert [s.event_id for s in sends] == ["held-2#merged"]
    assert {c for c, _ in state.windows} == set()
