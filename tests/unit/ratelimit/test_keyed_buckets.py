"""KeyedBuckets (qim.core.ratelimit): admission, refill, and hints a retry can rely on."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qim.core.ratelimit import KeyedBuckets

USER = ("t", "u")


def test_a_burst_of_twenty_admits_the_capacity_and_refuses_the_rest_with_a_hint() -> None:
    buckets: KeyedBuckets[tuple[str, str]] = KeyedBuckets(5, 5)
    verdicts = [buckets.take(USER, 1_000) for _ in range(20)]
    assert [v.admitted for v in verdicts] == [True] * 5 + [False] * 15
    hints = [v.retry_after_ms for v in verdicts[5:]]
    # the k-th refusal is told the time of the k-th future token (200 ms apart at 5/s)
    assert hints == [200 * k for k in range(1, 16)]


def test_every_refused_request_that_comes_back_at_its_hint_is_admitted() -> None:
    buckets: KeyedBuckets[tuple[str, str]] = KeyedBuckets(5, 5)
    now = 10_000
    refused = [v.retry_after_ms for v in (buckets.take(USER, now) for _ in range(20))]
    retries = sorted(now + h for h in refused if h is not None)
    assert len(retries) == 15
    assert all(buckets.take(USER, at).admitted for at in retries)


def test_the_bucket_refills_at_its_rate_and_keys_are_independent() -> None:
    buckets: KeyedBuckets[str] = KeyedBuckets(5, 5)
    for _ in range(5):
        assert buckets.take("a", 0).admitted
    assert not buckets.take("a", 0).admitted
    assert buckets.take("b", 0).admitted  # another user's bucket is full
    assert not buckets.take("a", 100).admitted  # 100 ms: not a whole token yet
    assert buckets.take("a", 1_400).admitted  # long after every promise and token came due


def test_full_buckets_are_forgotten() -> None:
    buckets: KeyedBuckets[int] = KeyedBuckets(5, 5)
    for key in range(100):
        buckets.take(key, 0)
    assert len(buckets) == 100
    buckets.take(-1, 5_000)  # every earlier bucket refilled long ago
    assert len(buckets) == 1


def test_hints_never_run_past_the_bound() -> None:
    buckets: KeyedBuckets[str] = KeyedBuckets(1, 1, max_hint_ms=3_000)
    hints = [buckets.take("a", 0).retry_after_ms for _ in range(10)]
    assert hints[0] is None
    assert hints[1:] == [1_000, 2_000, 3_000, 3_000, 3_000, 3_000, 3_000, 3_000, 3_000]


def test_a_bad_rate_is_refused() -> None:
    with pytest.raises(ValueError):
        KeyedBuckets(0, 5)


@given(
    st.lists(st.integers(min_value=0, max_value=5_000), min_size=1, max_size=200),
    st.integers(min_value=1, max_value=10),
)
def test_admissions_never_exceed_the_token_bucket_bound(times: list[int], capacity: int) -> None:
    """In any window of w ms at most capacity + w x rate requests are admitted (token bucket)."""
    rate = 5
    buckets: KeyedBuckets[str] = KeyedBuckets(rate, capacity)
    admitted = [t for t in sorted(times) if buckets.take("k", t).admitted]
    for i, start in enumerate(admitted):
        for j in range(i, len(admitted)):
            width = admitted[j] - start
            assert j - i + 1 <= capacity + width * rate // 1000
