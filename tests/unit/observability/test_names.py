"""The metric inventory: spec names verbatim, every 24.1.1-24.1.7 row present, honest status."""

from __future__ import annotations

import re

from qim.observability.names import INVENTORY, PROCESSES, by_process, exported_names

# Every metric name of the spec's 24.1.1-24.1.7 tables (seed002-ch23-appx.md, chapter 24).
SPEC_24_1 = {
    "24.1.1": "connections_online auth_success_rate auth_latency_p99 online_ready_latency_p99 "
    "reconnect_rate unauth_connection_count takeover_admit_duration kicked_total "
    "session_epoch_reject_total",
    "24.1.2": "send_to_ack_latency_p99 send_to_ack_latency_p999 conversation_seq_alloc_p99 "
    "outbox_lag_seconds_p99 clock_unsafe_total send_reject_total "
    "conversation_head_write_fail_rate",
    "24.1.3": "fanout_lag_seconds_p99 fanout_target_shards_per_message_p99 fanout_entries_per_sec "
    "fanout_quota_rejected_total dispatch_expand_duration_p99 "
    "dispatch_duplicate_suppressed_total membership_version_count_per_hour "
    "conversation_active_member_ratio mailbox_write_policy_switch_total",
    "24.1.4": "lane_watermark_stall_ms lane_watermark_skew_seq materialized_lag_seconds_p99 "
    "mailbox_write_fail_rate mailbox_replication_lag_p99 mailbox_trim_watermark_age_days",
    "24.1.5": "mailbox_seq_regression_count cursor_advanced_by_push_total "
    "silent_gap_detected_total event_id_nondeterminism_total mailbox_cursor_rebase_count "
    "cursor_invalid_total",
    "24.1.6": "push_latency_p99 push_e2e_latency_p99 push_e2e_latency_cross_region_p99 "
    "socket_send_queue_bytes_p99 slow_connection_degraded_ratio slow_connection_closed_total "
    "mailbox_dirty_sent_total push_drop_by_priority_total push_batch_fanout_ratio "
    "device_token_digest_lag",
    "24.1.7": "heartbeat_pps ping_interval_effective ping_backoff_trigger_rate "
    "dead_connection_detect_ms_p99 false_disconnect_ratio timewheel_tick_overrun_total "
    "empty_pull_ratio",
}


def test_every_spec_name_of_24_1_1_to_7_is_in_the_inventory_under_its_section() -> None:
    declared = {(m.section, m.spec) for m in INVENTORY}
    for section, names in SPEC_24_1.items():
        for name in names.split():
            assert (section, name) in declared, (section, name)
    assert ("24.1.5", "cursor_expired_total / login_total") in declared


def test_spec_names_are_unique_and_statuses_are_consistent() -> None:
    specs = [m.spec for m in INVENTORY]
    assert len(specs) == len(set(specs))
    for m in INVENTORY:
        if m.status == "pending":
            assert m.process is None and m.exported == () and m.note, m
        else:
            assert m.process in PROCESSES and m.exported, m
            assert all(re.fullmatch(r"[a-z_][a-z0-9_]*", n) for n in m.exported), m


def test_each_exported_name_belongs_to_one_process() -> None:
    owners: dict[str, str] = {}
    for process in PROCESSES:
        for m in by_process(process):
            for name in m.exported:
                assert owners.setdefault(name, process) == process, name
    assert set(owners) == exported_names()
