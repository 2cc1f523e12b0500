"""qim.params: every Appendix B default declared once, typed, validated and documented.

Spec: digest seed002-ch23-appx.md part 4 (Appendix B, B.1-B.7) and §5 (inconsistencies);
direction.md §6 (defaults on one machine); routing constraints §5.2, §6.5.1.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from qim.params import (
    GROUP_ROW_COUNTS,
    GROUPS,
    PARAMS,
    ConstraintError,
    IdleTimeout,
    ImmutableParamError,
    LatencyTarget,
    NotPerTenantError,
    PageLimit,
    Param,
    ParamError,
    ParamValueError,
    PingBackoff,
    Rate,
    RateTier,
    Settings,
    TieredRate,
    UnknownParamError,
    Watermark,
    render_markdown,
)
from qim.params.coerce import coerce_override, parse_env
from qim.params.units import DAY, HOUR, MINUTE, SECOND, SUFFIX_UNITS, GiB, Group, KiB, MiB

REPO = Path(__file__).resolve().parents[2]

# Snake-case names of Appendix B's tables, copied from the digest (part 4, B.1 to B.7).
SPEC_TABLE_NAMES: dict[str, str] = {
    "B.1": (
        "virtual_bucket_count bucket_hash mailbox_shard_count connection_shard_count "
        "lane_count shard_lease_ttl redirect_max_per_connection route_token_ttl"
    ),
    "B.2": (
        "clock_regression_reject_ms conversation_seq_reserve_window message_seq_bucket_width "
        "client_dedup_ttl_seconds mailbox_event_group_max_items mailbox_event_group_max_bytes "
        "fanout_retry_max_window membership_version_merge_window slot_compaction_ratio"
    ),
    "B.3": (
        "mailbox_retention_days device_inactive_gc_days room_log_retention_minutes "
        "log_retention_days dispatch_progress_retention membership_version_retention "
        "client_resync_min_interval pull_mailbox_max_items history_hot_window "
        "default_history_retention_days history_archive_batch_max "
        "history_max_empty_bucket_scan pull_mailbox_max_bytes pull_mailbox_window "
        "read_sync_merge_window trim_safety_margin pending_hint_error_ratio"
    ),
    "B.4": (
        "ping_interval_initial ping_interval_max_foreground ping_interval_max_background "
        "ping_interval_step ping_backoff_factor ping_probe_timeout idle_timeout "
        "send_ack_timeout tcp_user_timeout tcp_keepalive unauth_connection_timeout "
        "takeover_admit_rate sync_delay_hint_ms reconnect_backoff presence_lease_renew "
        "presence_lease_ttl presence_propagation_target access_token_ttl refresh_token_ttl "
        "token_refresh_lead token_expiry_grace revocation_propagation_target "
        "authz_recheck_interval transport_fallback_step_timeout transport_choice_cache_ttl "
        "heartbeat_wheel_tick heartbeat_wheel_slots pong_batch_window "
        "stream_scheduling_quantum revocation_record_retention"
    ),
    "B.5": (
        "max_frame_bytes stream_write_chunk_bytes frag_assembly_timeout "
        "frame_compress_min_bytes max_custom_payload_bytes custom_type_max_bytes "
        "media_thumbnail_max_bytes conn_send_soft_watermark conn_send_hard_watermark "
        "conn_send_low_watermark node_send_buffer_budget per_conversation_msg_rate "
        "per_sender_in_conversation_rate per_user_msg_rate per_user_msg_rate_burst "
        "tenant_fanout_quota room_msg_rate room_outbound_frame_rate max_devices_per_user "
        "max_conversations_per_user per_ip_connect_rate per_user_history_pull_rate "
        "per_user_media_upload_quota media_ticket_ttl rtc_signal_max_bytes "
        "quota_refill_interval tenant_shard_share_limit tenant_quota_lease_interval "
        "per_ip_max_connections at_all_rate_per_conversation at_all_daily_quota_per_sender "
        "at_all_min_role moderation_sync_timeout_ms new_account_probation_hours "
        "media_orphan_grace"
    ),
    "B.5.1": (
        "mailbox_writebatch_max_entries mailbox_writebatch_commit_p99 mailbox_subtask_timeout "
        "lane_stall_failover lane_stall_alert mailbox_takeover_rto_target rebuild_concurrency "
        "big_group_lazy_threshold read_diffusion_min_saving read_diffusion_max_active_ratio "
        "policy_switch_exit_ratio policy_switch_min_interval active_window_days "
        "quota_sustained_window push_coalesce_window dedup_inflight_timeout "
        "client_pending_max_age gc_grace_seconds membership_event_broadcast_max_members "
        "dispatch_expand_duration_p99_target lane_watermark_advance_p99 "
        "max_mailbox_entries_per_user mailbox_entry_cap_hysteresis inline_body_budget_bytes "
        "inline_body_max_bytes"
    ),
    "B.5.2": (
        "push_grace_window push_confirm_extended_window push_merge_window push_dedup_ttl "
        "push_rate_per_user_per_min push_rate_per_conversation_per_min push_quiet_hours "
        "push_token_inactive_days push_retry_max_attempts nse_pull_max_items"
    ),
    "B.5.3": (
        "writer_lease_ttl writer_lease_renew_interval writer_failover_wait "
        "writer_self_fence_deadline checkpoint_interval checkpoint_full_multiple "
        "backup_retention_days rpo_target shard_rto_target region_rto_target "
        "home_region_migration_threshold hot_retention_days dsar_response_days "
        "user_deletion_grace region_failover_retry_after_ms send_retry_budget "
        "takeover_catchup_lag_entries takeover_catchup_stable_window disaster_rto_target "
        "backup_full_interval backup_incremental_interval internal_cert_ttl "
        "mailbox_store_shadow_read_ratio shadow_read_diff_ratio_max shadow_read_observe_hours "
        "slo_burnrate_fast slo_burnrate_slow tenant_deletion_grace tenant_key_rotation_days "
        "key_destroy_lag dek_cache_ttl observability_log_retention_days audit_retention_years"
    ),
    "B.6": (
        "projection_compaction_window projection_lag_target_p99 session_delta_merge_window "
        "unread_precise_limit session_list_page_limit snapshot_ttl include_muted_in_badge "
        "client_dedup_window_items client_dedup_window_hours unread_audit_sample_rate "
        "projection_lag_selfheal_threshold projection_write_ratio_max"
    ),
    "B.6.1": (
        "typing_merge_window typing_ttl presence_sub_max_targets presence_sub_merge_window "
        "max_rooms_per_connection recall_self_window edit_self_window "
        "large_group_member_threshold max_members_per_group e2ee_max_members "
        "rtc_voip_push_daily_quota rtc_ring_timeout e2ee_signed_prekey_rotation_days "
        "e2ee_prekey_low_watermark reaction_push_merge_window reaction_detail_max_members "
        "reaction_detail_max_per_message reaction_detail_page_limit per_user_reaction_rate "
        "member_page_limit member_page_hard_limit member_search_min_prefix"
    ),
    "B.7": (
        "entry_logical_bytes entry_ondisk_bytes lsm_write_amp lsm_space_amp mailbox_replicas "
        "per_shard_entry_budget per_node_entry_budget per_node_connection_budget "
        "partition_dispatch_budget compaction_ratio d_online checkpoint_bytes "
        "checkpoint_load_time_budget per_node_frame_budget per_node_syscall_budget "
        "per_node_tls_cpu_budget per_node_pps_budget"
    ),
}

APPENDIX_B = [g for g in GROUPS if g != "prose"]


@pytest.fixture(scope="module")
def settings() -> Settings:
    return Settings.load(env={})


def _rows(group: str) -> list[Param[Any]]:
    return [p for p in PARAMS.values() if p.group == group and p.shares_row_with is None]


# --- completeness ----------------------------------------------------------------------------


@pytest.mark.parametrize("group", GROUPS)
def test_row_count_per_group_matches_the_spec_heading(group: Group) -> None:
    assert len(_rows(group)) == GROUP_ROW_COUNTS[group]


def test_appendix_b_totals_match_the_digest() -> None:
    """Digest: 219 rows, 220 names ('checkpoint_bytes / replay_rate' is one row)."""
    declared = [p for p in PARAMS.values() if p.group != "prose"]
    assert sum(len(_rows(g)) for g in APPENDIX_B) == 219
    assert len(declared) == 220
    assert PARAMS["replay_rate"].shares_row_with == "checkpoint_bytes"


@pytest.mark.parametrize("group", APPENDIX_B)
def test_every_spec_table_name_is_declared_in_its_group(group: str) -> None:
    spec = SPEC_TABLE_NAMES[group].split()
    declared = [p.name for p in PARAMS.values() if p.group == group]
    extra = {"B.5": ["frame_priority"], "B.7": ["replay_rate"]}.get(group, [])
    assert sorted(declared) == sorted(spec + extra)


@pytest.mark.parametrize(
    "name",
    [
        "presence_lease_ttl",
        "presence_lease_renew",
        "per_ip_connect_rate",
        "large_group_member_threshold",
        "member_page_limit",
        "dispatch_progress_retention",
        "session_delta_merge_window",
        "read_sync_merge_window",
        "target_utilization",
        "default_history_retention_days_max",
        "mailbox_write_policy",
    ],
)
def test_parameters_named_in_prose_are_declared(name: str) -> None:
    assert name in PARAMS


# --- declarations are well formed ------------------------------------------------------------


@pytest.mark.parametrize("param", PARAMS.values(), ids=lambda p: p.name)
def test_declaration_is_documented_and_consistent(param: Param[Any]) -> None:
    assert param.doc and "\n" not in param.doc
    assert not (param.immutable and param.per_tenant)
    assert (param.group == "B.7") <= param.to_be_measured  # every B.7 row is to be measured
    assert coerce_override(param, param.default) == param.default


@pytest.mark.parametrize("param", PARAMS.values(), ids=lambda p: p.name)
def test_unit_follows_the_name(param: Param[Any]) -> None:
    """Suffix -> that unit; any other duration is int milliseconds (units.py)."""
    base = param.name.removesuffix("_max")  # a bound shares its value's unit
    suffix_unit = next((u for s, u in SUFFIX_UNITS.items() if base.endswith(s)), None)
    if suffix_unit is not None and param.unit != "composite":
        assert param.unit == suffix_unit
    if param.unit in ("s", "min", "h", "days", "years"):
        assert suffix_unit == param.unit
    if param.unit == "ms" and param.default is not None:
        assert type(param.default) is int


@pytest.mark.parametrize(
    "param",
    [p for p in PARAMS.values() if dataclasses.is_dataclass(p.default)],
    ids=lambda p: p.name,
)
def test_composite_default_round_trips_through_env_json(param: Param[Any]) -> None:
    text = json.dumps(dataclasses.asdict(param.default))
    assert parse_env(param, param.env_names[0], text) == param.default


def test_immutables_are_the_routing_invariants() -> None:
    immutable = {p.name for p in PARAMS.values() if p.immutable}
    assert immutable == {
        "virtual_bucket_count",
        "bucket_hash",
        "lane_count",
        "message_seq_bucket_width",
    }


# --- exact defaults from the spec text -------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("virtual_bucket_count", 65536),
        ("lane_count", 64),
        ("message_seq_bucket_width", 4096),
        ("clock_regression_reject_ms", 5000),
        ("client_dedup_ttl_seconds", 7200),
        ("max_frame_bytes", 4 * MiB),
        ("unauth_connection_timeout", 10 * SECOND),
        ("max_devices_per_user", 8),
        ("max_custom_payload_bytes", 32 * KiB),
        ("per_user_msg_rate", Rate(count=20, period_ms=1000)),
        ("per_user_msg_rate_burst", 40),
        ("mailbox_retention_days", 7),
        ("unread_precise_limit", 200),
        ("pull_mailbox_window", 4),
        ("route_token_ttl", 60 * SECOND),
        ("redirect_max_per_connection", 1),
        ("presence_lease_renew", 10 * SECOND),
        ("presence_lease_ttl", 30 * SECOND),
        ("shard_lease_ttl", 15 * SECOND),
        ("log_retention_days", 1),
        ("dispatch_progress_retention", 7 * DAY),
        ("membership_version_retention", 8 * DAY),
        ("history_hot_window", 7 * DAY),
        ("pull_mailbox_max_bytes", 512 * KiB),
        ("pending_hint_error_ratio", 0.2),
        ("access_token_ttl", HOUR),
        ("refresh_token_ttl", 30 * DAY),
        ("revocation_record_retention", 2 * HOUR),
        ("pong_batch_window", 10),
        ("conn_send_soft_watermark", Watermark(bytes=MiB, items=2000)),
        ("conn_send_hard_watermark", Watermark(bytes=4 * MiB, items=8000)),
        ("conn_send_low_watermark", 256 * KiB),
        ("per_sender_in_conversation_rate", Rate(count=1, period_ms=3 * SECOND)),
        ("at_all_rate_per_conversation", Rate(count=1, period_ms=10 * MINUTE)),
        ("ping_backoff_factor", PingBackoff(factor=0.8, lock_ms=30 * MINUTE)),
        ("idle_timeout", IdleTimeout(ping_multiplier=2, margin_ms=10 * SECOND)),
        ("presence_propagation_target", LatencyTarget(percentile=99, max_ms=SECOND)),
        ("writer_failover_wait", 25 * SECOND),
        ("writer_self_fence_deadline", 12 * SECOND),
        ("push_confirm_extended_window", 18 * SECOND),
        ("session_list_page_limit", PageLimit(default=50, cap=200)),
        ("include_muted_in_badge", False),
        ("large_group_member_threshold", 1000),
        ("member_page_limit", 100),
        ("member_page_hard_limit", 200),
        ("max_members_per_group", 100_000),
        ("shadow_read_diff_ratio_max", 0.0001),
        ("slo_burnrate_fast", 14.4),
        ("gc_grace_seconds", 86_400),
        ("d_online", 1.4),
        ("tenant_fanout_quota", None),
        ("entry_ondisk_bytes", None),
        ("target_utilization", 0.5),
        ("default_history_retention_days_max", 3650),
    ],
)
def test_default_matches_spec(settings: Settings, name: str, expected: object) -> None:
    assert settings[name] == expected
    assert PARAMS[name].default == expected


def test_local_shard_counts_follow_direction_section_6(settings: Settings) -> None:
    assert settings.mailbox_shard_count == 64
    assert settings.connection_shard_count == 256
    assert settings.connection_shard_count % settings.mailbox_shard_count == 0


def test_per_conversation_msg_rate_tiers(settings: Settings) -> None:
    """N <= 1000 -> 20 msg/s; N > 10000 -> 2 msg/s; the lost middle tier is our 5 msg/s."""
    rate = settings.per_conversation_msg_rate
    assert [rate.for_members(n) for n in (1, 1000, 1001, 10_000, 10_001, 100_000)] == [
        20,
        20,
        5,
        5,
        2,
        2,
    ]


@pytest.mark.parametrize(
    "name",
    [
        "mailbox_shard_count",
        "connection_shard_count",
        "mailbox_retention_days",
        "per_conversation_msg_rate",
        "max_members_per_group",
        "log_retention_days",
    ],
)
def test_deviations_carry_a_note(name: str) -> None:
    assert PARAMS[name].note


# --- typed access ----------------------------------------------------------------------------


def test_attribute_and_item_access_agree(settings: Settings) -> None:
    for name in PARAMS:
        assert getattr(settings, name) == settings[name]
    assert len(settings) == len(PARAMS)
    assert Settings.lane_count is PARAMS["lane_count"]


def test_no_parameter_shadows_the_settings_api() -> None:
    api = {name for name in dir(Settings) if not isinstance(getattr(Settings, name), Param)}
    assert not api & set(PARAMS)


def test_settings_are_read_only(settings: Settings) -> None:
    with pytest.raises(AttributeError):
        settings.lane_count = 32  # type: ignore[assignment]
    assert settings.lane_count == 64


def test_item_access_rejects_unknown_names(settings: Settings) -> None:
    with pytest.raises(UnknownParamError, match="lane_count"):
        settings["lane_cont"]


def test_writer_lease_ttl_follows_shard_lease_ttl() -> None:
    loaded = Settings.load({"shard_lease_ttl": 20 * SECOND, "writer_failover_wait": 30 * SECOND})
    assert loaded.writer_lease_ttl == 20 * SECOND


@pytest.mark.parametrize(
    ("overrides", "env"),
    [({"writer_lease_ttl": 20_000}, {}), ({}, {"QIM_WRITER_LEASE_TTL": "20000"})],
)
def test_writer_lease_ttl_cannot_be_tuned_alone(
    overrides: dict[str, object], env: dict[str, str]
) -> None:
    with pytest.raises(ParamValueError, match="alias of shard_lease_ttl"):
        Settings.load(overrides, env=env)


# --- overrides and the environment -----------------------------------------------------------


def test_env_overrides_are_parsed_to_the_declared_type() -> None:
    loaded = Settings.load(
        env={
            "QIM_MAX_DEVICES_PER_USER": "10",
            "QIM_SLO_BURNRATE_FAST": "10",
            "QIM_INCLUDE_MUTED_IN_BADGE": "true",
            "QIM_AT_ALL_MIN_ROLE": "OWNER",
            "QIM_PER_USER_MSG_RATE": '{"count": 30, "period_ms": 1000}',
            "QIM_TENANT_FANOUT_QUOTA": '{"count": 5000, "period_ms": 1000}',
            "QIM_ENTRY_ONDISK_BYTES": "null",
            "QIM_PER_CONVERSATION_MSG_RATE": json.dumps(
                {
                    "tiers": [
                        {"max_members": 500, "msgs_per_s": 10},
                        {"max_members": None, "msgs_per_s": 1},
                    ]
                }
            ),
            "QIM_SOMETHING_ELSE": "ignored: not a parameter",
        }
    )
    assert loaded.max_devices_per_user == 10
    assert loaded.slo_burnrate_fast == 10.0 and isinstance(loaded.slo_burnrate_fast, float)
    assert loaded.include_muted_in_badge is True
    assert loaded.at_all_min_role == "OWNER"
    assert loaded.per_user_msg_rate == Rate(30, 1000)
    assert loaded.tenant_fanout_quota == Rate(5000, 1000)
    assert loaded.entry_ondisk_bytes is None
    assert loaded.per_conversation_msg_rate == TieredRate((RateTier(500, 10), RateTier(None, 1)))
    assert loaded.changed().keys() == {
        "max_devices_per_user",
        "slo_burnrate_fast",
        "include_muted_in_badge",
        "at_all_min_role",
        "per_user_msg_rate",
        "tenant_fanout_quota",
        "per_conversation_msg_rate",
    }


def test_spec_env_aliases_are_accepted() -> None:
    loaded = Settings.load(
        env={"QIM_HISTORY_HOT_WINDOW_MS": str(2 * HOUR), "QIM_ARCHIVER_BATCH_MAX": "1024"}
    )
    assert loaded.history_hot_window == 2 * HOUR
    assert loaded.history_archive_batch_max == 1024


def test_two_env_names_for_one_parameter_must_agree() -> None:
    env = {"QIM_HISTORY_HOT_WINDOW": "7200000", "QIM_HISTORY_HOT_WINDOW_MS": "3600000"}
    with pytest.raises(ParamValueError, match="differently"):
        Settings.load(env=env)


def test_overrides_win_over_env() -> None:
    loaded = Settings.load({"max_devices_per_user": 5}, env={"QIM_MAX_DEVICES_PER_USER": "10"})
    assert loaded.max_devices_per_user == 5


def test_env_defaults_to_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QIM_UNREAD_PRECISE_LIMIT", "300")
    assert Settings.load().unread_precise_limit == 300


@pytest.mark.parametrize(
    ("variable", "text", "match"),
    [
        ("QIM_LANE_COUNT", "sixty-four", "expected an integer"),
        ("QIM_LANE_COUNT", "64.0", "expected an integer"),
        ("QIM_SLO_BURNRATE_FAST", "fast", "expected a number"),
        ("QIM_INCLUDE_MUTED_IN_BADGE", "maybe", "expected true/false"),
        ("QIM_PER_USER_MSG_RATE", "20/s", "expected a JSON object"),
        ("QIM_PER_USER_MSG_RATE", '{"count": 20}', "missing \\['period_ms'\\]"),
        ("QIM_PER_USER_MSG_RATE", '{"count": 20, "period_ms": 1000, "x": 1}', "unknown \\['x'\\]"),
        ("QIM_PER_USER_MSG_RATE", '{"count": "20", "period_ms": 1000}', "expected an int"),
        ("QIM_PER_USER_MSG_RATE", '{"count": 0, "period_ms": 1000}', "count must be > 0"),
        ("QIM_PER_USER_MSG_RATE", "null", "None is not allowed"),
        ("QIM_HISTORY_ARCHIVE_BATCH_MAX", "5000", "above the maximum 4096"),
        ("QIM_HISTORY_HOT_WINDOW_MS", "60000", "below the minimum"),
        ("QIM_AT_ALL_MIN_ROLE", "ROOT", "not one of"),
        (
            "QIM_PER_CONVERSATION_MSG_RATE",
            '{"tiers": [{"max_members": 1000, "msgs_per_s": 2}, '
            '{"max_members": null, "msgs_per_s": 20}]}',
            "must not allow a higher rate",
        ),
    ],
)
def test_bad_env_values_are_rejected_naming_the_variable(
    variable: str, text: str, match: str
) -> None:
    with pytest.raises(ParamValueError, match=match) as excinfo:
        Settings.load(env={variable: text})
    assert variable in str(excinfo.value)


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("lane_count", "64", "expected an int"),
        ("lane_count", True, "expected an int"),
        ("lane_count", 64.0, "expected an int"),
        ("include_muted_in_badge", 1, "expected a bool"),
        ("per_user_msg_rate", 20, "expected Rate or a mapping"),
        ("mailbox_retention_days", 0, "below the minimum"),
    ],
)
def test_bad_override_types_are_rejected(name: str, value: object, match: str) -> None:
    with pytest.raises(ParamValueError, match=match):
        Settings.load({name: value}, env={})


def test_composite_overrides_accept_a_mapping() -> None:
    loaded = Settings.load({"per_user_msg_rate": {"count": 25, "period_ms": 1000}}, env={})
    assert loaded.per_user_msg_rate == Rate(25, 1000)


def test_unknown_override_names_are_rejected_with_a_hint() -> None:
    with pytest.raises(UnknownParamError, match="did you mean per_user_msg_rate"):
        Settings.load({"per_user_msg_rat": Rate(1, 1000)}, env={})


# --- tenants ---------------------------------------------------------------------------------


def test_tenant_view_overrides_only_that_tenant(settings: Settings) -> None:
    tenant = settings.for_tenant("acme", {"mailbox_retention_days": 30, "max_devices_per_user": 4})
    assert tenant.tenant_id == "acme"
    assert tenant.mailbox_retention_days == 30
    assert tenant.max_devices_per_user == 4
    assert settings.mailbox_retention_days == 7
    assert settings.tenant_id is None
    assert tenant.lane_count == settings.lane_count


@pytest.mark.parametrize("name", sorted(n for n, p in PARAMS.items() if p.immutable))
def test_immutables_cannot_be_overridden_per_tenant(settings: Settings, name: str) -> None:
    with pytest.raises(ImmutableParamError, match="cluster-immutable"):
        settings.for_tenant("acme", {name: PARAMS[name].default})


@pytest.mark.parametrize(
    "name", ["mailbox_shard_count", "log_retention_days", "tenant_shard_share_limit"]
)
def test_cluster_level_values_cannot_be_overridden_per_tenant(
    settings: Settings, name: str
) -> None:
    with pytest.raises(NotPerTenantError):
        settings.for_tenant("acme", {name: PARAMS[name].default})


def test_tenant_overrides_reject_unknown_names(settings: Settings) -> None:
    with pytest.raises(UnknownParamError):
        settings.for_tenant("acme", {"no_such_parameter": 1})


def test_tenant_view_is_revalidated(settings: Settings) -> None:
    with pytest.raises(ConstraintError, match=r"(?s)tenant 'acme'.*member_page_hard_limit"):
        settings.for_tenant("acme", {"member_page_limit": 300})


def test_tenant_view_of_a_tenant_view_is_refused(settings: Settings) -> None:
    with pytest.raises(ParamError, match="already"):
        settings.for_tenant("acme").for_tenant("other")


# --- constraints -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"mailbox_shard_count": 48, "connection_shard_count": 96}, "power of two"),
        ({"connection_shard_count": 100}, "power of two"),
        ({"lane_count": 512}, "lane_count must be <= 256"),
        ({"virtual_bucket_count": 32}, "mailbox_shard_count must be <= virtual_bucket_count"),
        ({"mailbox_shard_count": 512}, "integer multiple of mailbox_shard_count"),
        ({"connection_shard_count": 32}, "integer multiple of mailbox_shard_count"),
    ],
)
def test_routing_constraints_are_enforced(overrides: dict[str, object], match: str) -> None:
    with pytest.raises(ConstraintError, match=match):
        Settings.load(overrides, env={})


def test_zero_counts_fail_as_values_not_crashes() -> None:
    with pytest.raises(ParamValueError, match="below the minimum 1"):
        Settings.load({"mailbox_shard_count": 0}, env={})


def test_every_broken_rule_is_reported_at_once() -> None:
    with pytest.raises(ConstraintError) as excinfo:
        Settings.load({"lane_count": 1024, "connection_shard_count": 48}, env={})
    message = str(excinfo.value)
    assert "lane_count must be <= 256" in message
    assert "connection_shard_count must be a power of two" in message
    assert "integer multiple" in message


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"writer_failover_wait": 15 * SECOND}, "anti-split-brain"),
        ({"shard_lease_ttl": 10 * SECOND}, "anti-split-brain"),
        ({"per_user_msg_rate_burst": 10}, "per_user_msg_rate_burst"),
        ({"push_grace_window": 5 * SECOND}, "push_confirm_extended_window"),
        ({"access_token_ttl": 3 * HOUR}, "revocation_record_retention"),
        ({"dispatch_progress_retention": HOUR}, "dispatch_progress_retention must be >="),
        ({"membership_version_retention": 7 * DAY}, "membership_version_retention"),
        ({"default_history_retention_days": 4000}, "default_history_retention_days_max"),
        ({"conn_send_low_watermark": 2 * MiB}, "conn_send_low_watermark"),
        ({"inline_body_max_bytes": 16 * KiB}, "inline_body_budget_bytes"),
        ({"checkpoint_interval": 12 * HOUR}, "§19.3.3"),
    ],
)
def test_spec_relations_are_enforced(overrides: dict[str, object], match: str) -> None:
    with pytest.raises(ConstraintError, match=match):
        Settings.load(overrides, env={})


# --- composite values ------------------------------------------------------------------------


def test_composite_helpers() -> None:
    assert Rate(1, 3000).per_second == pytest.approx(1 / 3)
    assert IdleTimeout(2, 10_000).for_ping_interval(60_000) == 130_000
    assert PageLimit(50, 200).clamp(None) == 50
    assert PageLimit(50, 200).clamp(1000) == 200
    with pytest.raises(ValueError, match="unbounded"):
        TieredRate((RateTier(1000, 20),))
    with pytest.raises(ValueError, match="strictly increase"):
        TieredRate((RateTier(1000, 20), RateTier(1000, 5), RateTier(None, 2)))


def test_node_send_buffer_budget_resolves_against_memory(settings: Settings) -> None:
    budget = settings.node_send_buffer_budget
    assert budget.resolve(16 * GiB) == int(16 * GiB * 0.2)
    assert budget.resolve(100 * GiB) == 8 * GiB


# --- generated documentation and purity ------------------------------------------------------


def test_docs_parameters_md_is_up_to_date() -> None:
    """Regenerate with: python -m qim.params"""
    committed = (REPO / "docs" / "parameters.md").read_text(encoding="utf-8")
    assert committed == render_markdown()


def test_rendered_table_lists_every_parameter_and_note() -> None:
    text = render_markdown()
    for param in PARAMS.values():
        assert f"| `{param.name}` |" in text
        if param.note:
            assert param.note in text


def test_params_package_imports_no_io_libraries() -> None:
    code = (
        "import sys, qim.params, qim.params.__main__\n"
        "bad = {'asyncio', 'faust', 'aiokafka', 'websockets', 'redis', 'rocksdict'}\n"
        "print(sorted(bad & {m.split('.')[0] for m in sys.modules}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.strip() == "[]"
