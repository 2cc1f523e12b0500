"""Metrics of request forwarding and reply delivery, on the node's registry.

The spec's names where one fits (§24.1.2): ``send_to_ack_latency_p99`` / ``_p999`` (windowed,
5 min) and the raw ``send_to_ack_latency_seconds`` histogram, ``send_reject_total{code}``. The
spec defines send-to-ack latency on the client; a ConnectionNode sees the server-side part
(SEND_MESSAGE read -> SEND_ACK queued), which is what an operator can act on per node. The
gateway is the single place every send outcome passes (its own refusals and the writer's
ERRORs), so ``send_reject_total`` is counted here only.

Everything else is ours, prefixed ``qim_gateway_``: what was forwarded, refused before Kafka,
failed to produce, and what became of every to-gateway record (delivered, stale
session_epoch, no session, unknown kind, malformed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from qim.gateway.windows import WindowedQuantile

__all__ = ["RoutingMetrics"]

_WINDOW_MS = 5 * 60_000
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 0.8, 1, 2.5, 5, 10)


class _SendToAck(Collector):
    """``send_to_ack_latency_p99`` / ``_p999`` over the last 5 minutes, in seconds."""

    def __init__(self, metrics: RoutingMetrics) -> None:
        self._m = metrics

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        now = self._m.clock_ms()
        for name, q in (("send_to_ack_latency_p99", 0.99), ("send_to_ack_latency_p999", 0.999)):
            family = GaugeMetricFamily(
                name, f"SEND_MESSAGE -> SEND_ACK q{q} seconds, 5 min", labels=[]
            )
            value = self._m.send_to_ack_window.quantile(now, q)
            if value is not None:
                family.add_metric([], value / 1000)
            yield family


class RoutingMetrics:
    """The ConversationRouter's series; the router calls the ``on_*`` hooks."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        clock_ms: Callable[[], int],
        in_flight: Callable[[], int],
        queued: Callable[[], int],
    ) -> None:
        r = registry
        self.clock_ms = clock_ms
        self.send_to_ack = Histogram(
            "send_to_ack_latency_seconds", "SEND_MESSAGE read -> SEND_ACK queued (node side)",
            registry=r, buckets=_LATENCY_BUCKETS,
        )  # fmt: skip
        self.send_reject = Counter(
            "send_reject_total", "SEND_MESSAGE answered with ERROR, by code", ["code"], registry=r
        )
        self.forwarded = Counter(
            "qim_gateway_requests_forwarded_total",
            "requests acknowledged by Kafka on the conversation-requests topic",
            ["kind"], registry=r,
        )  # fmt: skip
        self.refused = Counter(
            "qim_gateway_requests_refused_total",
            "requests answered by the node without forwarding (malformed conversation id)",
            ["kind"], registry=r,
        )  # fmt: skip
        self.failed = Counter(
            "qim_gateway_requests_failed_total",
            "requests not produced (Kafka error or full queue), answered RATE_LIMITED",
            ["kind", "reason"], registry=r,
        )  # fmt: skip
        self.rate_limited = Counter(
            "qim_gateway_rate_limited_total",
            "requests refused RATE_LIMITED by a per-user limit of this node (20.4.1 rule 3)",
            ["tenant", "dimension"], registry=r,
        )  # fmt: skip
        self.unrouted = Counter(
            "qim_gateway_frames_unrouted_total",
            "business frames without a route on this node yet, dropped", ["frame"], registry=r,
        )  # fmt: skip
        self.records = Counter(
            "qim_gateway_to_gateway_records_total",
            "to-gateway records by kind and what became of them", ["kind", "result"], registry=r,
        )  # fmt: skip
        self.latency = Histogram(
            "qim_gateway_request_latency_seconds", "request read -> reply queued, by kind",
            ["kind"], registry=r, buckets=_LATENCY_BUCKETS,
        )  # fmt: skip
        Gauge(
            "qim_gateway_requests_in_flight", "forwarded requests awaiting their reply",
            registry=r,
        ).set_function(in_flight)  # fmt: skip
        Gauge(
            "qim_gateway_request_queue_depth", "requests waiting for the producer", registry=r
        ).set_function(queued)
        self.send_to_ack_window = WindowedQuantile(_WINDOW_MS)
        r.register(_SendToAck(self))

    def on_reply(self, kind: str, latency_ms: int | None, *, ack: bool, error: str | None) -> None:
        """A reply written to its connection; ``latency_ms`` None when the request is unknown
        here (the node restarted, or the entry expired)."""
        if latency_ms is not None:
            self.latency.labels(kind=kind).observe(latency_ms / 1000)
        if kind != "send":
            return
        if error is not None:
            self.send_reject.labels(code=error).inc()
        elif ack and latency_ms is not None:
            self.send_to_ack.observe(latency_ms / 1000)
            self.send_to_ack_window.observe(self.clock_ms(), latency_ms)
