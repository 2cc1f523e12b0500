"""Metrics of the FanoutCoordinator, on a registry the service owns (exposed by the app later).

Spec names where one fits (§24.1.3), as the raw histograms their percentiles are read from:

* ``fanout_lag_seconds`` -- commit -> GroupDispatch acknowledged by the dispatch log, measured
  from the record's ``committed_at`` (the writer's HLC time, Unix ms) when the last dispatch of
  the record is acknowledged; a held record's wait is part of its lag. Its p99 is the spec's
  ``fanout_lag_seconds_p99``.
* ``outbox_lag_seconds`` -- commit -> the record consumed and decided here (live records
  only, recovery replays excluded); its p99 is the spec's ``outbox_lag_seconds_p99`` (24.1.2).
* ``fanout_target_shards_per_message`` -- target MailboxShards per committed message (``S``),
  counted as the dispatches it produced (a chunk split adds to it, rarely).

Everything else is ours, prefixed ``qim_fanout_``. ``fanout_entries_per_sec`` is the
MailboxNode's (entries exist only after expansion), and ``fanout_quota_rejected_total`` belongs
to admission (the ConversationWriter's L3, ``qim.agents.writer.metrics``), not here.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["FanoutMetrics"]

_LAG_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_SHARD_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class FanoutMetrics:
    """The series of one FanoutCoordinatorService."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.lag = Histogram(
            "fanout_lag_seconds", "outbox commit -> last GroupDispatch acknowledged, seconds",
            registry=r, buckets=_LAG_BUCKETS,
        )  # fmt: skip
        self.target_shards = Histogram(
            "fanout_target_shards_per_message", "dispatches (target MailboxShards) per message",
            registry=r, buckets=_SHARD_BUCKETS,
        )  # fmt: skip
        self.outbox_lag = Histogram(
            "outbox_lag_seconds", "outbox commit -> record consumed by the FanoutCoordinator",
            registry=r, buckets=_LAG_BUCKETS,
        )  # fmt: skip
        self.outbox_records = Counter(
            "qim_fanout_outbox_records_total",
            "outbox records fanned out (live, acknowledged), by kind", ["kind"], registry=r,
        )  # fmt: skip
        self.dispatches = Counter(
            "qim_fanout_dispatches_total", "GroupDispatch records acknowledged by Kafka", registry=r
        )
        self.not_ready = Counter(
            "qim_fanout_not_ready_total",
            "outbox records held because their membership version is not known, by reason",
            ["reason"], registry=r,
        )  # fmt: skip
        self.released = Counter(
            "qim_fanout_released_total", "held records that went out after all", registry=r
        )
        self.held = Gauge(
            "qim_fanout_held_records", "records currently held back (they keep the commit back)",
            registry=r,
        )  # fmt: skip
        self.stalled = Counter(
            "qim_fanout_stalled_total",
            "partitions stopped at a record the core refuses (undecodable, a membership gap)",
            registry=r,
        )
        self.batch_failures = Counter(
            "qim_fanout_batch_failures_total",
            "fetches whose produce or commit failed; their partitions are recovered again",
            registry=r,
        )
        self.commits = Counter(
            "qim_fanout_commits_total", "outbox offset commits that succeeded", registry=r
        )
        self.recoveries = Counter(
            "qim_fanout_recoveries_total",
            "partition recoveries, by basis (dormant, checkpoint, log, degraded)",
            ["basis"], registry=r,
        )  # fmt: skip
        self.replayed = Counter(
            "qim_fanout_recovery_replayed_records_total",
            "outbox records applied without producing, to rebuild state",
            registry=r,
        )
        self.recovery_seconds = Histogram(
            "qim_fanout_recovery_seconds", "time to recover one partition", registry=r
        )

    def recovered(self, basis: str, replayed: int, seconds: float) -> None:
        """One partition recovered."""
        self.recoveries.labels(basis).inc()
        self.replayed.inc(replayed)
        self.recovery_seconds.observe(seconds)
