"""The MailboxNode's per-device PushTask decision (spec 16.1.1, PD-1, 16.3 badge pushes)."""

from __future__ import annotations

import pytest

from qim.core.notify.tasks import (
    Badge,
    DigestCache,
    UserFold,
    notifies,
    plan_push_tasks,
    push_policy,
)
from qim.schemas.frames.base import EntryFlags, EventType, MentionType
from qim.schemas.frames.mailbox import SyncEntry
from qim.schemas.records.notify import DeviceKey, DeviceTokenDigest

APNS = DeviceTokenDigest(provider="APNS")
BADGE = Badge(total_unread=4, total_mention=1, muted_unread=0, badge_projection_mailbox_seq=90)


def _cache(*devices: str) -> DigestCache:
    cache = DigestCache()
    for d in devices:
        cache.apply(DeviceKey("t", "alice", d), APNS)
    return cache


def _message(
    seq: int,
    event_id: int = 7,
    flags: int = EntryFlags.COUNTS_UNREAD,
    conversation_id: str = "d:1",
    mention_type: int = MentionType.NONE,
) -> SyncEntry:
    return SyncEntry(
        mailbox_seq=seq,
        event_id=event_id,
        event_type=EventType.MESSAGE,
        conversation_id=conversation_id,
        flags=flags,
        message_id=bytes(range(16)),
        mention_type=mention_type,
    )


def _fold(
    *entries: SyncEntry, badge_changed: bool = True, policies: tuple[tuple[str, str], ...] = ()
) -> UserFold:
    return UserFold("t", "alice", tuple(entries), BADGE, badge_changed, policies)


def test_pd1_phone_offline_desktop_online_only_the_phone_gets_a_task() -> None:
    tasks = plan_push_tasks(
        [_fold(_message(90))],
        digests=_cache("phone", "desktop"),
        online={("t", "alice"): ["desktop"]},
    )
    assert [(t.device_id, t.kind, t.event_id, t.total_unread) for t in tasks] == [
        ("phone", "alert", "7", 4)
    ]
    assert tasks[0].badge_projection_mailbox_seq == 90


def test_device_without_a_token_gets_no_task_and_a_tombstone_removes_the_token() -> None:
    cache = _cache("phone")
    cache.apply(DeviceKey("t", "alice", "phone"), None)
    assert plan_push_tasks([_fold(_message(5))], digests=cache, online={}) == []
    assert len(cache) == 0


def test_a_read_elsewhere_sends_offline_devices_a_silent_badge_task() -> None:
    tasks = plan_push_tasks([_fold()], digests=_cache("phone"), online={})
    assert [(t.kind, t.event_id, t.total_unread) for t in tasks] == [("badge", "badge:90", 4)]


def test_entries_that_do_not_count_unread_make_no_alert() -> None:
    quiet = _message(5, flags=0)
    assert (
        plan_push_tasks([_fold(quiet, badge_changed=False)], digests=_cache("p"), online={}) == []
    )


def test_every_offline_device_of_the_user_gets_its_own_task() -> None:
    tasks = plan_push_tasks([_fold(_message(9))], digests=_cache("phone", "tablet"), online={})
    assert sorted(t.device_id for t in tasks) == ["phone", "tablet"]


@pytest.mark.parametrize(
    ("muted", "policy", "effective"),
    [
        (False, "ALL", "ALL"),
        (True, "ALL", "MUTED"),  # muted: @me yes, @all no (11.4.3)
        (False, "MENTION_ONLY", "MENTION_ONLY"),
        (True, "MENTION_ONLY", "MUTED"),
        (False, "NONE", "NONE"),
        (True, "NONE", "NONE"),  # muted alone never raises NONE back
        (False, "bogus", "ALL"),  # an unknown value costs a wake-up, never a silence
    ],
)
def test_push_policy_of_mute_and_notification_policy(
    muted: bool, policy: str, effective: str
) -> None:
    assert push_policy(muted, policy) == effective


@pytest.mark.parametrize(
    ("policy", "effective"),
    [("ALL", "MENTION_ONLY"), ("MENTION_ONLY", "MENTION_ONLY"), ("NONE", "NONE")],
)
def test_11_4_3_a_tenant_can_let_at_all_notify_in_muted_conversations(
    policy: str, effective: str
) -> None:
    assert push_policy(True, policy, at_all_notify_muted=True) == effective
    assert push_policy(False, policy, at_all_notify_muted=True) == policy


@pytest.mark.parametrize(
    ("policy", "alerting"),
    [
        ("ALL", {"NONE", "AT_ME", "AT_ALL", "REPLY_ME"}),
        ("MENTION_ONLY", {"AT_ME", "AT_ALL", "REPLY_ME"}),
        ("MUTED", {"AT_ME", "REPLY_ME"}),  # 11.4.3: no notification for @all when muted
        ("NONE", set()),
    ],
)
def test_which_mention_types_alert_under_each_policy(policy: str, alerting: set[str]) -> None:
    kinds = {"NONE", "AT_ME", "AT_ALL", "REPLY_ME"}
    assert {m for m in kinds if notifies(policy, m)} == alerting


def test_a_muted_conversation_makes_no_alert_but_the_badge_still_reaches_the_device() -> None:
    muted = _message(5, event_id=5, conversation_id="g:muted")
    loud = _message(6, event_id=6, conversation_id="g:loud")
    tasks = plan_push_tasks(
        [_fold(muted, loud, policies=(("g:muted", "MENTION_ONLY"),))],
        digests=_cache("phone"),
        online={},
    )
    assert [(t.kind, t.event_id, t.conversation_id) for t in tasks] == [("alert", "6", "g:loud")]
    # Only the muted message in the fold: no alert, a silent badge task with the same numbers.
    only = plan_push_tasks(
        [_fold(muted, policies=(("g:muted", "MENTION_ONLY"),))], digests=_cache("phone"), online={}
    )
    assert [(t.kind, t.event_id, t.total_unread) for t in only] == [("badge", "badge:90", 4)]


def test_a_mention_breaks_through_mute_but_not_notification_policy_none() -> None:
    at_me = _message(5, event_id=5, conversation_id="g:1", mention_type=MentionType.AT_ME)
    muted = plan_push_tasks(
        [_fold(at_me, policies=(("g:1", "MENTION_ONLY"),))], digests=_cache("phone"), online={}
    )
    assert [(t.kind, t.event_id, t.mention_type) for t in muted] == [("alert", "5", "AT_ME")]
    none = plan_push_tasks(
        [_fold(at_me, badge_changed=False, policies=(("g:1", "NONE"),))],
        digests=_cache("phone"),
        online={},
    )
    assert none == []


def test_11_4_3_an_at_all_in_a_muted_conversation_makes_no_alert_but_at_me_does() -> None:
    at_all = _message(5, event_id=5, conversation_id="g:1", mention_type=MentionType.AT_ALL)
    at_me = _message(6, event_id=6, conversation_id="g:1", mention_type=MentionType.AT_ME)
    muted = (("g:1", push_policy(True, "ALL")),)
    tasks = plan_push_tasks(
        [_fold(at_all, at_me, policies=muted)], digests=_cache("phone"), online={}
    )
    assert [(t.kind, t.event_id, t.mention_type) for t in tasks] == [("alert", "6", "AT_ME")]
    # only the @all: the badge still reaches the device, silently (unread still grows)
    only = plan_push_tasks([_fold(at_all, policies=muted)], digests=_cache("phone"), online={})
    assert [(t.kind, t.event_id) for t in only] == [("badge", "badge:90")]
    # the tenant's at_all_notify_muted: the @all alerts again
    opted = (("g:1", push_policy(True, "ALL", at_all_notify_muted=True)),)
    loud = plan_push_tasks([_fold(at_all, policies=opted)], digests=_cache("phone"), online={})
    assert [(t.kind, t.event_id, t.mention_type) for t in loud] == [("alert", "5", "AT_ALL")]
