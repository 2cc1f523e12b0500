"""The MailboxNode's per-device PushTask decision (spec 16.1.1, PD-1, 16.3 badge pushes)."""

from __future__ import annotations

from qim.core.notify.tasks import Badge, DigestCache, UserFold, plan_push_tasks
from qim.schemas.frames.base import EntryFlags, EventType
from qim.schemas.frames.mailbox import SyncEntry
from qim.schemas.records.notify import DeviceKey, DeviceTokenDigest

APNS = DeviceTokenDigest(provider="APNS")
BADGE = Badge(total_unread=4, total_mention=1, muted_unread=0, badge_projection_mailbox_seq=90)


def _cache(*devices: str) -> DigestCache:
    cache = DigestCache()
    for d in devices:
        cache.apply(DeviceKey("t", "alice", d), APNS)
    return cache


def _message(seq: int, event_id: int = 7, flags: int = EntryFlags.COUNTS_UNREAD) -> SyncEntry:
    return SyncEntry(
        mailbox_seq=seq,
        event_id=event_id,
        event_type=EventType.MESSAGE,
        conversation_id="d:1",
        flags=flags,
        message_id=bytes(range(16)),
    )


def _fold(*entries: SyncEntry, badge_changed: bool = True) -> UserFold:
    return UserFold("t", "alice", tuple(entries), BADGE, badge_changed)


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
