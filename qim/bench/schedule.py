"""The open-loop timetable: when each request is *meant* to leave, whatever the server does.

A closed loop (send, wait for the reply, send the next) slows down with the server and hides
its stalls (coordinated omission). Here every request has an intended send time fixed before
the run; a late scheduler fires at once and the latency is still measured from the intended
time, so a stall shows up as latency of every request it delayed.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence

__all__ = ["run_open_loop", "sweep", "timetable"]


def timetable(rate_per_s: float, duration_s: float, start: float = 0.0) -> list[float]:
    """Evenly spaced intended send times: ``floor(rate * duration)`` of them from ``start``."""
    if rate_per_s <= 0:
        raise ValueError(f"rate must be positive, got {rate_per_s}")
    if duration_s < 0:
        raise ValueError(f"duration must not be negative, got {duration_s}")
    count = math.floor(rate_per_s * duration_s + 1e-9)
    interval = 1.0 / rate_per_s
    return [start + i * interval for i in range(count)]


def sweep(first: float, last: float, steps: int) -> list[float]:
    """``steps`` rates from ``first`` to ``last``, geometrically spaced (load doubles fast)."""
    if steps < 1 or first <= 0 or last < first:
        raise ValueError("need steps >= 1 and 0 < first <= last")
    if steps == 1:
        return [first]
    ratio = (last / first) ** (1 / (steps - 1))
    return [round(first * ratio**i, 3) for i in range(steps)]


async def run_open_loop(
    times: Sequence[float],
    fire: Callable[[int, float], None],
    *,
    clock: Callable[[], float],
    sleep: Callable[[float], Awaitable[None]],
) -> float:
    """Call ``fire(index, intended)`` at each intended time; returns the worst lateness (s).

    ``fire`` must not block (it starts a task): the schedule never waits for a reply. Times
    already past fire immediately, in order, without shifting the later ones.
    """
    worst = 0.0
    for index, intended in enumerate(times):
        now = clock()
        if intended > now:
            await sleep(intended - now)
            now = clock()
        worst = max(worst, now - intended)
        fire(index, intended)
    return worst
