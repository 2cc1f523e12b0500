"""The MailboxNode's acceptance observation points (spec 26.0 table, 24.1.4).

Why a module of its own: these are measurements, not rules. They wrap the store a request
reads and the watermarks a fold publishes, and hand plain numbers to
:class:`~qim.agents.mailbox.metrics.MailboxMetrics`; nothing here feeds back into what is
materialized or answered, so the clocks used below never reach the store.

* :class:`StorageProbe` -- the store as one request sees it: ``storage_keys_examined`` (keys a
  range scan read under the user's prefix, the look-ahead key that ends the range included),
  ``storage_rows_returned`` (of those, the rows inside the requested range) and
  ``body_join_count`` (stored-body point reads of the read-time join; the MessageStore is never
  read on this path, direction.md 4.4). ``tombstones_scanned`` is RocksDB's own count of
  internal keys its iterators skipped during the request (``MailboxStore.internal_keys_skipped``).
* :class:`LaneAdvanceClock` -- ``lane_watermark_advance``: for each lane whose ``W[lane]``
  advanced, the time from the arrival (fetch) of the oldest dispatch record the advance newly
  covers until the WriteBatch carrying the advance is committed. A record held back by a
  dispatch waiting for its member slice is measured until the lane finally covers it.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from qim.core.mailbox import KVReader
from qim.core.mailbox.keys import BODY, ENTRY

__all__ = ["ADVANCE_WINDOW", "AdvanceP99", "LaneAdvanceClock", "ReadStats", "StorageProbe"]

ADVANCE_WINDOW: Final = 1024
"""Lane advances the ``lane_watermark_advance_p99`` gauge is computed over."""


@dataclass(slots=True)
class ReadStats:
    """What one request read from its shard's store."""

    storage_keys_examined: int = 0
    storage_rows_returned: int = 0
    tombstones_scanned: int | None = None
    """None: not measured (no RocksDB statistics, or the probe is off)."""
    body_join_count: int = 0


class StorageProbe:
    """A :class:`KVReader` over the shard's store that counts one request's reads."""

    def __init__(self, store: KVReader, stats: ReadStats) -> None:
        self._store = store
        self.stats = stats

    def get(self, key: bytes) -> bytes | None:
        if key.startswith(BODY):
            self.stats.body_join_count += 1
        return self._store.get(key)

    def scan(self, prefix: bytes, start_key: bytes, reverse: bool) -> Iterator[tuple[bytes, bytes]]:
        entries = prefix.startswith(ENTRY)
        for pair in self._store.scan(prefix, start_key, reverse):
            if entries:
                self.stats.storage_keys_examined += 1
            yield pair

    def returned(self, rows: int) -> None:
        """The range read handed ``rows`` in-range rows to the request."""
        self.stats.storage_rows_returned += rows


class LaneAdvanceClock:
    """Arrival times of fetched dispatch runs, until every lane covers them (module docstring).

    One entry per fetch (all its records arrived together), so the memory is bounded by the
    fetches between ``min(W)`` and the newest record, not by the records.
    """

    def __init__(self) -> None:
        self._runs: deque[tuple[int, int, float]] = deque()
        self._lasts: list[int] = []

    def arrived(self, first_seq: int, last_seq: int, at: float) -> None:
        if self._runs and last_seq <= self._runs[-1][1]:
            return  # a re-read after a failed fold: the first arrival stands
        self._runs.append((first_seq, last_seq, at))
        self._lasts.append(last_seq)

    def advanced(self, old: Sequence[int], new: Sequence[int], now: float) -> list[float]:
        """Seconds waited by the oldest newly covered record, one value per advanced lane."""
        out: list[float] = []
        for before, after in zip(old, new, strict=True):
            if after <= before:
                continue
            index = bisect.bisect_right(self._lasts, before)
            if index == len(self._runs):
                continue
            first, _, at = self._runs[index]
            if max(first, before + 1) <= after:
                out.append(max(now - at, 0.0))
        low = min(new, default=0)
        while self._runs and self._runs[0][1] <= low:
            self._runs.popleft()
            self._lasts.pop(0)
        return out


class AdvanceP99(Collector):
    """``lane_watermark_advance_p99`` (the B.5.1 SLO's name): the p99 of the recent advance
    waits, computed at scrape time; no sample yet, no value."""

    def __init__(self, samples: deque[float]) -> None:
        self._samples = samples

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "lane_watermark_advance_p99",
            f"p99 seconds of the last {ADVANCE_WINDOW} lane watermark advances",
        )
        ordered = sorted(self._samples)
        if ordered:
            gauge.add_metric([], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))])
        yield gauge
