"""Metrics of the MailboxNode on one registry (spec 24.1.3-24.1.5 names where the spec has one).

Spec names: ``lane_watermark_stall_ms{shard,lane}`` and ``lane_watermark_skew_seq{shard}``
(24.1.4, computed at scrape time from the owned shards), ``materialized_lag_seconds`` (the
histogram behind ``materialized_lag_seconds_p99``: wall time minus the ``committed_at`` of the
newest dispatch of a committed batch), ``mailbox_write_fail_total`` and
``mailbox_writebatch_total`` (``mailbox_write_fail_rate`` is their ratio), the fold's counters
of ``qim.core.mailbox.METRICS`` under their own (spec) names, e.g.
``dispatch_duplicate_suppressed_total`` and ``stale_epoch_dispatch_dropped_total``, and the
always-zero ``mailbox_seq_regression_count`` (24.1.5): a batch whose applied seq went backwards
or whose fold had to hold a lane back from regressing. The login ratios of 24.1.5 are
``cursor_expired_total`` / ``cursor_invalid_total`` / ``mailbox_cursor_rebase_count`` over
``login_total``. Ours are prefixed ``qim_mailbox_``.

Online push (24.1.6, 24.1.11): ``presence_stale_total`` (PRESENCE_STALE received),
``presence_reconcile_diff`` (keys on which a 60 s reconcile and the cache disagreed),
``push_batch_fanout_ratio`` (recipients per PushBatch, as the running ratio of
``qim_mailbox_push_recipients_total`` over ``qim_mailbox_push_batches_total``), and ours:
``qim_mailbox_push_failed_total`` (not acknowledged), ``qim_mailbox_push_skipped_total{reason}``
(replay, presence rebuilding, planner refused), ``qim_mailbox_push_offline_users_total``.

Lane watermark advance (24.1.4, 26.3.6): ``lane_watermark_advance_seconds`` is the histogram of
:class:`~qim.agents.mailbox.observe.LaneAdvanceClock` waits (one per advanced lane per
WriteBatch); ``lane_watermark_advance_p99`` (the B.5.1 SLO's own name) is the gauge of the p99
over the most recent of them (``mailbox_observe.ADVANCE_WINDOW``).
``mailbox_entry_cap_evicted_total{tenant}`` (18.3.3, 26.1.6) counts forced-trim evictions.

Per-request reads (26.0 observation points, :mod:`~qim.agents.mailbox.observe`): histograms
``storage_keys_examined``, ``storage_rows_returned``, ``tombstones_scanned`` and
``body_join_count``, each ``{kind}`` (``pull_mailbox`` / ``sync_auth``): one observation per
answered request, so a ``_sum`` delta over one request is that request's count.

``totals`` mirrors every counter as a plain dict for the worker's ``/mailbox`` status page.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from qim.agents.mailbox.observe import ADVANCE_WINDOW, AdvanceP99, ReadStats
from qim.agents.mailbox.push import PushOutcome
from qim.agents.mailbox.shard import OwnedShard
from qim.core.mailbox import METRICS, MaterializeResult
from qim.schemas.frames import ErrorCode

__all__ = ["MailboxMetrics"]

_CAP_EVICTED: Final = "mailbox_entry_cap_evicted_total"
_READS: Final = (
    "storage_keys_examined", "storage_rows_returned", "tombstones_scanned", "body_join_count"
)  # fmt: skip
_COUNT_BUCKETS = (0, 1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)

_LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 15, 60, 300)
_WRITE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)
_LOGIN_ERRORS = {
    int(ErrorCode.CURSOR_EXPIRED): "cursor_expired_total",
    int(ErrorCode.CURSOR_INVALID): "cursor_invalid_total",
    int(ErrorCode.CURSOR_REBASED): "mailbox_cursor_rebase_count",
}


class _Lanes(Collector):
    """Per-lane gauges computed from the owned shards at scrape time."""

    def __init__(self, shards: Callable[[], Mapping[int, OwnedShard]]) -> None:
        self._shards = shards

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        stall = GaugeMetricFamily(
            "lane_watermark_stall_ms", "ms since W[lane] last advanced", labels=["shard", "lane"]
        )
        skew = GaugeMetricFamily("lane_watermark_skew_seq", "max(W) - min(W)", labels=["shard"])
        refused = GaugeMetricFamily(
            "qim_mailbox_lanes_refused", "lanes below their floor (SHARD_MOVED)", labels=["shard"]
        )
        pending = GaugeMetricFamily(
            "qim_mailbox_pending_dispatches", "dispatches waiting for a slice", labels=["shard"]
        )
        now = time.monotonic()
        for number, shard in sorted(self._shards().items()):
            label = str(number)
            for lane, at in enumerate(shard.advanced_at):
                stall.add_metric([label, str(lane)], round((now - at) * 1000))
            skew.add_metric([label], max(shard.watermarks) - min(shard.watermarks))
            refused.add_metric([label], len(shard.refused()))
            pending.add_metric([label], shard.pending)
        yield from (stall, skew, refused, pending)


class MailboxMetrics:
    """The service's series; it calls the ``on_*`` hooks."""

    def __init__(
        self, registry: CollectorRegistry, shards: Callable[[], Mapping[int, OwnedShard]]
    ) -> None:
        r = registry
        self.registry = registry
        self.totals: Tally[str] = Tally()
        self._fold = {
            name: Counter(name, f"materialize: {name}", ["shard"], registry=r)
            for name in METRICS
            if name != _CAP_EVICTED
        }
        self._cap_evicted = Counter(
            _CAP_EVICTED, "entries removed by the per-user entry cap (P2)", ["tenant"], registry=r
        )
        self._advance = Histogram(
            "lane_watermark_advance_seconds", "dispatch arrival until W[lane] covers it",
            registry=r, buckets=_LAG_BUCKETS,
        )  # fmt: skip
        self._advance_recent: deque[float] = deque(maxlen=ADVANCE_WINDOW)
        r.register(AdvanceP99(self._advance_recent))
        self._reads = {
            name: Histogram(name, f"per request: {name}", ["kind"], registry=r,
                            buckets=_COUNT_BUCKETS)
            for name in _READS
        }  # fmt: skip
        self._regression = Gauge(
            "mailbox_seq_regression_count", "non-monotonic mailbox_seq seen (always 0)", registry=r
        )
        self._batches = Counter("mailbox_writebatch_total", "WriteBatches", ["shard"], registry=r)
        self._fails = Counter(
            "mailbox_write_fail_total", "failed materialize/WriteBatch", ["shard"], registry=r
        )
        self._write_seconds = Histogram(
            "qim_mailbox_writebatch_commit_seconds", "one WriteBatch commit",
            registry=r, buckets=_WRITE_BUCKETS,
        )  # fmt: skip
        self._lag = Histogram(
            "materialized_lag_seconds", "now - committed_at of the newest dispatch committed",
            registry=r, buckets=_LAG_BUCKETS,
        )  # fmt: skip
        self._logins = Counter("login_total", "SyncAuthRequests answered", registry=r)
        self._login_errors = {
            code: Counter(name, f"logins answered {name}", registry=r)
            for code, name in _LOGIN_ERRORS.items()
        }
        self._replies = Counter(
            "qim_mailbox_replies_total", "replies by request kind and outcome",
            ["kind", "outcome"], registry=r,
        )  # fmt: skip
        self._records = Counter(
            "qim_mailbox_records_total", "consumed records by topic and outcome",
            ["topic", "outcome"], registry=r,
        )  # fmt: skip
        self._expired = Counter(
            "qim_mailbox_sweep_removed_total", "retention sweep removals", ["what"], registry=r
        )
        self._push_batches = Counter(
            "qim_mailbox_push_batches_total", "PushBatches enqueued", registry=r
        )
        self._push_recipients = Counter(
            "qim_mailbox_push_recipients_total", "recipients of enqueued PushBatches", registry=r
        )
        self._fanout = Gauge(
            "push_batch_fanout_ratio", "average recipients (sockets) per PushBatch", registry=r
        )
        self._push_failed = Counter(
            "qim_mailbox_push_failed_total", "PushBatches not acknowledged", registry=r
        )
        self._push_skipped = Counter(
            "qim_mailbox_push_skipped_total", "written groups not pushed", ["reason"], registry=r
        )
        self._offline = Counter(
            "qim_mailbox_push_offline_users_total", "recipients with no live device", registry=r
        )
        self._stale = Counter("presence_stale_total", "PRESENCE_STALE received", registry=r)
        self._reconcile_diff = Counter(
            "presence_reconcile_diff", "keys a presence reconcile corrected", registry=r
        )
        self._checkpoints = Counter(
            "qim_mailbox_checkpoints_total", "shard checkpoints by outcome (19.3)", ["outcome"],
            registry=r,
        )  # fmt: skip
        self._checkpoint_seconds = Histogram(
            "qim_mailbox_checkpoint_seconds", "one shard checkpoint, taken and shipped",
            registry=r, buckets=_LAG_BUCKETS,
        )  # fmt: skip
        self._checkpoint_bytes = Gauge(
            "checkpoint_bytes", "bytes of the newest shipped shard checkpoint (B.7)", registry=r
        )
        r.register(_Lanes(shards))

    def on_checkpoint(self, outcome: str, seconds: float, size: int) -> None:
        """One checkpoint attempt: ``shipped`` (with its time and size) or ``failed``."""
        self._checkpoints.labels(outcome=outcome).inc()
        self._add(f"checkpoints_{outcome}")
        if outcome == "shipped":
            self._checkpoint_seconds.observe(seconds)
            self._checkpoint_bytes.set(size)

    def on_restore(self) -> None:
        """A takeover restored a shipped checkpoint onto an empty disk."""
        self._checkpoints.labels(outcome="restored").inc()
        self._add("checkpoints_restored")

    def _add(self, name: str, amount: int = 1) -> None:
        self.totals[name] += amount

    def on_batch(
        self,
        shard: int,
        result: MaterializeResult,
        seconds: float,
        regressed: bool,
        newest_committed_at_ms: int = 0,
        advance_waits: Sequence[float] = (),
    ) -> None:
        """One committed WriteBatch; ``newest_committed_at_ms`` (0: none) feeds the lag,
        ``advance_waits`` the lane watermark advance latency."""
        label = str(shard)
        for name, value in result.metrics.items():
            if value and name in self._fold:
                self._fold[name].labels(label).inc(value)
                self._add(name, value)
        for tenant, evicted in result.cap_evicted.items():
            self._cap_evicted.labels(tenant).inc(evicted)
            self._add(_CAP_EVICTED, evicted)
        for wait in advance_waits:
            self._advance.observe(wait)
            self._advance_recent.append(wait)
        self._add("lane_watermark_advances", len(advance_waits))
        self._batches.labels(label).inc()
        self._add("mailbox_writebatch_total")
        self._write_seconds.observe(seconds)
        if regressed or result.metrics.get("lane_watermark_regression_total"):
            self._regression.inc()
            self._add("mailbox_seq_regression_count")
        if newest_committed_at_ms:
            self._lag.observe(max(time.time() - newest_committed_at_ms / 1000, 0.0))

    def on_write_failed(self, shard: int) -> None:
        self._fails.labels(str(shard)).inc()
        self._add("mailbox_write_fail_total")

    def on_record(self, topic: str, outcome: str) -> None:
        self._records.labels(topic, outcome).inc()
        self._add(f"records:{topic}:{outcome}")

    def on_reply(self, kind: str, error_code: int | None) -> None:
        outcome = "ok" if error_code is None else _outcome(error_code)
        self._replies.labels(kind, outcome).inc()
        self._add(f"replies:{kind}:{outcome}")
        if kind == "sync_auth":
            self._logins.inc()
            self._add("login_total")
            name = _LOGIN_ERRORS.get(error_code or 0)
            if name is not None and error_code is not None:
                self._login_errors[error_code].inc()
                self._add(name)

    def on_read(self, kind: str, stats: ReadStats) -> None:
        """One answered request's store reads (26.0 observation points)."""
        for name in _READS:
            value: int | None = getattr(stats, name)
            if value is not None:
                self._reads[name].labels(kind).observe(value)
                self._add(name, value)

    def on_sweep(self, metrics: Mapping[str, int]) -> None:
        self._add("retention_sweeps_total")
        for name, value in metrics.items():
            if value:
                self._expired.labels(name).inc(value)
                self._add(name, value)

    def on_push(self, outcome: PushOutcome) -> None:
        """One fold's push decision (before any acknowledgement)."""
        batches = sum(len(p.batches) for p in outcome.plans)
        recipients = sum(p.recipient_count for p in outcome.plans)
        offline = sum(len(p.offline_users) for p in outcome.plans)
        self._push_batches.inc(batches)
        self._push_recipients.inc(recipients)
        self._offline.inc(offline)
        self._add("push_batches_total", batches)
        self._add("push_recipients_total", recipients)
        self._add("push_offline_users_total", offline)
        if self.totals["push_batches_total"]:
            self._fanout.set(
                self.totals["push_recipients_total"] / self.totals["push_batches_total"]
            )
        for reason, count in (
            ("replay", outcome.skipped_replay),
            ("presence_rebuilding", outcome.skipped_rebuilding),
            ("planner_refused", outcome.failed_plans),
        ):
            if count:
                self._push_skipped.labels(reason).inc(count)
                self._add(f"push_skipped:{reason}", count)

    def on_push_acked(self, acknowledged: int, failed: int) -> None:
        self._add("push_acknowledged_total", acknowledged)
        if failed:
            self._push_failed.inc(failed)
            self._add("push_failed_total", failed)

    def on_presence_stale(self, dropped: bool) -> None:
        self._stale.inc()
        self._add("presence_stale_total")
        self._add(f"presence_stale:{'dropped' if dropped else 'ignored'}")

    def on_reconcile(self, diff: int) -> None:
        self._add("presence_reconciles_total")
        if diff:
            self._reconcile_diff.inc(diff)
            self._add("presence_reconcile_diff", diff)


def _outcome(code: int) -> str:
    try:
        return ErrorCode(code).name.lower()
    except ValueError:
        return "error"
