"""The MailboxNode's presence cache and online filter (5.4.2, 5.4.3, 7.10, 15.2.2)."""

from __future__ import annotations

import pytest

from qim.core.membership import ShardSlice, bitmap_bytes
from qim.core.push import ForeignPartition, OfflineCause, OnlineFilter, ShardPresenceCache
from qim.schemas.records.presence import PresenceKey, encode_presence
from qim.schemas.records.push import STALE_EPOCH_MISMATCH, PresenceStale

from .support import NOW, SHARD, TTL, T, cache_with, presence


def _stale(user: str, device: str, epoch: int) -> PresenceStale:
    return PresenceStale(
        tenant_id=T,
        user_id=user,
        device_id=device,
        connection_id="c",
        observed_epoch=epoch,
        reason=STALE_EPOCH_MISMATCH,
        mailbox_shard=SHARD,
    )


def _slice(users: list[str], version: int = 1) -> ShardSlice:
    slots = tuple(range(10, 10 + len(users)))
    return ShardSlice(
        tenant_id=T,
        group_id="g",
        membership_version=version,
        mailbox_shard=SHARD,
        member_count=len(users),
        slot_bitmap=bitmap_bytes(slots),
        slots=slots,
        user_ids=tuple(users),
        joined_at=(0,) * len(users),
    )


def test_5_4_2_cache_takes_records_of_its_own_partition_only() -> None:
    cache = ShardPresenceCache(SHARD)
    entry = presence("bob")
    cache.apply_record(SHARD, entry.key.encode(), encode_presence(entry), NOW)
    assert cache.devices(T, "bob", NOW) == (entry,)
    with pytest.raises(ForeignPartition):
        cache.apply_record(SHARD + 1, entry.key.encode(), encode_presence(entry), NOW)
    cache.apply_record(SHARD, entry.key.encode(), None, NOW)  # tombstone
    assert cache.devices(T, "bob", NOW) == ()
    assert not cache.online.is_online(T, "bob")


def test_15_2_2_the_larger_session_epoch_wins() -> None:
    new, old = presence("bob", epoch=5), presence("bob", epoch=4)
    cache = cache_with(new)
    cache.apply(old.key, old, NOW)  # a late record of the replaced connection
    assert cache.devices(T, "bob", NOW) == (new,)
    renewed = presence("bob", epoch=5, lease=NOW + 2 * TTL)
    cache.apply(renewed.key, renewed, NOW)  # same epoch: a renewal replaces
    assert cache.devices(T, "bob", NOW) == (renewed,)


def test_5_4_3_lease_expiry_makes_a_user_offline_only_after_the_ttl() -> None:
    cache = cache_with(presence("bob", lease=NOW + TTL))
    assert cache.expire(NOW + TTL - 1) == 0
    assert cache.online.is_online(T, "bob")
    assert cache.devices(T, "bob", NOW + TTL - 1) != ()
    # At lease_expire_at the device is hidden from pushes even before the sweep ...
    assert cache.devices(T, "bob", NOW + TTL) == ()
    assert cache.online.is_online(T, "bob")  # ... while the bit stays (a false positive)
    assert cache.expire(NOW + TTL) == 1
    assert not cache.online.is_online(T, "bob")


def test_5_4_3_a_renewal_moves_the_expiry() -> None:
    cache = cache_with(presence("bob", lease=NOW + TTL))
    renewed = presence("bob", lease=NOW + 2 * TTL)
    cache.apply(renewed.key, renewed, NOW + 10_000)
    assert cache.expire(NOW + TTL) == 0
    assert cache.online.is_online(T, "bob")
    assert cache.expire(NOW + 2 * TTL) == 1


def test_5_4_3_an_already_expired_record_removes_the_device() -> None:
    cache = cache_with(presence("bob"))
    late = presence("bob", lease=NOW - 1)
    cache.apply(late.key, late, NOW)
    assert len(cache) == 0
    assert not cache.online.is_online(T, "bob")


def test_5_4_3_user_stays_online_while_any_device_lives() -> None:
    cache = cache_with(presence("bob", "phone"), presence("bob", "desk"))
    cache.apply(PresenceKey(T, "bob", "phone"), None, NOW)
    assert cache.online.is_online(T, "bob")
    assert [d.device_id for d in cache.devices(T, "bob", NOW)] == ["desk"]


def test_5_4_3_presence_stale_drops_the_entry_only_up_to_the_observed_epoch() -> None:
    cache = cache_with(presence("bob", epoch=7))
    assert not cache.invalidate(_stale("bob", "phone", 6), NOW)  # a newer epoch is kept
    assert cache.devices(T, "bob", NOW)
    assert cache.invalidate(_stale("bob", "phone", 7), NOW)
    assert cache.devices(T, "bob", NOW) == ()
    assert not cache.online.is_online(T, "bob")


def test_5_4_3_a_stale_connection_does_not_come_back_from_a_late_record() -> None:
    entry = presence("bob", epoch=7)
    cache = cache_with(entry)
    cache.invalidate(_stale("bob", "phone", 7), NOW)
    cache.apply(entry.key, entry, NOW)  # a duplicate of the dead epoch
    assert cache.devices(T, "bob", NOW) == ()
    newer = presence("bob", epoch=8)
    cache.apply(newer.key, newer, NOW)  # the reconnect
    assert cache.devices(T, "bob", NOW) == (newer,)


def test_5_4_3_reconcile_counts_missing_unexpected_and_mismatched_keys() -> None:
    a, b, c = presence("a"), presence("b"), presence("c")
    cache = cache_with(a, b, c)
    b2 = presence("b", epoch=2)
    d = presence("d")
    snapshot = [(a.key, a), (b2.key, b2), (c.key, None), (d.key, d)]
    report = cache.reconcile(snapshot, NOW)
    assert report.missing == (d.key,)
    assert report.unexpected == (c.key,)
    assert report.mismatched == (b2.key,)
    assert report.presence_reconcile_diff == 3
    # Adopted: a second reconcile against the same snapshot is clean.
    assert cache.reconcile(snapshot, NOW).presence_reconcile_diff == 0
    assert not cache.online.is_online(T, "c")
    assert cache.online.is_online(T, "d")


def test_5_4_3_reconcile_of_the_records_the_cache_applied_is_clean() -> None:
    records = [presence(u) for u in ("a", "b", "c")]
    cache = cache_with(*records)
    snapshot = [(r.key, r) for r in records] + [(records[1].key, None)]
    cache.apply(records[1].key, None, NOW)
    assert cache.reconcile(snapshot, NOW).presence_reconcile_diff == 0


def test_5_4_3_reconcile_keeps_a_stale_floor() -> None:
    entry = presence("bob", epoch=3)
    cache = cache_with(entry)
    cache.invalidate(_stale("bob", "phone", 3), NOW)
    assert cache.reconcile([(entry.key, entry)], NOW).presence_reconcile_diff == 0
    assert cache.devices(T, "bob", NOW) == ()


def test_5_4_3_online_bitmap_uses_the_member_slot_map() -> None:
    cache = cache_with(presence("b"), presence("d"))
    key = cache.online.register(_slice(["a", "b", "c", "d"]))
    assert list(cache.online.online_slots(key)) == [11, 13]
    assert cache.online.online_members(key) == ("b", "d")
    c = presence("c")
    cache.apply(c.key, c, NOW)
    assert cache.online.online_members(key) == ("b", "c", "d")
    cache.apply(c.key, None, NOW)
    assert cache.online.online_members(key) == ("b", "d")
    assert cache.online.audit(cache.live_users(NOW)) == []


def test_5_4_3_no_false_negative_audit_finds_a_cleared_live_user() -> None:
    cache = cache_with(presence("b"))
    key = cache.online.register(_slice(["a", "b"]))
    cache.online.mark_offline(T, "b", OfflineCause.RECONCILE)  # a bug, simulated
    problems = cache.online.audit(cache.live_users(NOW))
    assert len(problems) == 2 and all("'b'" in p for p in problems)
    assert list(cache.online.online_slots(key)) == []


def test_5_4_3_a_bit_is_cleared_only_with_an_explicit_cause() -> None:
    online = OnlineFilter()
    online.mark_online(T, "b")
    with pytest.raises(TypeError):
        online.mark_offline(T, "b", "timeout")  # type: ignore[arg-type]
    assert online.is_online(T, "b")


def test_7_9_retired_slices_are_forgotten() -> None:
    cache = cache_with(presence("b"))
    old = cache.online.register(_slice(["a", "b"], version=1))
    new = cache.online.register(_slice(["b"], version=2))
    cache.online.retire(old)
    with pytest.raises(KeyError):
        cache.online.online_slots(old)
    assert cache.online.online_members(new) == ("b",)
