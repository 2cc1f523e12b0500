"""The SDK's retry delays (qim.client.retry): honour retry_after_ms, never earlier, jittered,
growing on repeated failures; no retry for refusals a wait cannot fix (20.4.1 rule 2)."""

from __future__ import annotations

import random

from qim.client import QimError, retry_delay_ms
from qim.client.retry import DEFAULT_BACKOFF
from qim.schemas.frames import ErrorCode
from qim.schemas.frames.errors import RETRY_AFTER_NEVER_MS


def limited(ms: int | None) -> QimError:
    extras = {} if ms is None else {"retry_after_ms": ms}
    return QimError(int(ErrorCode.RATE_LIMITED), extras)


def test_the_first_retry_waits_the_hint_and_up_to_thirty_percent_more_never_less() -> None:
    rng = random.Random(7)
    delays = [retry_delay_ms(limited(400), rng=rng) for _ in range(500)]
    assert all(d is not None and 400 <= d <= 520 for d in delays)
    assert len(set(delays)) > 50  # jittered: retries of a burst do not come back together


def test_repeated_failures_of_one_request_back_off_exponentially_to_the_cap() -> None:
    rng = random.Random(1)
    waits = [retry_delay_ms(limited(2_000), n, rng=rng) for n in range(12)]
    assert all(w is not None for w in waits)
    cap, factor = DEFAULT_BACKOFF.cap_ms, DEFAULT_BACKOFF.factor
    floors = [min(cap, round(2_000 * factor**n)) for n in range(12)]
    assert all(w is not None and f <= w <= f * 1.3 + 1 for f, w in zip(floors, waits, strict=True))
    assert floors[-1] == cap
    # a 60 s outage with a 2 s hint costs a handful of attempts, not thirty
    spent, attempts = 0, 0
    while spent < 60_000:
        delay = retry_delay_ms(limited(2_000), attempts, rng=rng)
        assert delay is not None
        spent += delay
        attempts += 1
    assert attempts <= 6


def test_without_a_hint_it_is_the_reconnect_backoff() -> None:
    rng = random.Random(3)
    for attempt in range(5):
        base = DEFAULT_BACKOFF.delay_ms(attempt)
        delay = retry_delay_ms(None, attempt, rng=rng)
        assert delay is not None and base * 0.7 - 1 <= delay <= base * 1.3 + 1


def test_refusals_a_wait_cannot_fix_are_not_retried() -> None:
    assert retry_delay_ms(limited(RETRY_AFTER_NEVER_MS)) is None  # PRESENCE_SUB over the limit
    for code in (ErrorCode.PERMISSION_DENIED, ErrorCode.PAYLOAD_TOO_LARGE, ErrorCode.TOKEN_REVOKED):
        assert retry_delay_ms(QimError(int(code))) is None
    moved = retry_delay_ms(QimError(int(ErrorCode.SHARD_MOVED), {"retry_after_ms": 1_000}))
    assert moved is not None and 1_000 <= moved <= 1_300  # a shard that moves comes back
    unknown = retry_delay_ms(QimError(99, {"retry_after_ms": 500}))  # 27.1.2: back off
    assert unknown is not None and 500 <= unknown <= 650
