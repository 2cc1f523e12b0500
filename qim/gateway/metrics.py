"""ConnectionNode metrics: the names of §24.1.1 (connection and auth), §24.1.6 (online push,
``push_metrics.py``) and §24.1.7 (heartbeat) verbatim, in a per-node ``CollectorRegistry`` so
several nodes can share one process.

Two kinds of series:

* the spec's names. Counters and gauges where the spec defines one (``connections_online``,
  ``kicked_total``, ``timewheel_tick_overrun_total`` ...); windowed values the spec defines as
  rates or percentiles (``auth_success_rate`` over 5 min, ``auth_latency_p99``,
  ``reconnect_rate``, ``heartbeat_pps``, ``ping_backoff_trigger_rate``) are computed here per
  node. A window with no data exports no sample rather than a made-up 0 or 1.
* raw counters/histograms (``auth_attempts_total``, ``auth_latency_seconds`` ...) so PromQL can
  aggregate across nodes, which a per-node p99 cannot.

Declared without samples until their stage exists: ``online_ready_latency_p99`` (needs the
backlog buckets of the push stage), ``takeover_admit_duration`` (takeover),
``session_epoch_reject_total`` stays 0 until PushBatch, and the client-measured
``dead_connection_detect_ms_p99`` and ``false_disconnect_ratio`` (a server cannot see them; the
SDK reports them later). ``empty_pull_ratio`` is computed from the MAILBOX_BATCHes served.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from qim.gateway.push.metrics import PushMetrics, SendQueue
from qim.gateway.windows import WindowedCounter, WindowedQuantile

__all__ = ["GatewayMetrics"]

_MIN = 60_000
_NO_SAMPLES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("online_ready_latency_p99", "AUTH -> ONLINE_READY p99 seconds by backlog", ("backlog",)),
    ("takeover_admit_duration", "seconds to admit all connections after a takeover", ()),
    ("dead_connection_detect_ms_p99", "client-measured dead-link detection p99 (SDK)", ()),
    ("false_disconnect_ratio", "connections with traffic closed for timeout (SDK)", ()),
)


class _Windowed(Collector):
    """The spec's windowed gauges, computed at scrape time."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._m = metrics

    def describe(self) -> list[Metric]:
        return []  # computed lazily; no help text needed at registration

    def collect(self) -> Iterator[Metric]:
        m, now = self._m, self._m.clock_ms()
        online = m.online_count()
        attempts = m.auth_window.total(now)
        yield _gauge("auth_success_rate", "AUTH successes / attempts, 5 min", (
            m.auth_ok_window.total(now) / attempts if attempts else None))  # fmt: skip
        p99 = m.auth_latency_window.quantile(now, 0.99)
        yield _gauge("auth_latency_p99", "AUTH -> AUTH_OK p99 seconds, 5 min",
                     None if p99 is None else p99 / 1000)  # fmt: skip
        yield _gauge("reconnect_rate", "new connections per minute / online connections", (
            m.connect_window.total(now) / online if online else None))  # fmt: skip
        yield _gauge("heartbeat_pps", "PING + PONG per second, last minute",
                     m.heartbeat_window.total(now) / 60)  # fmt: skip
        yield _gauge("ping_backoff_trigger_rate", "PING{probe} per online connection, 1 h", (
            m.probe_window.total(now) / online if online else None))  # fmt: skip
        pulls = m.pull_window.total(now)
        yield _gauge("empty_pull_ratio", "share of PULL_MAILBOX returning 0 items, 5 min", (
            m.empty_pull_window.total(now) / pulls if pulls else None))  # fmt: skip
        for name, doc, labels in _NO_SAMPLES:
            yield GaugeMetricFamily(name, doc, labels=list(labels))


def _gauge(name: str, doc: str, value: float | None) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=[])
    if value is not None:
        family.add_metric([], value)
    return family


class GatewayMetrics:
    """All series of one ConnectionNode; the node calls the ``on_*`` hooks."""

    def __init__(
        self,
        node_id: str,
        *,
        clock_ms: Callable[[], int],
        online_count: Callable[[], int],
        unauth_count: Callable[[], int],
        registry: CollectorRegistry | None = None,
        send_queues: Callable[[], list[SendQueue]] = list,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self.clock_ms = clock_ms
        self.online_count = online_count
        r = self.registry
        self.push = PushMetrics(r, clock_ms=clock_ms, send_queues=send_queues)
        Gauge("connections_online", "online (authenticated) connections per node", ["node"],
              registry=r).labels(node=node_id).set_function(online_count)  # fmt: skip
        Gauge("unauth_connection_count", "connections established, AUTH not completed",
              registry=r).set_function(unauth_count)  # fmt: skip
        self.kicked = Counter("kicked_total", "KICKED sent, by reason", ["reason"], registry=r)
        self.epoch_rejects = Counter(
            "session_epoch_reject_total", "pushes to an old session_epoch dropped", registry=r
        )
        self.ping_interval = Histogram(
            "ping_interval_effective", "server-issued next_ping_interval_ms", registry=r,
            buckets=(30_000, 60_000, 90_000, 120_000, 180_000, 240_000, float("inf")),
        )  # fmt: skip
        self.tick_overruns = Counter(
            "timewheel_tick_overrun_total", "timing-wheel ticks that overran", registry=r
        )
        self.unknown_opcodes = Counter(
            "unknown_opcode_dropped", "frames of unknown opcode dropped (§27.1.2)", registry=r
        )
        self.auth_attempts = Counter("auth_attempts_total", "AUTH results", ["result"], registry=r)
        self.auth_latency = Histogram("auth_latency_seconds", "AUTH -> AUTH_OK", registry=r)
        self.opened = Counter("connections_opened_total", "connections accepted", registry=r)
        self.closed = Counter(
            "connections_closed_total", "closes by reason", ["reason"], registry=r
        )
        self.refused = Counter(
            "connect_refused_total", "admission refusals", ["reason"], registry=r
        )
        self.protocol_errors = Counter(
            "protocol_errors_total", "codec verdicts", ["error"], registry=r
        )
        self.pings = Counter("pings_total", "PING received", ["probe"], registry=r)
        self.presence = Counter("presence_records_total", "presence writes", ["kind"], registry=r)
        self.limit_exceeded = Counter("limit_exceeded_total", "B.5 field limits hit", registry=r)
        self.mailbox_batches = Counter(
            "qim_gateway_mailbox_batches_total",
            "PULL_MAILBOX answers written: entries / empty / the ERROR code", ["result"],
            registry=r,
        )  # fmt: skip
        self.sync_complete = Counter(
            "qim_gateway_sync_complete_total",
            "SYNC_COMPLETE verdicts: online_ready / sync_incomplete (§9.3.4)", ["result"],
            registry=r,
        )  # fmt: skip
        self.token_expired = Counter(
            "qim_gateway_token_expired_total",
            "ERROR{TOKEN_EXPIRED} on open connections: grace_write / closed (§15.3.1)", ["phase"],
            registry=r,
        )  # fmt: skip
        self.auth_window = WindowedCounter(5 * _MIN)
        self.auth_ok_window = WindowedCounter(5 * _MIN)
        self.auth_latency_window = WindowedQuantile(5 * _MIN)
        self.connect_window = WindowedCounter(_MIN)
        self.heartbeat_window = WindowedCounter(_MIN)
        self.probe_window = WindowedCounter(60 * _MIN, bucket_ms=_MIN)
        self.pull_window = WindowedCounter(5 * _MIN)
        self.empty_pull_window = WindowedCounter(5 * _MIN)
        r.register(_Windowed(self))

    def on_open(self) -> None:
        self.opened.inc()
        self.connect_window.add(self.clock_ms())

    def on_auth(self, result: str, latency_ms: float | None = None) -> None:
        now = self.clock_ms()
        self.auth_attempts.labels(result=result).inc()
        self.auth_window.add(now)
        if result == "ok":
            self.auth_ok_window.add(now)
        if latency_ms is not None:
            self.auth_latency.observe(latency_ms / 1000)
            self.auth_latency_window.observe(now, latency_ms)

    def on_ping(self, probe: bool, next_ping_interval_ms: int) -> None:
        now = self.clock_ms()
        self.pings.labels(probe=str(probe).lower()).inc()
        self.heartbeat_window.add(now, 2)  # the PING and its PONG (§15.1.5 formula)
        self.ping_interval.observe(next_ping_interval_ms)
        if probe:
            self.probe_window.add(now)

    def on_count(self, name: str, label: str) -> None:
        """``Count`` actions of the session."""
        if self.push.on_count(name, label):
            return
        if name == "unknown_opcode_dropped":
            self.unknown_opcodes.inc()
        elif name == "protocol_error":
            self.protocol_errors.labels(error=label or "unknown").inc()
        elif name == "limit_exceeded":
            self.limit_exceeded.inc()
        elif name == "mailbox_batch":
            self.mailbox_batches.labels(result=label).inc()
            if label in ("entries", "empty"):
                now = self.clock_ms()
                self.pull_window.add(now)
                if label == "empty":
                    self.empty_pull_window.add(now)
        elif name == "sync_complete":
            self.sync_complete.labels(result=label).inc()
        elif name == "token_expired":
            self.token_expired.labels(phase=label).inc()
