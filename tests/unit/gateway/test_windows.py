"""Windowed counters and quantiles behind the §24 gauges."""

from __future__ import annotations

from qim.gateway.windows import WindowedCounter, WindowedQuantile


def test_counter_forgets_what_left_the_window() -> None:
    c = WindowedCounter(60_000, 1000)
    c.add(0, 3)
    c.add(30_000)
    assert c.total(30_000) == 4
    assert c.total(60_500) == 1  # the first bucket left the window
    assert c.total(200_000) == 0


def test_quantile_is_the_bucket_bound_and_none_when_empty() -> None:
    q = WindowedQuantile(300_000, 10_000)
    assert q.quantile(0, 0.99) is None
    for _ in range(99):
        q.observe(0, 3)
    q.observe(0, 700)
    assert q.quantile(0, 0.5) == 5
    assert q.quantile(0, 0.99) == 5
    assert q.quantile(0, 1.0) == 800
    assert q.count(0) == 100 and q.quantile(400_000, 0.99) is None
