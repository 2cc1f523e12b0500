"""B.5.1 Mailbox and dispatch runtime, B.5.2 Offline push."""

from __future__ import annotations

from qim.params.param import Param
from qim.params.units import HOUR, MINUTE, SECOND, KiB
from qim.params.values import QuietHours

__all__ = ["MailboxAndDispatchRuntime", "OfflinePush"]


class MailboxAndDispatchRuntime:
    """B.5.1: MailboxNode batching, lane stalls, cost tiers and inlining (§10, §18)."""

    mailbox_writebatch_max_entries = Param(
        "mailbox_writebatch_max_entries",
        2000,
        "count",
        "B.5.1",
        "Max entries per mailbox WriteBatch.",
        per_tenant=False,
    )
    mailbox_writebatch_commit_p99 = Param(
        "mailbox_writebatch_commit_p99",
        5,
        "ms",
        "B.5.1",
        "WriteBatch commit latency target (P99).",
        per_tenant=False,
    )
    mailbox_subtask_timeout = Param(
        "mailbox_subtask_timeout",
        30 * SECOND,
        "ms",
        "B.5.1",
        "Lane subtask timeout.",
        per_tenant=False,
    )
    lane_stall_failover = Param(
        "lane_stall_failover",
        120 * SECOND,
        "ms",
        "B.5.1",
        "A lane stalled this long triggers failover.",
        per_tenant=False,
    )
    lane_stall_alert = Param(
        "lane_stall_alert",
        30 * SECOND,
        "ms",
        "B.5.1",
        "A lane stalled this long raises a P1 alert.",
        per_tenant=False,
    )
    mailbox_takeover_rto_target = Param(
        "mailbox_takeover_rto_target",
        30 * SECOND,
        "ms",
        "B.5.1",
        "Mailbox takeover RTO target.",
        per_tenant=False,
    )
    rebuild_concurrency = Param(
        "rebuild_concurrency",
        4,
        "count",
        "B.5.1",
        "Concurrent per-conversation back-fills during REBUILD.",
        per_tenant=False,
    )
    big_group_lazy_threshold = Param(
        "big_group_lazy_threshold",
        10_000,
        "count",
        "B.5.1",
        "Equivalent member threshold derived from the §10.2.3 criteria; not independently "
        "tunable; backfill from conversation_active_member_ratio.",
        per_tenant=False,
        to_be_measured=True,
        note="10000 is Appendix B's placeholder until measured.",
    )
    read_diffusion_min_saving = Param[int | None](
        "read_diffusion_min_saving",
        None,
        "count",
        "B.5.1",
        "Min entries a message must save to enter the read-diffusion tier.",
        value_type=int,
        per_tenant=False,
        to_be_measured=True,
    )
    read_diffusion_max_active_ratio = Param[float | None](
        "read_diffusion_max_active_ratio",
        None,
        "ratio",
        "B.5.1",
        "Upper bound on the active ratio α; above it read diffusion does not pay.",
        value_type=float,
        per_tenant=False,
        to_be_measured=True,
    )
    policy_switch_exit_ratio = Param(
        "policy_switch_exit_ratio",
        0.8,
        "ratio",
        "B.5.1",
        "Hysteresis factor for leaving mention_only (§10.2.3).",
        per_tenant=False,
    )
    policy_switch_min_interval = Param(
        "policy_switch_min_interval",
        24 * HOUR,
        "ms",
        "B.5.1",
        "Min hold time after any cost-tier switch.",
        per_tenant=False,
    )
    active_window_days = Param(
        "active_window_days",
        7,
        "days",
        "B.5.1",
        "Activity window of the mention_only tier's active bitmap.",
        per_tenant=False,
    )
    quota_sustained_window = Param(
        "quota_sustained_window",
        15 * MINUTE,
        "ms",
        "B.5.1",
        "How long fanout must stay above 70 % of budget to count as sustained (§10.2.3).",
        per_tenant=False,
    )
    push_coalesce_window = Param(
        "push_coalesce_window",
        5,
        "ms",
        "B.5.1",
        "Socket write coalescing window.",
        per_tenant=False,
    )
    dedup_inflight_timeout = Param(
        "dedup_inflight_timeout",
        30 * SECOND,
        "ms",
        "B.5.1",
        "In-flight ClientDedup reservation timeout.",
        per_tenant=False,
    )
    client_pending_max_age = Param(
        "client_pending_max_age",
        24 * HOUR,
        "ms",
        "B.5.1",
        "Client marks an unconfirmed send failed after this; decoupled from the dedup window "
        "(ADR-0008): reconcile before resending after reconnect.",
        per_tenant=False,
    )
    gc_grace_seconds = Param(
        "gc_grace_seconds",
        86_400,
        "s",
        "B.5.1",
        "Defensive tombstone grace; user_mailbox_entry is never explicitly DELETEd (§18.1.3).",
        per_tenant=False,
        note="A ScyllaDB table option; our mailbox store is RocksDB (direction §1), so unused.",
    )
    membership_event_broadcast_max_members = Param(
        "membership_event_broadcast_max_members",
        500,
        "count",
        "B.5.1",
        "Above it membership changes are not broadcast, only the subject's entry (§10.1).",
        per_tenant=False,
    )
    dispatch_expand_duration_p99_target = Param(
        "dispatch_expand_duration_p99_target",
        500,
        "ms",
        "B.5.1",
        "SLO for one lane subtask's member expansion + persist (§24.1.3).",
        per_tenant=False,
    )
    lane_watermark_advance_p99 = Param(
        "lane_watermark_advance_p99",
        2 * SECOND,
        "ms",
        "B.5.1",
        "Lane watermark advance latency SLO (case 26.3.6).",
        per_tenant=False,
    )
    max_mailbox_entries_per_user = Param(
        "max_mailbox_entries_per_user",
        50_000,
        "count",
        "B.5.1",
        "Forced-trim threshold (§18.3.3); a backstop that raises P2.",
        per_tenant=False,
    )
    mailbox_entry_cap_hysteresis = Param(
        "mailbox_entry_cap_hysteresis",
        0.8,
        "ratio",
        "B.5.1",
        "Forced trim goes down to threshold × this.",
        per_tenant=False,
    )
    inline_body_budget_bytes = Param(
        "inline_body_budget_bytes",
        8 * KiB,
        "bytes",
        "B.5.1",
        "Upper bound on N × body_size for inlining bodies into entries (ADR-0005).",
        per_tenant=False,
    )
    inline_body_max_bytes = Param(
        "inline_body_max_bytes",
        2 * KiB,
        "bytes",
        "B.5.1",
        "A body above this is never inlined (ADR-0005).",
        per_tenant=False,
    )


class OfflinePush:
    """B.5.2: offline push timing and limits; all configurable per tenant (§16)."""

    push_grace_window = Param(
        "push_grace_window",
        3 * SECOND,
        "ms",
        "B.5.2",
        "No PUSHED/APPLIED this long after materialization -> push; PUSHED without APPLIED -> "
        "push_confirm_extended_window.",
    )
    push_confirm_extended_window = Param(
        "push_confirm_extended_window",
        18 * SECOND,
        "ms",
        "B.5.2",
        "Extended confirmation after PUSHED = tcp_user_timeout + push_grace_window (§16.1.2).",
    )
    push_merge_window = Param(
        "push_merge_window",
        5 * SECOND,
        "ms",
        "B.5.2",
        "Push merge window.",
    )
    push_dedup_ttl = Param(
        "push_dedup_ttl",
        10 * MINUTE,
        "ms",
        "B.5.2",
        "Push dedup TTL.",
    )
    push_rate_per_user_per_min = Param(
        "push_rate_per_user_per_min",
        10,
        "per_min",
        "B.5.2",
        "Notifications per user per minute; beyond it only the badge updates.",
    )
    push_rate_per_conversation_per_min = Param(
        "push_rate_per_conversation_per_min",
        3,
        "per_min",
        "B.5.2",
        "Notifications per conversation per minute.",
    )
    push_quiet_hours = Param[QuietHours | None](
        "push_quiet_hours",
        None,
        "composite",
        "B.5.2",
        "Daily no-push window; tenant configuration, off by default.",
        value_type=QuietHours,
    )
    push_token_inactive_days = Param(
        "push_token_inactive_days",
        90,
        "days",
        "B.5.2",
        "Inactive device push tokens expire after this.",
    )
    push_retry_max_attempts = Param(
        "push_retry_max_attempts",
        3,
        "count",
        "B.5.2",
        "Push provider retries (backoff 1 s / 4 s / 16 s); only 5xx and timeouts are retried.",
    )
    nse_pull_max_items = Param(
        "nse_pull_max_items",
        50,
        "count",
        "B.5.2",
        "iOS Notification Service Extension single pull cap.",
    )
