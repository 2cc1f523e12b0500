"""Healing ``qim.user-quota`` after a lost crossing (qim.core.mailbox.quota.reconcile, I-26).

``reconcile`` alone on each case the takeover pass can meet, then the reads it relies on: the
latest record per user of a partition (tombstones and junk skipped) and the shard's counts of
the named users plus every user at or above the cap, from a real fold.
"""

from __future__ import annotations

from qim.core.mailbox import MemoryMailboxStore
from qim.core.mailbox.quota import latest_published, listed_count, reconcile, shard_counts
from qim.schemas.records.user_quota import UserQuota, encode_user_quota
from tests.unit.mailbox.support import SHARD, T
from tests.unit.mailbox.test_quota import CAP, ME, PEER_A, PEER_B, PEER_C, PEER_D, _Chat

KIM, LEO = (T, "kim"), (T, "leo")


def _record(user: tuple[str, str], conversations: int, exhausted: bool) -> UserQuota:
    return UserQuota(
        tenant_id=user[0], user_id=user[1], conversations=conversations, exhausted=exhausted
    )


def _state(records: list[UserQuota]) -> list[tuple[str, int, bool]]:
    return [(r.user_id, r.conversations, r.exhausted) for r in records]


def test_a_lost_down_crossing_publishes_not_exhausted() -> None:
    fixed = reconcile({KIM: _record(KIM, 3, True)}, {KIM: 2}, CAP, mailbox_shard=SHARD)
    assert _state(fixed) == [("kim", 2, False)]
    assert (fixed[0].tenant_id, fixed[0].partition) == (T, SHARD)


def test_a_lost_up_crossing_publishes_exhausted() -> None:
    assert _state(reconcile({KIM: _record(KIM, 2, False)}, {KIM: 3}, CAP)) == [("kim", 3, True)]


def test_agreeing_states_publish_nothing() -> None:
    published = {KIM: _record(KIM, 3, True), LEO: _record(LEO, 2, False)}
    assert reconcile(published, {KIM: 4, LEO: 0}, CAP) == []


def test_no_record_under_the_cap_publishes_nothing() -> None:
    assert reconcile({}, {KIM: 2, LEO: 0}, CAP) == []


def test_no_record_at_the_cap_is_published_and_a_missing_count_is_zero() -> None:
    fixed = reconcile({LEO: _record(LEO, 3, True)}, {KIM: 3}, CAP)
    assert _state(fixed) == [("kim", 3, True), ("leo", 0, False)]  # sorted by user


def test_latest_published_keeps_the_last_record_per_user_and_skips_junk() -> None:
    values = [
        encode_user_quota(_record(KIM, 3, True)),
        b"not msgpack \xff",
        None,  # a tombstone
        encode_user_quota(_record(LEO, 3, True)),
        encode_user_quota(_record(KIM, 2, False)),
    ]
    latest = latest_published(values)
    assert {u: (r.conversations, r.exhausted) for u, r in latest.items()} == {
        KIM: (2, False),
        LEO: (3, True),
    }


def test_shard_counts_names_the_asked_users_and_everyone_at_the_cap() -> None:
    chat = _Chat(MemoryMailboxStore())
    for peer in (PEER_A, PEER_B, PEER_C, PEER_D):
        chat.message(peer)
    chat.delete(PEER_D)
    assert listed_count(chat.store, T, ME) == 3
    counts = shard_counts(chat.store, CAP, [(T, PEER_A), (T, "nobody")])
    assert counts == {(T, ME): 3, (T, PEER_A): 1, (T, "nobody"): 0}
    chat.delete(PEER_C)  # 4 rows, 2 listed: under the cap although it has >= cap rows
    assert shard_counts(chat.store, CAP) == {}


def test_a_lost_delete_is_found_from_the_store() -> None:
    """The hole itself: exhausted published at 3, the delete's record lost; the pass heals."""
    chat = _Chat(MemoryMailboxStore())
    published = {}
    for peer in (PEER_A, PEER_B, PEER_C):
        for record in chat.message(peer):
            published[(record.tenant_id, record.user_id)] = record
    assert _state(list(published.values())) == [(ME, 3, True)]
    assert _state(chat.delete(PEER_B)) == [(ME, 2, False)]  # planned, never published
    fixed = reconcile(published, shard_counts(chat.store, CAP, published), CAP)
    assert _state(fixed) == [(ME, 2, False)]
