"""Online-push metrics of the ConnectionNode: §24.1.6 names verbatim, plus two observation
points of §26.0 (``body_encode_count``, ``cursor_advanced_by_push_total``).

Why each is computed where it is:

* ``push_e2e_latency_p99``: COMMITTED (the batch's ``created_at``) -> PUSHED (PUSH_EVENTS in
  the socket's send buffer, 11.2), a 5-minute window in seconds like ``auth_latency_p99``.
  ``push_latency_p99`` (MAILBOXED -> PUSHED) and ``push_e2e_latency_cross_region_p99`` are
  declared without samples: a PushBatch carries no MAILBOXED time and there is one region.
* ``socket_send_queue_bytes_p99`` and ``slow_connection_degraded_ratio`` are read from the
  live connections at scrape time (nothing to keep in between).
* ``push_batch_fanout_ratio``: sockets written per PushBatch over 10 minutes.
* ``body_encode_count``: how many times a batch's shared body was encoded on this node -- one
  per PushBatch with a live recipient however many sockets it reaches (10.3, 26.3). Exported
  untyped so the sample keeps the spec's name.
* ``session_delta_merge_ratio`` (24.1.9): SESSION_DELTA / BADGE_UPDATE frames merged away
  in the ``session_delta_merge_window`` over those offered to it, 10 minutes (the alert reads
  "< 10 % for 10 min"); absent while nothing was offered or the window is 0.
* ``cursor_advanced_by_push_total``: the gateway never moves a device cursor, so the only way
  one advances past contiguity is a client that moved it on PUSH_EVENTS (6.8, I-22). The node
  counts every PULL_MAILBOX whose ``acked_seq`` lies beyond the contiguous prefix of
  MAILBOX_BATCHes this session served (``SyncProgress.acked_past_contiguity``); always 0 for
  a correct SDK, the P1 alert of 24.1.5 otherwise.

``device_token_digest_lag`` belongs to the MailboxNode and is not exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric, UnknownMetricFamily
from prometheus_client.registry import Collector

from qim.gateway.windows import WindowedCounter, WindowedQuantile

__all__ = ["PushMetrics", "SendQueue"]

_MIN = 60_000
SendQueue = tuple[int, bool]
"""One connection at scrape time: (buffered send octets, in DEGRADED)."""


class _Scraped(Collector):
    def __init__(self, metrics: PushMetrics) -> None:
        self._m = metrics

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        m, now = self._m, self._m.clock_ms()
        queues = m.send_queues()
        p99 = m.e2e_window.quantile(now, 0.99)
        yield _gauge("push_e2e_latency_p99", "COMMITTED -> PUSHED p99 seconds, 5 min",
                     None if p99 is None else p99 / 1000)  # fmt: skip
        yield GaugeMetricFamily("push_latency_p99", "MAILBOXED -> PUSHED p99 (not measured)")
        yield GaugeMetricFamily(
            "push_e2e_latency_cross_region_p99", "cross-region COMMITTED -> PUSHED p99 (one region)"
        )
        yield _gauge("socket_send_queue_bytes_p99", "p99 of per-connection send queue octets",
                     _p99([b for b, _ in queues]) if queues else None)  # fmt: skip
        yield _gauge("slow_connection_degraded_ratio", "share of connections in DEGRADED",
                     sum(1 for _, d in queues if d) / len(queues) if queues else None)  # fmt: skip
        batches = m.batch_window.total(now)
        yield _gauge("push_batch_fanout_ratio", "sockets written per PushBatch, 10 min",
                     m.socket_window.total(now) / batches if batches else None)  # fmt: skip
        offered = m.session_offered.total(now)
        yield _gauge("session_delta_merge_ratio", "session frames merged away in the window, 10m",
                     m.session_merged.total(now) / offered if offered else None)  # fmt: skip
        encodes = UnknownMetricFamily("body_encode_count", "shared push bodies encoded (10.3)")
        encodes.add_metric([], m.body_encodes)
        yield encodes


def _gauge(name: str, doc: str, value: float | None) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=[])
    if value is not None:
        family.add_metric([], value)
    return family


def _p99(values: Sequence[int]) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))])


class PushMetrics:
    """The push series of one node; the router and the connections' counts feed it."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        clock_ms: Callable[[], int],
        send_queues: Callable[[], list[SendQueue]] = list,
    ) -> None:
        r = registry
        self.clock_ms = clock_ms
        self.send_queues = send_queues
        self.body_encodes = 0
        self.slow_closed = Counter(
            "slow_connection_closed", "closed as slow consumers (hard watermark, no consumption,"
            " node budget)", ["reason"], registry=r,
        )  # fmt: skip
        self.dirty_sent = Counter(
            "mailbox_dirty_sent", "mailbox_dirty signals sent (ERROR or PONG)", registry=r
        )
        self.drops = Counter(
            "push_drop_by_priority", "frames dropped by the node budget", ["class"], registry=r
        )
        self.degraded_drops = Counter(
            "qim_gateway_degraded_drops",
            "real-time frames a DEGRADED connection dropped (11.3.1): PUSH_EVENTS, the queued "
            "notices, or a SESSION_DELTA / BADGE_UPDATE / READ_SYNC while degraded",
            ["frame"], registry=r,
        )  # fmt: skip
        self.cursor_advanced = Counter(
            "cursor_advanced_by_push", "acked_seq beyond the served prefix (always 0)",
            registry=r,
        )  # fmt: skip
        self.flow = Counter(
            "qim_gateway_flow_transitions", "flow-state changes by new state (11.3.1)", ["state"],
            registry=r,
        )  # fmt: skip
        self.budget_steps = Counter(
            "qim_gateway_send_budget_steps", "11.3.3 ladder steps taken", ["step"], registry=r
        )
        self.pushed = Counter("qim_gateway_pushes", "PUSH_EVENTS frames written", registry=r)
        self.e2e_window = WindowedQuantile(5 * _MIN)
        self.batch_window = WindowedCounter(10 * _MIN, bucket_ms=10_000)
        self.socket_window = WindowedCounter(10 * _MIN, bucket_ms=10_000)
        self.session_offered = WindowedCounter(10 * _MIN, bucket_ms=10_000)
        self.session_merged = WindowedCounter(10 * _MIN, bucket_ms=10_000)
        r.register(_Scraped(self))

    def on_batch(self, *, encodes: int, sockets: int, created_at_ms: int) -> None:
        """One PushBatch expanded: its shared body encoded ``encodes`` times (1 with a live
        recipient), ``sockets`` PUSH_EVENTS written into send buffers now."""
        now = self.clock_ms()
        self.body_encodes += encodes
        self.batch_window.add(now)
        self.socket_window.add(now, sockets)
        self.pushed.inc(sockets)
        for _ in range(sockets):
            self.e2e_window.observe(now, max(0, now - created_at_ms))

    def on_session_frame(self, merged_away: int) -> None:
        """One SESSION_DELTA / BADGE_UPDATE offered to the merge window; ``merged_away``
        frames (0 or 1) will never be sent because of it."""
        now = self.clock_ms()
        self.session_offered.add(now)
        if merged_away:
            self.session_merged.add(now, merged_away)

    def on_count(self, name: str, label: str) -> bool:
        """The sessions' and connections' push counts; False when ``name`` is not one."""
        if name == "mailbox_dirty_sent":
            self.dirty_sent.inc()
        elif name == "slow_connection_closed":
            self.slow_closed.labels(reason=label or "unknown").inc()
        elif name == "flow":
            self.flow.labels(state=label).inc()
        elif name == "degraded_drop":
            self.degraded_drops.labels(frame=label).inc()
        elif name == "push_drop":
            self.drops.labels(label).inc()
        elif name == "budget_step":
            self.budget_steps.labels(step=label).inc()
        else:
            return False
        return True
