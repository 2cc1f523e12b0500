"""Metrics of the ConversationWriter (spec 24.1.2), on the conversation app's registry.

Spec names: ``conversation_seq_alloc_seconds`` is the histogram behind
``conversation_seq_alloc_p99`` -- the time to decide one SEND_MESSAGE (dedup, membership,
``conversation_seq`` and ``last_activity_id`` allocation, the append to the partition state),
which is the writer's critical section; ``clock_unsafe_total`` counts sends refused because the
HLC went back more than ``clock_regression_reject_ms`` (always 0). ``send_to_ack_latency`` and
``send_reject_total`` are the gateway's (every outcome passes there).

Ours, prefixed ``qim_writer_``: transactions, outbox records, transaction time, and the
service's counters and partition states read at scrape time; and
``qim_writer_quota_refused_total{tenant,dimension}``, the limit refusals 20.4.1 rule 3 asks to
export per (tenant, dimension) (the spec names no metric; ``dimension`` is the parameter:
``max_conversations_per_user``, ``tenant_fanout_quota`` and the three @all limits of 11.4.2).
``fanout_quota_rejected_total{tenant}`` (24.1.3, verbatim) counts the sends refused
FANOUT_QUOTA_EXCEEDED by L3 ``tenant_fanout_quota``: steady state 0, > 0 notifies the tenant.
``mailbox_write_policy_switch_total{tenant,conversation,to}`` (24.1.3) counts the appended
messages that switch a conversation's write policy: 0 steady (hysteresis), more than one per
conversation in 24 h is a P3. Only groups that pass the admission test ever switch, so the
``conversation`` label stays bounded by the big groups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["WriterMetrics"]

_ALLOC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
_TXN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class _Status(Collector):
    """Partition states and the service's failure counters, from ``status()`` at scrape."""

    def __init__(self, status: Callable[[], Mapping[str, Any]]) -> None:
        self._status = status

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        st = self._status()
        parts = GaugeMetricFamily(
            "qim_writer_partitions", "conversation partitions by state", labels=["state"]
        )
        for state in ("assigned", "serving", "restoring"):
            parts.add_metric([state], len(st.get(state, ())))
        yield parts
        events = CounterMetricFamily(
            "qim_writer_events", "fenced / failed / restores / self_fenced", labels=["event"]
        )
        for event in ("fenced", "failed", "restores", "self_fenced"):
            events.add_metric([event], int(st.get(event, 0)))
        yield events


class WriterMetrics:
    """The writer's series; :class:`~qim.agents.writer.txn.OwnedPartition` feeds them."""

    def __init__(
        self,
        registry: CollectorRegistry,
        status: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        r = registry
        self.seq_alloc = Histogram(
            "conversation_seq_alloc_seconds", "deciding one SEND_MESSAGE (seq allocation)",
            registry=r, buckets=_ALLOC_BUCKETS,
        )  # fmt: skip
        self.clock_unsafe = Counter(
            "clock_unsafe_total", "sends refused CLOCK_UNSAFE (HLC regression), always 0",
            registry=r,
        )  # fmt: skip
        self.transactions = Counter(
            "qim_writer_transactions_total", "request batches committed as one transaction",
            registry=r,
        )  # fmt: skip
        self.outbox_records = Counter(
            "qim_writer_outbox_records_total", "outbox records committed", registry=r
        )
        self.txn_seconds = Histogram(
            "qim_writer_transaction_seconds", "begin -> commit of one transaction",
            registry=r, buckets=_TXN_BUCKETS,
        )  # fmt: skip
        self.concurrent_transactions = Counter(
            "qim_writer_concurrent_transactions_total",
            "coordinator answers CONCURRENT_TRANSACTIONS to the writer's producers (each a retry)",
            labelnames=("kind",), registry=r,
        )  # fmt: skip
        for kind in ("add_partitions", "add_offsets", "end_txn"):
            self.concurrent_transactions.labels(kind)  # 0 is a reading too
        self.quota_refused = Counter(
            "qim_writer_quota_refused_total", "requests refused at a limit (20.4.1 rule 3)",
            labelnames=("tenant", "dimension"), registry=r,
        )  # fmt: skip
        self.fanout_quota_rejected = Counter(
            "fanout_quota_rejected", "sends refused FANOUT_QUOTA_EXCEEDED (tenant_fanout_quota)",
            labelnames=("tenant",), registry=r,
        )  # fmt: skip
        self.policy_switch = Counter(
            "mailbox_write_policy_switch", "always <-> mention_only switches (10.2.3, 24.1.3)",
            labelnames=("tenant", "conversation", "to"), registry=r,
        )  # fmt: skip
        self.typing = Counter(
            "qim_writer_typing_total", "TYPING decisions (13.2) by verdict",
            labelnames=("verdict",), registry=r,
        )  # fmt: skip
        if status is not None:
            r.register(_Status(status))

    def on_policy_switch(self, tenant_id: str, conversation_id: str, policy: str) -> None:
        """A message that changes its conversation's ``mailbox_write_policy`` was appended."""
        self.policy_switch.labels(tenant_id, conversation_id, policy).inc()

    def on_typing(self, verdict: str) -> None:
        """One TYPING decided: forward / merged / too_large / alone / not_a_member."""
        self.typing.labels(verdict).inc()

    def on_send_limited(self, tenant_id: str, dimension: str) -> None:
        """One send refused by the @all gate or L3 (``dimension``: the parameter)."""
        self.quota_refused.labels(tenant_id, dimension).inc()
        if dimension == "tenant_fanout_quota":
            self.fanout_quota_rejected.labels(tenant_id).inc()

    def on_quota_refused(self, tenant_id: str) -> None:
        """One request refused ``conversation_quota_exhausted``."""
        self.quota_refused.labels(tenant_id, "max_conversations_per_user").inc()
