"""Per-IP connection admission (§15.2.3, §20.4.1, B.5 per_ip_connect_rate / max_connections)."""

from __future__ import annotations

from qim.gateway.admission import ConnectAdmission, Refusal, TokenBucket


def test_per_ip_connect_rate_is_a_token_bucket() -> None:
    adm = ConnectAdmission(rate_count=20, rate_period_ms=1000, max_connections=1000)
    assert all(adm.admit("1.1.1.1", 0) is None for _ in range(20))
    assert adm.admit("1.1.1.1", 0) is Refusal.RATE
    assert adm.admit("2.2.2.2", 0) is None  # per IP
    assert adm.admit("1.1.1.1", 49) is Refusal.RATE  # 0.98 tokens refilled
    assert adm.admit("1.1.1.1", 50) is None  # one token per 50 ms
    assert adm.admit("1.1.1.1", 50) is Refusal.RATE


def test_per_ip_max_connections_and_release() -> None:
    adm = ConnectAdmission(rate_count=100, max_connections=2)
    assert adm.admit("ip", 0) is None and adm.admit("ip", 0) is None
    assert adm.admit("ip", 0) is Refusal.CONNECTIONS
    adm.release("ip")
    assert adm.connections("ip") == 1 and adm.admit("ip", 0) is None


def test_check_spends_a_token_without_counting() -> None:
    adm = ConnectAdmission(rate_count=2, max_connections=5)
    assert adm.check("ip", 0) is None and adm.connections("ip") == 0
    adm.acquire("ip")
    assert adm.connections("ip") == 1
    assert adm.check("ip", 0) is None and adm.check("ip", 0) is Refusal.RATE


def test_idle_peers_are_pruned_so_memory_stays_bounded() -> None:
    adm = ConnectAdmission(rate_count=1, rate_period_ms=1000, max_tracked=10)
    for i in range(10):
        adm.admit(f"10.0.0.{i}", 0)
        adm.release(f"10.0.0.{i}")
    adm.admit("busy", 0)  # holds a connection: never pruned
    assert len(adm) == 11
    assert adm.prune(500) == 0  # buckets not yet refilled
    adm.admit("10.9.9.9", 2000)  # over max_tracked: prune first
    assert len(adm) == 2


def test_token_bucket_never_exceeds_capacity_and_ignores_clock_steps_back() -> None:
    bucket = TokenBucket.full(3, 1000, now_ms=1000)
    assert bucket.take(1000) and bucket.take(1000) and bucket.take(1000)
    assert not bucket.take(500)  # clock stepped back: no refill, no crash
    bucket.refill(10_000)
    assert bucket.tokens == 3.0
