"""PULL_HISTORY -> HISTORY_BATCH: anchors, interval, limits, has_more (7.5, 9.5.3, 12.10)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qim.core.history import (
    FULL_INTERVAL,
    HistoryBounds,
    HistoryLimits,
    InvalidHistoryRequest,
    MemoryOrderedStore,
    VisibleInterval,
    archive_batch,
    bounds_from_store,
    conversation_prefix,
    decode_message_record,
    pull_history,
    seq_from_key,
    to_history_message,
    write_all,
)
from qim.schemas.frames.errors import ErrorCode
from qim.schemas.frames.history import HistoryBatch, PullHistory
from tests.unit.history.support import C, T, committed, store_with

SEQS = [s for s in range(1, 101) if s % 7]  # holes are legal (spec 6.3)
HEAD = HistoryBounds(latest_conversation_seq=100, earliest_available_conversation_seq=1)


def _pull(
    store: MemoryOrderedStore,
    *,
    interval: VisibleInterval = FULL_INTERVAL,
    bounds: HistoryBounds = HEAD,
    tenant: str = T,
    **fields: object,
) -> HistoryBatch:
    request = msgspec.structs.replace(PullHistory(conversation_id=C), **fields)
    return pull_history(store, tenant_id=tenant, request=request, interval=interval, bounds=bounds)


def _seqs(batch: HistoryBatch) -> list[int]:
    return [m.conversation_seq for m in batch.messages]


def test_9_5_3_older_with_anchor_zero_is_the_latest_page_in_ascending_order() -> None:
    batch = _pull(store_with(SEQS), direction="older", limit=5)
    assert _seqs(batch) == [95, 96, 97, 99, 100]
    assert batch.has_more
    assert (batch.latest_conversation_seq, batch.earliest_available_conversation_seq) == (100, 1)


def test_9_5_3_anchors_are_exclusive_so_limit_one_walks_visit_each_message_once() -> None:
    store = store_with(SEQS)
    older: list[int] = []
    anchor = 0
    while True:
        batch = _pull(store, direction="older", anchor_conversation_seq=anchor, limit=1)
        older += _seqs(batch)
        if not batch.has_more:
            break
        anchor = batch.messages[0].conversation_seq
    assert older == sorted(SEQS, reverse=True)
    newer: list[int] = []
    anchor = 0
    while True:
        batch = _pull(store, direction="newer", anchor_conversation_seq=anchor, limit=3)
        newer += _seqs(batch)
        if not batch.has_more:
            break
        anchor = batch.messages[-1].conversation_seq
    assert newer == SEQS


def test_7_5_join_floor_is_open_and_the_join_event_itself_is_visible() -> None:
    store = store_with(SEQS)
    joined = VisibleInterval(joined_at=50)  # join event at seq 51
    batch = _pull(store, interval=joined, direction="newer", limit=3)
    assert _seqs(batch) == [51, 52, 53]
    assert batch.earliest_available_conversation_seq == 51
    back = _pull(store, interval=joined, direction="older", anchor_conversation_seq=53, limit=9)
    assert _seqs(back) == [51, 52] and not back.has_more


def test_12_10_leaver_reads_only_below_J_and_head_stops_at_J_minus_1() -> None:
    store = store_with(SEQS)
    left = VisibleInterval(joined_at=0, left_at=60)  # LEAVE_GROUP CONTROL message at seq 60
    latest = _pull(store, interval=left, direction="older", limit=3)
    assert _seqs(latest) == [57, 58, 59]
    assert latest.latest_conversation_seq == 59  # the head is invisible from J on (A.3 #22)
    forward = _pull(store, interval=left, direction="newer", anchor_conversation_seq=55, limit=50)
    assert _seqs(forward) == [55 + i for i in range(1, 5) if (55 + i) % 7]
    assert not forward.has_more  # messages >= J exist, but not for the leaver
    assert _pull(store, interval=left, direction="newer", anchor_conversation_seq=59).messages == ()


def test_A3_5_max_bytes_cuts_the_page_but_always_returns_one_message() -> None:
    store = store_with(range(1, 11), payload=b"x" * 1000)
    one = _pull(store, direction="older", limit=10, max_bytes=10)
    assert _seqs(one) == [10] and one.has_more  # alone over max_bytes, still served
    size = _wire_sizes(store)[10]
    assert size > 1000  # the payload plus the encoded map around it
    three = _pull(store, direction="older", limit=10, max_bytes=3 * size + size // 2)
    assert _seqs(three) == [8, 9, 10] and three.has_more
    everything = _pull(store, direction="older", limit=10, max_bytes=10 * size)
    assert len(everything.messages) == 10 and not everything.has_more


def test_A3_5_limit_zero_and_oversized_limits_are_clamped() -> None:
    store = store_with(range(1, 301))
    head = HistoryBounds(latest_conversation_seq=300)
    limits = HistoryLimits()
    assert len(_pull(store, bounds=head, direction="newer").messages) == limits.default_limit
    huge = _pull(store, bounds=head, direction="newer", limit=10_000)
    assert len(huge.messages) == limits.max_limit and huge.has_more


def test_7_4_earliest_available_bounds_retention_and_comes_back_in_the_batch() -> None:
    store = store_with(SEQS)
    trimmed = HistoryBounds(latest_conversation_seq=100, earliest_available_conversation_seq=30)
    batch = _pull(store, bounds=trimmed, direction="older", anchor_conversation_seq=33, limit=50)
    assert _seqs(batch) == [30, 31, 32] and not batch.has_more
    assert batch.earliest_available_conversation_seq == 30
    assert bounds_from_store(store, T, C) == HistoryBounds(100, 1)
    assert bounds_from_store(MemoryOrderedStore(), T, C) == HistoryBounds(0, 0)


def test_tenant_isolation_same_conversation_id_in_another_tenant_is_invisible() -> None:
    store = store_with([1, 2, 3])
    assert _pull(store, tenant="t2", direction="newer").messages == ()


def test_unknown_direction_is_refused_and_the_connection_lives_on() -> None:
    with pytest.raises(InvalidHistoryRequest) as info:
        _pull(store_with([1]), direction="sideways")
    assert info.value.code == ErrorCode.UPGRADE_REQUIRED and not info.value.close


def _wire_sizes(store: MemoryOrderedStore) -> dict[int, int]:
    prefix = conversation_prefix(T, C)
    return {
        seq_from_key(key): len(msgspec.msgpack.encode(to_history_message(decode_message_record(v))))
        for key, v in store.scan(prefix, prefix, False)
    }


@settings(max_examples=300, deadline=None)
@given(
    rows=st.dictionaries(st.integers(1, 40), st.integers(0, 300), max_size=30),
    joined_at=st.integers(0, 20),
    left_gap=st.one_of(st.none(), st.integers(1, 30)),
    earliest=st.integers(0, 15),
    direction=st.sampled_from(["older", "newer"]),
    anchor=st.integers(0, 45),
    limit=st.integers(1, 8),
    max_bytes=st.integers(1, 2000),
)
def test_7_5_pages_match_a_reference_model_and_has_more_is_exact(
    rows: dict[int, int],
    joined_at: int,
    left_gap: int | None,
    earliest: int,
    direction: str,
    anchor: int,
    limit: int,
    max_bytes: int,
) -> None:
    store = MemoryOrderedStore()
    for seq, size in rows.items():  # payload sizes vary, so the byte cut falls anywhere
        write_all(store, archive_batch([committed(seq, payload=b"p" * size)]))
    sizes = _wire_sizes(store)
    interval = VisibleInterval(joined_at, None if left_gap is None else joined_at + left_gap)
    bounds = HistoryBounds(latest_conversation_seq=40, earliest_available_conversation_seq=earliest)
    visible = sorted(s for s in rows if interval.contains(s) and s >= earliest)
    if direction == "older":
        candidates = [s for s in visible if anchor == 0 or s < anchor][::-1]
    else:
        candidates = [s for s in visible if s > anchor]
    expected: list[int] = []
    used = 0
    for seq in candidates:
        if expected and (len(expected) == limit or used + sizes[seq] > max_bytes):
            break
        expected.append(seq)
        used += sizes[seq]
    batch = _pull(
        store,
        interval=interval,
        bounds=bounds,
        direction=direction,
        anchor_conversation_seq=anchor,
        limit=limit,
        max_bytes=max_bytes,
    )
    assert _seqs(batch) == sorted(expected)
    assert batch.has_more == (len(candidates) > len(expected))
