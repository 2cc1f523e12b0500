"""Mailbox trimming by time window and by entry cap (spec 18.3.2-18.3.3, 6.5.2, I-7)."""

from __future__ import annotations

from qim.core.mailbox import (
    DAY_MS,
    MailboxConfig,
    MemoryMailboxStore,
    StoreMailboxReader,
    expiry_at,
    replay,
    retention_sweep,
    store_digest,
)
from qim.core.mailbox.keys import BODY, DISPATCH, EXPIRY
from tests.unit.mailbox.support import (
    BASE_TIME,
    CONFIG,
    EPOCH,
    Log,
    T,
    dispatch,
    group_slice,
    local_users,
    numbered,
    run,
    seq,
)

DAY0 = BASE_TIME - BASE_TIME % DAY_MS


def _seqs(store: MemoryMailboxStore, user: str) -> list[int]:
    reader = StoreMailboxReader(store, CONFIG.lane_count)
    return [s for s, _ in reader.read_user_range(T, user, 0, 1 << 62)]


def _trim(store: MemoryMailboxStore, user: str) -> int:
    return StoreMailboxReader(store, CONFIG.lane_count).effective_trim(T, user)


def _daily_log(days: int, a: str, b: str) -> Log:
    """One message a day between ``a`` and ``b``, committed at noon UTC."""
    return numbered(
        [
            dispatch(
                d + 1, sender=b, participants=(a, b), committed_at=DAY0 + d * DAY_MS + DAY_MS // 2
            )
            for d in range(days)
        ]
    )


def test_adr_0023_an_entry_expires_at_the_end_of_its_day_bucket_plus_the_window() -> None:
    assert expiry_at(DAY0 + 1, 7) == DAY0 + 8 * DAY_MS
    assert expiry_at(DAY0 + DAY_MS - 1, 7) == DAY0 + 8 * DAY_MS


def test_18_3_3_time_window_trims_by_log_time_and_raises_effective_trim() -> None:
    a, b = local_users(2)
    store = MemoryMailboxStore()
    run(store, _daily_log(20, a, b))  # log time: day 19
    assert len(_seqs(store, a)) == 20
    swept = retention_sweep(store, now_ms=1 << 62, config=CONFIG)
    assert swept.now_ms == DAY0 + 19 * DAY_MS + DAY_MS // 2  # clamped to the log, not "now"
    store.apply(swept.ops)
    remaining = _seqs(store, a)
    # day d expires at the start of day d + 8: days 0..11 are gone at day 19 noon
    assert remaining == [seq(o) for o in range(12, 20)]
    assert _trim(store, a) == seq(11)
    assert swept.metrics["mailbox_entries_expired_total"] == 2 * 12  # both users


def test_6_5_2_effective_trim_is_monotone_and_sweeps_are_idempotent() -> None:
    a, b = local_users(2)
    store = MemoryMailboxStore()
    run(store, _daily_log(20, a, b))
    store.apply(retention_sweep(store, now_ms=DAY0 + 12 * DAY_MS, config=CONFIG).ops)
    early = _trim(store, a)
    store.apply(retention_sweep(store, now_ms=DAY0, config=CONFIG).ops)  # an older "now"
    assert _trim(store, a) == early
    final = retention_sweep(store, now_ms=1 << 62, config=CONFIG)
    store.apply(final.ops)
    assert _trim(store, a) > early
    assert retention_sweep(store, now_ms=1 << 62, config=CONFIG).ops == ()


def test_18_3_3_sweeping_early_and_late_leaves_what_sweeping_once_leaves() -> None:
    a, b = local_users(2)
    log = _daily_log(30, a, b)
    once = replay(log, shard_epoch=EPOCH, config=CONFIG)
    once.apply(retention_sweep(once, 1 << 62, CONFIG).ops)
    often = MemoryMailboxStore()
    for start in range(0, 30, 4):
        run(often, log[start : start + 4])
        often.apply(retention_sweep(often, 1 << 62, CONFIG).ops)
    assert store_digest(often.items()) == store_digest(once.items())


def test_18_3_3_bodies_and_dispatch_progress_leave_through_the_expiry_index() -> None:
    a, b = local_users(2)
    store = MemoryMailboxStore()
    run(store, _daily_log(20, a, b))

    def keys_of(tag: bytes) -> list[bytes]:
        return [k for k, _ in store.items() if k.startswith(tag)]

    assert len(keys_of(BODY)) == 20 and len(keys_of(DISPATCH)) == 20
    store.apply(retention_sweep(store, 1 << 62, CONFIG).ops)
    assert len(keys_of(BODY)) == 8  # the bodies of the entries still in the window
    assert len(keys_of(DISPATCH)) == 7  # 7-day dedup window from committed_at: days 13..19
    assert all(k.startswith(EXPIRY) for k in keys_of(EXPIRY))


def test_18_3_3_entry_cap_trims_oldest_groups_down_to_80_percent_and_counts() -> None:
    config = MailboxConfig(mailbox_shard=0, mailbox_shard_count=4, max_mailbox_entries_per_user=10)
    a, b = local_users(2)
    store = MemoryMailboxStore()
    result = run(
        store, numbered([dispatch(n, sender=b, participants=(a, b)) for n in range(1, 12)]), config
    )
    assert _seqs(store, a) == [seq(o) for o in range(3, 11)]  # 11 > 10 -> 8 newest remain
    assert StoreMailboxReader(store, config.lane_count).effective_trim(T, a) == seq(2)
    assert result.metrics["mailbox_entry_cap_evicted_total"] == 2 * 3
    assert result.cap_evicted == {T: 2 * 3}  # the {tenant} label of the metric (26.1.6)
    more = run(
        store,
        numbered([dispatch(n, sender=b, participants=(a, b)) for n in range(12, 14)], 11),
        config,
    )
    assert more.metrics["mailbox_entry_cap_evicted_total"] == 0  # 10 entries: at, not over, the cap
    assert more.cap_evicted == {}


def test_18_3_3_the_cap_removes_whole_event_groups() -> None:
    config = MailboxConfig(
        mailbox_shard=0, mailbox_shard_count=4, max_mailbox_entries_per_user=5, mention_entries=True
    )
    a, b = local_users(2)
    from qim.schemas.records.dispatch import EventTemplate

    mention = EventTemplate(mention_targets=(a,))
    records = [dispatch(n, sender=b, participants=(a, b), template=mention) for n in range(1, 4)]
    store = MemoryMailboxStore()
    run(store, numbered(records), config)  # a: 3 groups of 2 entries = 6 > 5 -> down to <= 4
    reader = StoreMailboxReader(store, config.lane_count)
    groups = list(reader.read_user_range(T, a, 0, 1 << 62))
    assert [(s, len(g)) for s, g in groups] == [(seq(1), 2), (seq(2), 2)]


def test_18_3_3_trimming_never_passes_a_dispatch_that_waits_for_its_slice() -> None:
    config = MailboxConfig(mailbox_shard=0, mailbox_shard_count=4, max_mailbox_entries_per_user=2)
    a, b = local_users(2)
    first, second = group_slice("g:x", 1, [(a, 0), (b, 0)], chunk=1)
    waiting = dispatch(1, conversation="g:x", kind="group", sender=b, version=1)
    chatter = numbered([dispatch(n, sender=b, participants=(a, b)) for n in range(2, 6)], 2)
    log: Log = [(0, first), (1, waiting), *chatter]
    store = MemoryMailboxStore()
    run(store, log, config)
    assert _trim(store, a) == 0  # over the cap, but every entry is above the held seq
    run(store, [(6, second)], config)
    assert _trim(store, a) >= seq(1) and len(_seqs(store, a)) <= 2
