"""Metric names of §24.1.1 and §24.1.7 verbatim, in a per-node registry."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from qim.gateway.metrics import GatewayMetrics

SPEC_24_1_1 = [
    "connections_online", "auth_success_rate", "auth_latency_p99", "online_ready_latency_p99",
    "reconnect_rate", "unauth_connection_count", "takeover_admit_duration", "kicked_total",
    "session_epoch_reject_total",
]  # fmt: skip
SPEC_24_1_7 = [
    "heartbeat_pps", "ping_interval_effective", "ping_backoff_trigger_rate",
    "dead_connection_detect_ms_p99", "false_disconnect_ratio", "timewheel_tick_overrun_total",
    "empty_pull_ratio",
]  # fmt: skip


def make(now: list[int], online: int = 4) -> GatewayMetrics:
    return GatewayMetrics(
        "n1", clock_ms=lambda: now[0], online_count=lambda: online, unauth_count=lambda: 1
    )


def samples(m: GatewayMetrics) -> dict[str, float]:
    text = generate_latest(m.registry).decode()
    return {
        s.name + (str(sorted(s.labels.items())) if s.labels else ""): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_every_spec_name_is_exported_verbatim() -> None:
    text = generate_latest(make([0]).registry).decode()
    for name in SPEC_24_1_1 + SPEC_24_1_7:
        assert f"# TYPE {name} " in text or f"# TYPE {name.removesuffix('_total')} " in text, name


def test_two_nodes_in_one_process_have_separate_registries() -> None:
    a, b = make([0]), make([0])
    a.kicked.labels(reason="replaced").inc()
    assert samples(a)["kicked_total[('reason', 'replaced')]"] == 1
    assert "kicked_total[('reason', 'replaced')]" not in samples(b)


def test_windowed_gauges_compute_from_the_hooks() -> None:
    now = [1_000_000]
    m = make(now, online=4)
    m.on_open()
    m.on_open()
    m.on_auth("ok", latency_ms=40)
    m.on_auth("ok", latency_ms=40)
    m.on_auth("token_expired")
    m.on_auth("ok", latency_ms=700)
    m.on_ping(probe=True, next_ping_interval_ms=240_000)
    got = samples(m)
    assert got["connections_online[('node', 'n1')]"] == 4
    assert got["unauth_connection_count"] == 1
    assert got["auth_success_rate"] == 0.75
    assert got["auth_latency_p99"] == 0.8  # bucket bound of 700 ms
    assert got["reconnect_rate"] == 0.5  # 2 new connections per minute / 4 online
    assert got["heartbeat_pps"] == 2 / 60
    assert got["ping_backoff_trigger_rate"] == 0.25
    now[0] += 10 * 60_000
    got = samples(m)
    assert "auth_success_rate" not in got and got["reconnect_rate"] == 0  # windows emptied
