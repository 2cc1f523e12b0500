"""Sliding-window counters and quantiles for the spec's windowed metrics (§24.1.1, §24.1.7).

Why in-process: §24 names gauges such as ``auth_success_rate`` (5-min window) and
``auth_latency_p99`` verbatim; we export those names computed here, next to the raw counters
and histograms that PromQL can aggregate across nodes. Memory is fixed: one ring of buckets
per window, a fixed histogram per bucket. Time is an argument (ms); a lock makes a scrape
from the metrics thread safe against the event loop's writes.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Sequence

__all__ = ["LATENCY_BOUNDS_MS", "WindowedCounter", "WindowedQuantile"]

LATENCY_BOUNDS_MS: tuple[float, ...] = (
    1, 2, 5, 10, 20, 50, 100, 200, 300, 500, 800, 1000, 2000, 5000, 10_000, 30_000, float("inf"),
)  # fmt: skip


class _Ring:
    """``n`` buckets of ``bucket_ms``; a bucket is reset when its slot is reused."""

    def __init__(self, window_ms: int, bucket_ms: int, width: int) -> None:
        if bucket_ms < 1 or window_ms < bucket_ms:
            raise ValueError("need 1 <= bucket_ms <= window_ms")
        self.bucket_ms = bucket_ms
        self.n = -(-window_ms // bucket_ms)
        self.ids = [-1] * self.n
        self.values = [[0.0] * width for _ in range(self.n)]
        self.lock = threading.Lock()

    def slot(self, now_ms: int) -> list[float]:
        bucket = now_ms // self.bucket_ms
        i = bucket % self.n
        if self.ids[i] != bucket:
            self.ids[i] = bucket
            self.values[i] = [0.0] * len(self.values[i])
        return self.values[i]

    def live(self, now_ms: int) -> list[list[float]]:
        newest = now_ms // self.bucket_ms
        return [
            v for b, v in zip(self.ids, self.values, strict=True) if newest - self.n < b <= newest
        ]


class WindowedCounter:
    """How many events in the last ``window_ms``."""

    def __init__(self, window_ms: int, bucket_ms: int = 1000) -> None:
        self._ring = _Ring(window_ms, bucket_ms, 1)
        self.window_ms = window_ms

    def add(self, now_ms: int, n: float = 1) -> None:
        with self._ring.lock:
            self._ring.slot(now_ms)[0] += n

    def total(self, now_ms: int) -> float:
        with self._ring.lock:
            return sum(v[0] for v in self._ring.live(now_ms))


class WindowedQuantile:
    """Quantiles of observations in the last ``window_ms`` (upper bound of the bucket hit)."""

    def __init__(
        self,
        window_ms: int,
        bucket_ms: int = 10_000,
        bounds: Sequence[float] = LATENCY_BOUNDS_MS,
    ) -> None:
        self.bounds = tuple(bounds)
        self._ring = _Ring(window_ms, bucket_ms, len(self.bounds))

    def observe(self, now_ms: int, value: float) -> None:
        index = min(bisect_left(self.bounds, value), len(self.bounds) - 1)
        with self._ring.lock:
            self._ring.slot(now_ms)[index] += 1

    def count(self, now_ms: int) -> float:
        with self._ring.lock:
            return sum(sum(v) for v in self._ring.live(now_ms))

    def quantile(self, now_ms: int, q: float) -> float | None:
        """None when the window holds no observation."""
        with self._ring.lock:
            live = self._ring.live(now_ms)
            totals = [sum(col) for col in zip(*live, strict=True)] if live else []
        count = sum(totals)
        if not count:
            return None
        rank = q * count
        running = 0.0
        for bound, n in zip(self.bounds, totals, strict=True):
            running += n
            if running >= rank:
                return bound
        return self.bounds[-1]
