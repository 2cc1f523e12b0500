"""The MailboxNode's observation points: lane advance waits and one request's store reads.

Invariants: an advanced lane reports the wait of the oldest record it newly covers (held
records count from their own arrival), lanes that did not move report nothing, a re-read run
keeps its first arrival; the probe counts entry-prefix scan keys and stored-body reads only;
the p99 gauge has no value before any sample.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

from prometheus_client import CollectorRegistry

from qim.agents.mailbox.observe import AdvanceP99, LaneAdvanceClock, ReadStats, StorageProbe
from qim.core.mailbox import MemoryMailboxStore
from qim.core.mailbox.keys import body_key, count_key, user_entry_prefix
from qim.tables.mailbox_store import MailboxStore


def test_an_advance_reports_the_oldest_newly_covered_run() -> None:
    clock = LaneAdvanceClock()
    clock.arrived(1, 10, at=100.0)
    # lane 0 covers 1..10, lane 1 is held below 5, lane 2 does not move
    assert clock.advanced([0, 0, 10], [10, 4, 10], now=100.5) == [0.5, 0.5]
    clock.arrived(11, 20, at=101.0)
    clock.arrived(11, 15, at=999.0)  # a re-read after a failed fold: first arrival stands
    # lane 1 released at 103: its oldest newly covered record (5) arrived at 100
    assert clock.advanced([10, 4, 10], [20, 20, 20], now=103.0) == [2.0, 3.0, 2.0]


def test_runs_are_dropped_once_every_lane_covers_them() -> None:
    clock = LaneAdvanceClock()
    clock.arrived(1, 10, at=0.0)
    clock.arrived(11, 20, at=1.0)
    assert clock.advanced([0, 0], [20, 20], now=2.0) == [2.0, 2.0]
    clock.arrived(21, 30, at=5.0)
    assert clock.advanced([20, 20], [30, 25], now=6.0) == [1.0, 1.0]
    # nothing older than 21 is left: a lane moving from 25 is measured from run 21..30
    assert clock.advanced([30, 25], [30, 30], now=7.0) == [2.0]


def test_a_lane_advance_over_no_fetched_record_is_not_observed() -> None:
    clock = LaneAdvanceClock()
    assert clock.advanced([0], [5], now=1.0) == []


def test_the_probe_counts_entry_keys_and_body_reads_only() -> None:
    prefix = user_entry_prefix("t", "u")
    other = user_entry_prefix("t", "v")
    store = MemoryMailboxStore(
        [
            (prefix + b"\x01", b"x"),
            (prefix + b"\x02", b"x"),
            (other + b"\x01", b"x"),
            (body_key("t", b"m" * 16), b"x"),
            (count_key("t", "u"), b"x"),
        ]
    )
    stats = ReadStats()
    probe = StorageProbe(store, stats)
    assert [k for k, _ in probe.scan(prefix, prefix, False)] == [prefix + b"\x01", prefix + b"\x02"]
    probe.get(body_key("t", b"m" * 16))
    probe.get(count_key("t", "u"))
    probe.returned(2)
    assert stats == ReadStats(
        storage_keys_examined=2, storage_rows_returned=2, tombstones_scanned=None, body_join_count=1
    )


def test_rocksdb_counts_the_tombstones_an_iterator_steps_over(tmp_path: Path) -> None:
    store = MailboxStore(tmp_path / "s")
    try:
        store.apply([(b"a%d" % i, b"v") for i in range(3)] + [(b"b%d" % i, b"v") for i in range(5)])
        store.apply([(b"b%d" % i, None) for i in range(3)])
        before = store.internal_keys_skipped()
        assert [k for k, _ in store.scan(b"", b"a2", False)] == [b"a2", b"b3", b"b4"]
        assert store.internal_keys_skipped() - before >= 3  # the step past a2 walked b0..b2
        before = store.internal_keys_skipped()
        assert [k for k, _ in store.scan(b"a", b"a", False)] == [b"a0", b"a1", b"a2"]
        assert store.internal_keys_skipped() == before  # bounded at "b": never reaches them
        before = store.internal_keys_skipped()
        assert [k for k, _ in store.scan(b"b", b"b3", False)] == [b"b3", b"b4"]
        assert store.internal_keys_skipped() == before  # a seek past them skips nothing
    finally:
        store.close()


def test_the_p99_gauge_is_empty_until_a_sample_exists() -> None:
    samples: deque[float] = deque(maxlen=8)
    registry = CollectorRegistry()
    registry.register(AdvanceP99(samples))
    assert registry.get_sample_value("lane_watermark_advance_p99") is None
    samples.extend([0.1, 0.2, 3.0])
    assert registry.get_sample_value("lane_watermark_advance_p99") == 3.0
