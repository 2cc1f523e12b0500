"""B.5.3 Consistency and disaster recovery."""

from __future__ import annotations

from qim.params.param import Param
from qim.params.units import DAY, HOUR, MINUTE, SECOND
from qim.params.values import SustainedShare

__all__ = ["ConsistencyAndDisasterRecovery"]


class ConsistencyAndDisasterRecovery:
    """B.5.3: writer leases, checkpoints, backups, RPO/RTO, deletion and keys (§19-§21)."""

    writer_lease_ttl = Param(
        "writer_lease_ttl",
        15 * SECOND,
        "ms",
        "B.5.3",
        "Alias of shard_lease_ttl; tuning it alone breaks the anti-split-brain inequality "
        "(§19.2.2).",
        per_tenant=False,
        alias_of="shard_lease_ttl",
    )
    writer_lease_renew_interval = Param(
        "writer_lease_renew_interval",
        5 * SECOND,
        "ms",
        "B.5.3",
        "ConversationWriter lease renewal interval.",
        per_tenant=False,
    )
    writer_failover_wait = Param(
        "writer_failover_wait",
        25 * SECOND,
        "ms",
        "B.5.3",
        "Wait before a new writer takes over; must be > shard_lease_ttl.",
        per_tenant=False,
    )
    writer_self_fence_deadline = Param(
        "writer_self_fence_deadline",
        12 * SECOND,
        "ms",
        "B.5.3",
        "A writer whose self-renewal has failed this long stops writing, before its lease lapses.",
        per_tenant=False,
    )
    checkpoint_interval = Param(
        "checkpoint_interval",
        15 * MINUTE,
        "ms",
        "B.5.3",
        "Mailbox checkpoint interval.",
        per_tenant=False,
    )
    checkpoint_full_multiple = Param(
        "checkpoint_full_multiple",
        8,
        "count",
        "B.5.3",
        "A full checkpoint every this many incrementals.",
        per_tenant=False,
    )
    backup_retention_days = Param(
        "backup_retention_days",
        35,
        "days",
        "B.5.3",
        "Backup retention.",
        per_tenant=False,
    )
    rpo_target = Param(
        "rpo_target",
        15 * MINUTE,
        "ms",
        "B.5.3",
        "Recovery point objective (upper bound).",
        per_tenant=False,
    )
    shard_rto_target = Param(
        "shard_rto_target",
        10 * MINUTE,
        "ms",
        "B.5.3",
        "Single-shard recovery time objective; caps T_recover in §19.3.3.",
        per_tenant=False,
    )
    region_rto_target = Param(
        "region_rto_target",
        60 * MINUTE,
        "ms",
        "B.5.3",
        "Region recovery time objective.",
        per_tenant=False,
    )
    home_region_migration_threshold = Param(
        "home_region_migration_threshold",
        SustainedShare(ratio=0.7, window_ms=7 * DAY),
        "composite",
        "B.5.3",
        "Share of a conversation's active members in another region, held this long, that "
        "triggers Home Region migration.",
        per_tenant=False,
    )
    hot_retention_days = Param(
        "hot_retention_days",
        30,
        "days",
        "B.5.3",
        "History of retention_class default stays hot this long, then is archived (§21.1).",
    )
    dsar_response_days = Param(
        "dsar_response_days",
        30,
        "days",
        "B.5.3",
        "Data subject request response deadline.",
    )
    user_deletion_grace = Param(
        "user_deletion_grace",
        7 * DAY,
        "ms",
        "B.5.3",
        "Revocable window after a user deletion request.",
    )
    region_failover_retry_after_ms = Param(
        "region_failover_retry_after_ms",
        2000,
        "ms",
        "B.5.3",
        "retry_after_ms of ERROR{REGION_FAILOVER}; callers add ±30 % jitter (§19.2).",
        per_tenant=False,
    )
    send_retry_budget = Param(
        "send_retry_budget",
        60 * SECOND,
        "ms",
        "B.5.3",
        "Client's total send retry budget during a region switch (§19.2).",
        per_tenant=False,
    )
    takeover_catchup_lag_entries = Param(
        "takeover_catchup_lag_entries",
        1000,
        "count",
        "B.5.3",
        "Standby catch-up lag below which takeover may proceed (§19.3.2).",
        per_tenant=False,
    )
    takeover_catchup_stable_window = Param(
        "takeover_catchup_stable_window",
        5 * SECOND,
        "ms",
        "B.5.3",
        "How long the catch-up lag must hold without worsening (§19.3.2).",
        per_tenant=False,
    )
    disaster_rto_target = Param(
        "disaster_rto_target",
        4 * HOUR,
        "ms",
        "B.5.3",
        "RTO when checkpoint and log are both damaged (§19.3.4).",
        per_tenant=False,
    )
    backup_full_interval = Param(
        "backup_full_interval",
        24 * HOUR,
        "ms",
        "B.5.3",
        "Full backup interval (§19.3.5).",
        per_tenant=False,
    )
    backup_incremental_interval = Param(
        "backup_incremental_interval",
        5 * MINUTE,
        "ms",
        "B.5.3",
        "Incremental backup interval (§19.3.5).",
        per_tenant=False,
    )
    internal_cert_ttl = Param(
        "internal_cert_ttl",
        24 * HOUR,
        "ms",
        "B.5.3",
        "Internal mTLS certificate lifetime (§20.4).",
        per_tenant=False,
    )
    mailbox_store_shadow_read_ratio = Param(
        "mailbox_store_shadow_read_ratio",
        0.01,
        "ratio",
        "B.5.3",
        "Shadow-read share during a MailboxStore switchover (ADR-0001, §17.4).",
        per_tenant=False,
    )
    shadow_read_diff_ratio_max = Param(
        "shadow_read_diff_ratio_max",
        0.0001,
        "ratio",
        "B.5.3",
        "Max shadow-read difference ratio that lets a structure migration proceed (§27.2.3).",
        per_tenant=False,
    )
    shadow_read_observe_hours = Param(
        "shadow_read_observe_hours",
        24,
        "h",
        "B.5.3",
        "Migration observation window (§27.2.3).",
        per_tenant=False,
    )
    slo_burnrate_fast = Param(
        "slo_burnrate_fast",
        14.4,
        "factor",
        "B.5.3",
        "Fast burn rate: 1 h window / 5 min short window -> P1 (§24.3).",
        per_tenant=False,
    )
    slo_burnrate_slow = Param(
        "slo_burnrate_slow",
        6.0,
        "factor",
        "B.5.3",
        "Slow burn rate: 6 h window / 30 min short window -> P2 (§24.3).",
        per_tenant=False,
    )
    tenant_deletion_grace = Param(
        "tenant_deletion_grace",
        30 * DAY,
        "ms",
        "B.5.3",
        "Tenant off-boarding grace (§20.6, §21.3).",
    )
    tenant_key_rotation_days = Param(
        "tenant_key_rotation_days",
        365,
        "days",
        "B.5.3",
        "TenantMasterKey rotation period (§21.2).",
    )
    key_destroy_lag = Param(
        "key_destroy_lag",
        24 * HOUR,
        "ms",
        "B.5.3",
        "Cooldown end -> key destroyed, all DEK caches invalidated included (§21.3.4).",
        per_tenant=False,
    )
    dek_cache_ttl = Param(
        "dek_cache_ttl",
        5 * MINUTE,
        "ms",
        "B.5.3",
        "In-process DEK cache TTL at decrypt points; destroy events also invalidate it.",
        per_tenant=False,
    )
    observability_log_retention_days = Param(
        "observability_log_retention_days",
        30,
        "days",
        "B.5.3",
        "Logs and traces retention; not the dispatch log_retention_days (§21.4).",
        per_tenant=False,
    )
    audit_retention_years = Param(
        "audit_retention_years",
        5,
        "years",
        "B.5.3",
        "WORM audit retention; legal may extend it per jurisdiction (§21.5).",
    )
