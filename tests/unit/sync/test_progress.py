"""SYNC_COMPLETE validation (spec 9.3.4, cases T22, T28, T30, 26.2.3)."""

from __future__ import annotations

import pytest

from qim.core.sync import SyncProgress
from qim.schemas.frames import Error, ErrorCode, OnlineReady, SyncComplete


def incomplete(result: OnlineReady | Error) -> bool:
    return isinstance(result, Error) and result.code == ErrorCode.SYNC_INCOMPLETE


def test_t30_contiguous_coverage_releases_the_barrier() -> None:
    progress = SyncProgress(100, 1_000)
    assert incomplete(progress.complete(SyncComplete(sync_to_seq=1_000)))
    progress.record(100, 400)
    progress.record(400, 1_000)
    assert isinstance(progress.complete(SyncComplete(sync_to_seq=1_000)), OnlineReady)
    assert progress.released


def test_26_2_3_t30_tampered_sync_to_seq_is_incomplete() -> None:
    progress = SyncProgress(100, 1_000)
    progress.record(100, 1_000)
    for claimed in (999, 1_001, 0):
        assert incomplete(progress.complete(SyncComplete(sync_to_seq=claimed)))
    assert not progress.released
    assert isinstance(progress.complete(SyncComplete(sync_to_seq=1_000)), OnlineReady)


def test_t28_subrange_four_first_does_not_cover_one_to_three() -> None:
    progress = SyncProgress(100, 1_000)
    progress.record(775, 1_000)
    assert progress.covered_through == 100 and progress.pending_ranges == ((775, 1_000),)
    progress.record(325, 550)
    progress.record(550, 700)  # sub-range 3 still has more after 700
    assert incomplete(progress.complete(SyncComplete(sync_to_seq=1_000)))
    progress.record(100, 325)
    assert progress.covered_through == 700
    progress.record(700, 775)
    assert progress.covered_through == 1_000 and not progress.pending_ranges
    assert isinstance(progress.complete(SyncComplete(sync_to_seq=1_000)), OnlineReady)


def test_9_3_4_a_gap_between_subranges_keeps_the_barrier() -> None:
    progress = SyncProgress(100, 1_000)
    progress.record(100, 500)
    progress.record(501, 1_000)  # (500, 501] never served
    assert progress.covered_through == 500
    assert incomplete(progress.complete(SyncComplete(sync_to_seq=1_000)))


def test_t22_has_offline_false_is_covered_from_the_start() -> None:
    progress = SyncProgress(100, 1_000, has_offline=False)
    assert isinstance(progress.complete(SyncComplete(sync_to_seq=1_000)), OnlineReady)


def test_9_6_1_new_device_pull_from_zero_covers_a_session_started_at_trim() -> None:
    progress = SyncProgress(9_000, 10_500)
    progress.record(0, 10_500)
    assert progress.is_covered()


def test_9_3_4_repeated_sync_complete_after_release_is_harmless() -> None:
    progress = SyncProgress(0, 0)
    assert isinstance(progress.complete(SyncComplete(sync_to_seq=0)), OnlineReady)
    assert isinstance(progress.complete(SyncComplete(sync_to_seq=0)), OnlineReady)


def test_9_3_4_pending_ranges_are_bounded_and_a_re_pull_still_completes() -> None:
    progress = SyncProgress(0, 1_000, max_pending_ranges=2)
    for start in (100, 300, 500, 700):
        progress.record(start, start + 50)
    assert progress.pending_ranges == ((100, 150), (300, 350))
    progress.record(0, 1_000)
    assert progress.covered_through == 1_000
    with pytest.raises(ValueError):
        SyncProgress(0, 1, max_pending_ranges=0)


def test_9_3_2_overlapping_and_stale_records_merge() -> None:
    progress = SyncProgress(0, 100)
    progress.record(50, 60)
    progress.record(55, 80)
    progress.record(60, 70)
    assert progress.pending_ranges == ((50, 80),)
    progress.record(0, 10)
    progress.record(5, 8)  # already inside the prefix
    progress.record(10, 50)
    assert progress.covered_through == 80


def test_6_8_an_ack_beyond_the_contiguous_prefix_is_past_contiguity() -> None:
    p = SyncProgress(start_seq=5, sync_to_seq=30)
    assert not p.acked_past_contiguity(5)  # the device's own cursor
    assert p.acked_past_contiguity(6)
    p.record(20, 30)  # served early, not joined: a gap (5, 20]
    assert p.acked_past_contiguity(30)
    p.record(5, 20)
    assert not p.acked_past_contiguity(30) and p.acked_past_contiguity(31)
