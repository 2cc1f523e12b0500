"""B.3 Sync and retention."""

from __future__ import annotations

from qim.params.param import Param
from qim.params.units import DAY, HOUR, SECOND, KiB

__all__ = ["SyncAndRetention"]


class SyncAndRetention:
    """B.3: how long things live and how much one pull returns."""

    mailbox_retention_days = Param(
        "mailbox_retention_days",
        7,
        "days",
        "B.3",
        "Offline mailbox retention; day buckets expire at (D + 7 + 1) × 86400 s UTC, older "
        "messages via PULL_HISTORY (ADR-0023).",
        minimum=1,
        note=(
            "The documents disagree: B.3 says 7 (ADR-0023, 'previously 30'); ch. 24, ch. 25, "
            "§20.5.4 and case 26.2.6 still use 30. We take Appendix B's 7, configurable per tenant "
            "(§27.4: lowering it deletes data, raising it affects only new data)."
        ),
    )
    device_inactive_gc_days = Param(
        "device_inactive_gc_days",
        60,
        "days",
        "B.3",
        "An inactive device's cursor and presence are collected after this.",
    )
    room_log_retention_minutes = Param(
        "room_log_retention_minutes",
        30,
        "min",
        "B.3",
        "Chatroom replay window (RoomRecord ring buffer).",
    )
    log_retention_days = Param(
        "log_retention_days",
        1,
        "days",
        "B.3",
        "Dispatch log retention; lower bound (checkpoint_interval + T_recover) × 2 (§19.3.3).",
        per_tenant=False,
        note=(
            "In our design the dispatch topic is the mailbox's changelog (direction §3, §4.2): "
            "its Kafka retention.ms must be >= mailbox retention + margin, not this value. "
            "log_retention_days keeps Appendix B's 1 d as the §19.3.3 recovery window that the "
            "retention chain (dispatch_progress_retention, membership_version_retention) is "
            "checked against."
        ),
    )
    dispatch_progress_retention = Param(
        "dispatch_progress_retention",
        7 * DAY,
        "ms",
        "B.3",
        "DispatchProgress is kept this long; must be >= log_retention_days.",
        per_tenant=False,
    )
    membership_version_retention = Param(
        "membership_version_retention",
        8 * DAY,
        "ms",
        "B.3",
        "Old GroupMembershipVersions are kept >= max(dispatch_progress_retention, "
        "log_retention_days) + margin.",
        per_tenant=False,
    )
    client_resync_min_interval = Param(
        "client_resync_min_interval",
        5 * SECOND,
        "ms",
        "B.3",
        "Rate limit for a client's global fallback pulls.",
    )
    pull_mailbox_max_items = Param(
        "pull_mailbox_max_items",
        500,
        "count",
        "B.3",
        "Soft cap on entries per PULL_MAILBOX reply; event groups are never split.",
    )
    history_hot_window = Param(
        "history_hot_window",
        7 * DAY,
        "ms",
        "B.3",
        "Recent history kept in the hot tier; trimmed only once older and covered by the archive "
        "watermark (ADR-0018); min 1 h.",
        per_tenant=False,
        minimum=HOUR,
        env_aliases=("QIM_HISTORY_HOT_WINDOW_MS",),
        note=(
            "The source's hot tier is Redis; our stack keeps Redis off the message path "
            "(direction §1), so this bounds whichever hot history tier we build. The spec's "
            "variable QIM_HISTORY_HOT_WINDOW_MS is accepted next to QIM_HISTORY_HOT_WINDOW."
        ),
    )
    default_history_retention_days = Param(
        "default_history_retention_days",
        30,
        "days",
        "B.3",
        "History retention of retention_class = default (ADR-0019); writer and archiver must "
        "use the same value; 1..=default_history_retention_days_max.",
        per_tenant=False,
        minimum=1,
    )
    history_archive_batch_max = Param(
        "history_archive_batch_max",
        512,
        "count",
        "B.3",
        "Max Outbox records per HistoryArchiver batch (ADR-0018); 1..=4096.",
        per_tenant=False,
        minimum=1,
        maximum=4096,
        env_aliases=("QIM_ARCHIVER_BATCH_MAX",),
    )
    history_max_empty_bucket_scan = Param(
        "history_max_empty_bucket_scan",
        8,
        "count",
        "B.3",
        "Consecutive empty seq_buckets PULL_HISTORY scans upward before has_more=false + alert.",
        per_tenant=False,
    )
    pull_mailbox_max_bytes = Param(
        "pull_mailbox_max_bytes",
        512 * KiB,
        "bytes",
        "B.3",
        "Soft byte cap per PULL_MAILBOX reply; recalibrate when bodies are inlined (ADR-0005).",
    )
    pull_mailbox_window = Param(
        "pull_mailbox_window",
        4,
        "count",
        "B.3",
        "Concurrent in-flight PULL_MAILBOX requests per client.",
    )
    read_sync_merge_window = Param(
        "read_sync_merge_window",
        3 * SECOND,
        "ms",
        "B.3",
        "Read-sync control events merge per (user, conversation) over this window (§9.7.2).",
        per_tenant=False,
    )
    trim_safety_margin = Param(
        "trim_safety_margin",
        24 * HOUR,
        "ms",
        "B.3",
        "Trim safety margin, a time span, not a seq count (§18.3.3).",
        per_tenant=False,
    )
    pending_hint_error_ratio = Param(
        "pending_hint_error_ratio",
        0.2,
        "ratio",
        "B.3",
        "Allowed relative error of pending_entry_count_hint (case 26.2.1).",
        per_tenant=False,
    )
