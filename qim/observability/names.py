"""The spec's metric names (24.1.1-24.1.7, and the 24.1.11 ones we already export), per process.

Why an inventory: the spec's names are a contract (dashboards and alerts are written against
them), so which process exports which name is declared once, here, and checked twice: an
integration test scrapes every process of a running stack and finds each exported name; a unit
test finds every metric the Grafana dashboard (``deploy/grafana/qim-dashboard.json``) queries
in this list.

``spec`` is the name in the spec's table, verbatim. ``exported`` are the families a scrape
shows (the ``# TYPE`` lines). A spec name of a percentile (``..._p99``) is exported as the raw
histogram it is read from (PromQL ``histogram_quantile`` aggregates across nodes, a per-node
p99 cannot), unless the process also computes the windowed value. Status:

* ``exported`` -- the family is there and gets samples when its events happen;
* ``declared`` -- the family is exported without samples until its source exists (e.g. values
  only the client SDK can measure), so dashboards and alerts can already name it;
* ``pending`` -- not exported: the feature is not built yet (session list, offline push,
  hot standby, admission quotas) or its owner has not added it. Never faked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "INVENTORY",
    "PROCESSES",
    "MetricName",
    "Process",
    "Status",
    "by_process",
    "exported_names",
    "known_names",
]

Process = Literal["gateway", "conversation", "mailbox", "notify", "rooms"]
Status = Literal["exported", "declared", "pending"]
PROCESSES: Final[tuple[Process, ...]] = ("gateway", "conversation", "mailbox", "notify", "rooms")


@dataclass(frozen=True, slots=True)
class MetricName:
    """One spec metric: where it is exported and under which family names."""

    spec: str
    section: str
    process: Process | None
    exported: tuple[str, ...]
    status: Status
    note: str = ""


def _m(
    spec: str,
    section: str,
    process: Process | None,
    exported: tuple[str, ...] | None = None,
    status: Status = "exported",
    note: str = "",
) -> MetricName:
    names = (spec,) if exported is None else exported
    return MetricName(spec, section, process, () if status == "pending" else names, status, note)


def _pending(spec: str, section: str, note: str) -> MetricName:
    return _m(spec, section, None, (), "pending", note)


INVENTORY: Final[tuple[MetricName, ...]] = (
    # 24.1.1 Connection and auth (ConnectionNode, qim/gateway/metrics.py)
    _m("connections_online", "24.1.1", "gateway"),
    _m("auth_success_rate", "24.1.1", "gateway", ("auth_success_rate", "auth_attempts_total")),
    _m("auth_latency_p99", "24.1.1", "gateway", ("auth_latency_p99", "auth_latency_seconds")),
    _m(
        "online_ready_latency_p99",
        "24.1.1",
        "gateway",
        status="declared",
        note="backlog buckets come with the login-sync latency work",
    ),
    _m("reconnect_rate", "24.1.1", "gateway"),
    _m("unauth_connection_count", "24.1.1", "gateway"),
    _m(
        "takeover_admit_duration",
        "24.1.1",
        "gateway",
        status="declared",
        note="no takeover admission ramp yet",
    ),
    _m("kicked_total", "24.1.1", "gateway"),
    _m("session_epoch_reject_total", "24.1.1", "gateway"),
    # 24.1.2 Message commit
    _m(
        "send_to_ack_latency_p99",
        "24.1.2",
        "gateway",
        ("send_to_ack_latency_p99", "send_to_ack_latency_seconds"),
        note="node side: SEND_MESSAGE read -> SEND_ACK queued",
    ),
    _m("send_to_ack_latency_p999", "24.1.2", "gateway"),
    _m(
        "conversation_seq_alloc_p99",
        "24.1.2",
        "conversation",
        ("conversation_seq_alloc_seconds",),
        note="histogram of one SEND's decision",
    ),
    _m(
        "outbox_lag_seconds_p99",
        "24.1.2",
        "conversation",
        ("outbox_lag_seconds",),
        note="observed by the FanoutCoordinator when it consumes the record",
    ),
    _m("clock_unsafe_total", "24.1.2", "conversation"),
    _m("send_reject_total", "24.1.2", "gateway"),
    _pending(
        "conversation_head_write_fail_rate",
        "24.1.2",
        "the ConversationHead is writer state made durable by the outbox transaction; "
        "there is no separate head write that could fail",
    ),
    # 24.1.3 Fanout and dispatch
    _m("fanout_lag_seconds_p99", "24.1.3", "conversation", ("fanout_lag_seconds",)),
    _m(
        "fanout_target_shards_per_message_p99",
        "24.1.3",
        "conversation",
        ("fanout_target_shards_per_message",),
    ),
    _m(
        "fanout_entries_per_sec",
        "24.1.3",
        "mailbox",
        ("mailbox_entries_written_total",),
        note="rate() of the entries the MailboxNode writes, by shard (no tenant label yet)",
    ),
    _m(
        "fanout_quota_rejected_total",
        "24.1.3",
        "conversation",
        note="sends the ConversationWriter refused FANOUT_QUOTA_EXCEEDED, by tenant",
    ),
    _pending(
        "dispatch_expand_duration_p99",
        "24.1.3",
        "per-lane expand timing not measured (qim_mailbox_writebatch_commit_seconds is "
        "per batch); mailbox_metrics.py",
    ),
    _m("dispatch_duplicate_suppressed_total", "24.1.3", "mailbox"),
    _pending("membership_version_count_per_hour", "24.1.3", "not counted yet"),
    _pending("conversation_active_member_ratio", "24.1.3", "big-group lazy mode not built"),
    _m(
        "mailbox_write_policy_switch_total",
        "24.1.3",
        "conversation",
        note="the ConversationWriter's always <-> mention_only switches, by tenant, "
        "conversation and the policy switched to (topology.md decision 46)",
    ),
    # 24.1.4 Mailbox materialization and lane watermarks (MailboxNode)
    _m("lane_watermark_stall_ms", "24.1.4", "mailbox"),
    _m("lane_watermark_skew_seq", "24.1.4", "mailbox"),
    _m("materialized_lag_seconds_p99", "24.1.4", "mailbox", ("materialized_lag_seconds",)),
    _m(
        "mailbox_write_fail_rate",
        "24.1.4",
        "mailbox",
        ("mailbox_write_fail_total", "mailbox_writebatch_total"),
    ),
    _pending(
        "mailbox_replication_lag_p99",
        "24.1.4",
        "hot standby only; not collected in phase one (spec 17.1)",
    ),
    _pending("mailbox_trim_watermark_age_days", "24.1.4", "trim watermark age not exported"),
    # 24.1.5 Correctness always-zero metrics
    _m(
        "mailbox_seq_regression_count",
        "24.1.5",
        "mailbox",
        note="moves when the fold had to hold a lane back from regressing "
        "(lane_watermark_regression_total); its other trigger, an applied seq that went "
        "backwards, cannot happen by construction (the fold skips seq <= applied)",
    ),
    _m(
        "cursor_advanced_by_push_total",
        "24.1.5",
        "gateway",
        note="a PULL_MAILBOX acked_seq past the prefix the session was served",
    ),
    _pending("silent_gap_detected_total", "24.1.5", "the acceptance probe job is not built"),
    _pending(
        "event_id_nondeterminism_total",
        "24.1.5",
        "needs a hot standby to compare with; `qim replay mailbox` checks offline",
    ),
    _m(
        "mailbox_cursor_rebase_count",
        "24.1.5",
        "mailbox",
        ("mailbox_cursor_rebase_count_total",),
        note="a prometheus_client Counter always appends _total; the verbatim name needs a "
        "Gauge like mailbox_seq_regression_count (mailbox_metrics.py). 0 by construction "
        "for now: no reply carries CURSOR_REBASED until the epoch change procedure exists "
        "(qim/agents/mailbox/reads.py: an older-epoch cursor gets CURSOR_EXPIRED)",
    ),
    _m(
        "cursor_expired_total / login_total",
        "24.1.5",
        "mailbox",
        ("cursor_expired_total", "login_total"),
    ),
    _m("cursor_invalid_total", "24.1.5", "mailbox"),
    # 24.1.6 Online push
    # (the ConnectionNode, qim/gateway/push/metrics.py)
    _m(
        "push_latency_p99",
        "24.1.6",
        "gateway",
        status="declared",
        note="MAILBOXED -> PUSHED needs the MailboxNode's write time on the PushBatch",
    ),
    _m("push_e2e_latency_p99", "24.1.6", "gateway"),
    _m(
        "push_e2e_latency_cross_region_p99",
        "24.1.6",
        "gateway",
        status="declared",
        note="one region only",
    ),
    _m("socket_send_queue_bytes_p99", "24.1.6", "gateway"),
    _m("slow_connection_degraded_ratio", "24.1.6", "gateway"),
    _m("slow_connection_closed_total", "24.1.6", "gateway"),
    _m("mailbox_dirty_sent_total", "24.1.6", "gateway"),
    _m("push_drop_by_priority_total", "24.1.6", "gateway"),
    _m("push_batch_fanout_ratio", "24.1.6", "mailbox"),
    # the MailboxNode's digest cache (qim/agents/mailbox/offline_push.py)
    _m("device_token_digest_lag", "24.1.6", "mailbox"),
    # 24.1.8 Offline push and badge (the NotificationService, qim/agents/notify/service.py)
    _m("offline_push_accepted_ratio", "24.1.8", "notify"),
    _m(
        "offline_push_latency_p95",
        "24.1.8",
        "notify",
        ("offline_push_latency_seconds",),
        note="commit (the PushTask's committed_at) -> the provider accepted it",
    ),
    _m("device_token_invalid_ratio", "24.1.8", "notify"),
    _pending("offline_push_arrival_ratio", "24.1.8", "client receipts need SDK telemetry"),
    _pending("badge_mismatch_ratio", "24.1.8", "the sampled badge recompute is not built"),
    # 24.1.7 Heartbeat and liveness (ConnectionNode)
    _m("heartbeat_pps", "24.1.7", "gateway"),
    _m("ping_interval_effective", "24.1.7", "gateway"),
    _m("ping_backoff_trigger_rate", "24.1.7", "gateway"),
    _m(
        "dead_connection_detect_ms_p99",
        "24.1.7",
        "gateway",
        status="declared",
        note="client-measured (SDK telemetry)",
    ),
    _m(
        "false_disconnect_ratio",
        "24.1.7",
        "gateway",
        status="declared",
        note="client-measured (SDK telemetry)",
    ),
    _m("timewheel_tick_overrun_total", "24.1.7", "gateway"),
    _m("empty_pull_ratio", "24.1.7", "gateway"),
    # 24.1.9 Session projection (the ConnectionNode's merge window, gateway/push_metrics.py)
    _m("session_delta_merge_ratio", "24.1.9", "gateway"),
    # 24.1.10 Chatroom (RoomWriter: qim/agents/rooms/writer.py; gateway: qim/gateway/rooms)
    _m(
        "room_broadcast_latency_p99",
        "24.1.10",
        "gateway",
        ("room_broadcast_latency",),
        note="ms histogram: RoomWriter allocation -> ROOM_BATCH queued on the socket",
    ),
    _m(
        "room_target_connection_shards_p99",
        "24.1.10",
        "rooms",
        ("room_target_connection_shards",),
        note="histogram: target ConnectionShards per room broadcast",
    ),
    _m(
        "room_replay_gap_ratio",
        "24.1.10",
        "rooms",
        ("qim_room_replay_total",),
        note="truncated / all of qim_room_replay_total{truncated}",
    ),
    _pending(
        "room_outbound_frame_rate_p99",
        "24.1.10",
        "the per-connection rate is not measured; qim_gateway_room_frames_total counts frames",
    ),
    _m("room_rate_limited_total", "24.1.10", "rooms"),
    # 24.1.11 Cache and storage (the one that exists)
    _m("presence_stale_total", "24.1.11", "mailbox"),
    # 2.4 SLO rows with no 24.1 name, measured by our own series (the dashboard's SLO panels)
    _m(
        "history paging p99",
        "2.4",
        "gateway",
        ("qim_gateway_request_latency_seconds",),
        note='kind="pull_history": PULL_HISTORY read -> HISTORY_BATCH queued, node side',
    ),
    _m(
        "SEND_ACK outcomes",
        "2.4",
        "gateway",
        ("qim_gateway_requests_forwarded_total",),
        note="the denominator of send failures: sends forwarded to the writer",
    ),
    # 15.3.1 token expiry on an open connection; 24.1.1 names no metric for it
    _m(
        "token expiry grace (15.3.1)",
        "15.3.1",
        "gateway",
        ("qim_gateway_token_expired_total",),
        note='phase="grace_write": a write refused in the grace; "closed": grace over, closed',
    ),
    # 20.4.1 rule 3: limit refusals per (tenant, dimension); the spec names no metric
    _m(
        "limit refusals per (tenant, dimension)",
        "20.4.1",
        "conversation",
        ("qim_writer_quota_refused_total",),
        note='dimension="max_conversations_per_user" (conversation_quota_exhausted)',
    ),
    _m(
        "limit refusals per (tenant, dimension) (ConnectionNode)",
        "20.4.1",
        "gateway",
        ("qim_gateway_rate_limited_total",),
        note='dimension="per_user_history_pull_rate" or "per_user_msg_rate"; each refusal is '
        "RATE_LIMITED with the retry_after_ms of the bucket's next unpromised token "
        "(qim.core.ratelimit)",
    ),
    # 15.3.2: live revocation through qim.revocations; the spec names no metric for it
    _m(
        "live sessions kicked by a revocation (ConnectionNode)",
        "15.3.2",
        "gateway",
        ("qim_gateway_revocation_kicks_total",),
        note='scope="token" | "device" | "user" (and "malformed_record" for a record that did '
        "not decode)",
    ),
    # 11.3.1: DEGRADED drops the pending real-time queue; the spec names no metric for it
    _m(
        "DEGRADED real-time drops (11.3.1)",
        "11.3.1",
        "gateway",
        ("qim_gateway_degraded_drops_total",),
        note='frame="PUSH_EVENTS" | "SESSION_DELTA" | "BADGE_UPDATE" | "READ_SYNC": queued '
        "frames purged at the degradation, and notices not queued while degraded",
    ),
    # 13.2 transient delivery; the spec names no metric
    _m(
        "TYPING decisions (13.2)",
        "13.2",
        "conversation",
        ("qim_writer_typing_total",),
        note='verdict="forward" | "merged" (merge window) | "too_large" (over '
        'large_group_member_threshold) | "alone" | "not_a_member"',
    ),
    # 26.8 (a broker restart): a producer the restart left unusable is replaced by itself
    # (qim/streams/producer.py); the spec names no metric. reason = the error that showed it
    _m(
        "Kafka producer replaced (ConnectionNode)",
        "26.8",
        "gateway",
        ("qim_gateway_producer_replaced_total",),
        note='producer="requests" (conversation + user requests) | "presence"; failed records '
        "are sent again in order",
    ),
    _m(
        "Kafka producer replaced (ConversationWriter, FanoutCoordinator)",
        "26.8",
        "conversation",
        ("qim_conversation_producer_replaced_total",),
        note='producer="writer" (a failed transaction: restored with a new, fencing producer) '
        '| "dispatch"',
    ),
    _m(
        "Kafka producer replaced (MailboxNode)",
        "26.8",
        "mailbox",
        ("qim_mailbox_producer_replaced_total",),
        note='producer="replies" (replies, pushes, user-state commands, quota records)',
    ),
)


def by_process(process: Process) -> tuple[MetricName, ...]:
    """The exported or declared metrics a scrape of ``process`` must show."""
    return tuple(m for m in INVENTORY if m.process == process and m.status != "pending")


def exported_names() -> frozenset[str]:
    """Every family name some process exports (what a dashboard may query)."""
    return frozenset(name for m in INVENTORY for name in m.exported)


def known_names() -> frozenset[str]:
    """Spec names and exported families, pending included."""
    return exported_names() | {m.spec for m in INVENTORY}
