"""Token buckets per key (user, conversation, ...) whose refusals say when a retry can succeed.

Why its own module: 20.4.1 lists several per-user limits the ConnectionNode keeps in memory
(``per_user_history_pull_rate``, ``per_user_msg_rate``, ...), each "reject or queue, never
accept then drop" (rule 1) and each refusal with a ``retry_after_ms`` the client honours with
+-30 % jitter (rule 2). One small implementation serves them all.

Each key is a GCRA cell (the same arithmetic as the writer's admission,
:mod:`qim.core.conversation.admission`): ``tat`` is the theoretical arrival time; a request at
``t`` conforms iff ``t >= tat - tolerance`` with ``tolerance = (capacity - 1) x interval``, and
taking it sets ``tat = max(tat, t) + interval``. A cell whose ``tat <= t`` is a full bucket and
carries no information, so it is forgotten (memory: the keys active in the last
``capacity x interval``).

The retry hint. "When the bucket refills" for one token is ``tat - tolerance - t``; answering
that to every one of 15 concurrent refusals sends all 15 back at the same moment, one wins,
and the other 14 are refused again: retries grow with the square of the burst (issue 15: ~7
retries per message). So a refusal is *promised* the next token nobody was promised yet:
the k-th refusal in a burst is told the time of the k-th future token (``promised`` advances
one interval per refusal), and if every refused client comes back at its time, each retry
succeeds. The promise is a hint, not a reservation: a request that conforms is admitted
whatever was promised (no state but the bucket decides admission), so a client that never
comes back costs nobody a token. The promises run at most ``max_hint_ms`` ahead, so a burst
of thousands cannot push a user's hints out to hours.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

__all__ = ["Admit", "KeyedBuckets"]

K = TypeVar("K", bound=Hashable)

_US_PER_MS: Final = 1000


@dataclass(frozen=True, slots=True)
class Admit:
    """The verdict on one request: admitted, or refused with the time a retry can succeed."""

    retry_after_ms: int | None = None

    @property
    def admitted(self) -> bool:
        return self.retry_after_ms is None


_ADMITTED: Final = Admit()


@dataclass(slots=True)
class _Cell:
    tat_us: int
    promised_us: int  # the tat after the tokens promised to refused requests


class KeyedBuckets(Generic[K]):
    """One GCRA cell per key; ``take`` admits (and debits) or refuses with a hint."""

    __slots__ = ("_cells", "capacity", "interval_us", "max_hint_ms", "max_keys", "tolerance_us")

    def __init__(
        self,
        per_second: float,
        capacity: int,
        *,
        max_hint_ms: int = 30_000,
        max_keys: int = 1_000_000,
    ) -> None:
        if per_second <= 0 or capacity < 1 or max_hint_ms < 1 or max_keys < 1:
            raise ValueError("a bucket needs a positive rate, capacity, hint bound and key bound")
        self.interval_us = math.ceil(1_000_000 / per_second)  # round the rate down, never up
        self.tolerance_us = (capacity - 1) * self.interval_us
        self.capacity = capacity
        self.max_hint_ms = max_hint_ms
        self.max_keys = max_keys
        self._cells: dict[K, _Cell] = {}  # last-touched order: the eviction order

    def take(self, key: K, now_ms: int) -> Admit:
        """Admit one request of ``key`` at ``now_ms`` (taking a token) or refuse it."""
        t = now_ms * _US_PER_MS
        self.evict(now_ms)
        cell = self._cells.pop(key, None)
        if cell is None:
            cell = _Cell(t, t)
        if t >= cell.tat_us - self.tolerance_us:
            cell.tat_us = max(cell.tat_us, t) + self.interval_us
            cell.promised_us = max(cell.promised_us, cell.tat_us)
            verdict = _ADMITTED
        else:
            base = max(cell.tat_us, cell.promised_us)
            earliest = cell.tat_us - self.tolerance_us
            cap = t + self.max_hint_ms * _US_PER_MS
            conform_at = min(base - self.tolerance_us, max(cap, earliest))
            cell.promised_us = min(
                base + self.interval_us, conform_at + self.tolerance_us + self.interval_us
            )
            verdict = Admit(max(1, math.ceil((conform_at - t) / _US_PER_MS)))
        self._cells[key] = cell
        if len(self._cells) > self.max_keys:  # forgets debt, never invents it
            del self._cells[next(iter(self._cells))]
        return verdict

    def evict(self, now_ms: int) -> int:
        """Forget full buckets from the least recently touched on."""
        t = now_ms * _US_PER_MS
        dropped = 0
        while self._cells:
            key = next(iter(self._cells))
            cell = self._cells[key]
            if max(cell.tat_us, cell.promised_us) > t:
                break
            del self._cells[key]
            dropped += 1
        return dropped

    def __len__(self) -> int:
        return len(self._cells)
