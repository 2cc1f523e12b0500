"""Latency samples with exact percentiles (every sample kept, no bucketing).

A benchmark run records at most a few million samples, so keeping them all costs little and
the p99.9 of a small run is a real observation, not an interpolation between bucket bounds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

__all__ = ["DEFAULT_PERCENTILES", "Samples", "percentile"]

DEFAULT_PERCENTILES: tuple[float, ...] = (50.0, 99.0, 99.9)


def percentile(ordered: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an ascending sequence: the smallest sample with at least
    ``p`` percent of the samples at or below it (p=0 is the minimum)."""
    if not ordered:
        raise ValueError("no samples")
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"percentile must be within [0, 100], got {p}")
    rank = max(1, math.ceil(p / 100.0 * len(ordered) - 1e-9))
    return ordered[rank - 1]


def _label(p: float) -> str:
    return f"p{p:g}"


class Samples:
    """Recorded values (milliseconds by convention); percentiles sort on demand."""

    def __init__(self, values: Iterable[float] = ()) -> None:
        self._values: list[float] = list(values)
        self._sorted = False

    def add(self, value: float) -> None:
        self._values.append(value)
        self._sorted = False

    def __len__(self) -> int:
        return len(self._values)

    def _ordered(self) -> list[float]:
        if not self._sorted:
            self._values.sort()
            self._sorted = True
        return self._values

    def percentile(self, p: float) -> float | None:
        """None when nothing was recorded (a report says "no data", never 0 ms)."""
        return percentile(self._ordered(), p) if self._values else None

    def summary(
        self, percentiles: Sequence[float] = DEFAULT_PERCENTILES
    ) -> dict[str, float | None]:
        """count, min, mean, max and the requested percentiles, rounded to 0.001."""
        values = self._ordered()
        if not values:
            empty: dict[str, float | None] = {"count": 0, "min": None, "mean": None, "max": None}
            return empty | {_label(p): None for p in percentiles}
        out: dict[str, float | None] = {
            "count": len(values),
            "min": round(values[0], 3),
            "mean": round(sum(values) / len(values), 3),
            "max": round(values[-1], 3),
        }
        for p in percentiles:
            out[_label(p)] = round(percentile(values, p), 3)
        return out
