"""B.6 Session list and unread, B.6.1 Ephemeral messages and chatroom interaction."""

from __future__ import annotations

from qim.params.param import Param
from qim.params.units import MINUTE, SECOND
from qim.params.values import EventWindow, MsRange, PageLimit, Rate

__all__ = ["EphemeralAndChatroom", "SessionListAndUnread"]


class SessionListAndUnread:
    """B.6: session projection, unread counts and badges (§12)."""

    projection_compaction_window = Param(
        "projection_compaction_window",
        EventWindow(max_ms=5 * SECOND, max_events=512),
        "composite",
        "B.6",
        "Session projection compaction window, whichever limit comes first.",
        per_tenant=False,
    )
    projection_lag_target_p99 = Param(
        "projection_lag_target_p99",
        5 * MINUTE,
        "ms",
        "B.6",
        "Session projection lag target (P99).",
        per_tenant=False,
    )
    session_delta_merge_window = Param(
        "session_delta_merge_window",
        MsRange(low_ms=100, high_ms=200),
        "composite",
        "B.6",
        "SESSION_DELTA merge window; only the last frame per conversation is kept.",
        per_tenant=False,
    )
    unread_precise_limit = Param(
        "unread_precise_limit",
        200,
        "count",
        "B.6",
        "Unread counted exactly up to this; above it unread_exact=false.",
    )
    session_list_page_limit = Param(
        "session_list_page_limit",
        PageLimit(default=50, cap=200),
        "composite",
        "B.6",
        "Session list page size when the client gives none, and the server cap.",
    )
    snapshot_ttl = Param(
        "snapshot_ttl",
        5 * MINUTE,
        "ms",
        "B.6",
        "Validity of a session list snapshot and its page cursor.",
        per_tenant=False,
    )
    include_muted_in_badge = Param(
        "include_muted_in_badge",
        False,
        "bool",
        "B.6",
        "Tenant level: whether muted conversations count in UserBadgeState.total_unread (§7.7).",
    )
    client_dedup_window_items = Param(
        "client_dedup_window_items",
        2000,
        "count",
        "B.6",
        "Client local_dedup item bound.",
    )
    client_dedup_window_hours = Param(
        "client_dedup_window_hours",
        1,
        "h",
        "B.6",
        "Client local_dedup time bound; >= fanout_retry_max_window.",
    )
    unread_audit_sample_rate = Param(
        "unread_audit_sample_rate",
        0.01,
        "ratio_per_day",
        "B.6",
        "Daily sample of 'unread and unchanged for 24 h' conversations recounted (§12.5.3).",
        per_tenant=False,
    )
    projection_lag_selfheal_threshold = Param(
        "projection_lag_selfheal_threshold",
        0.5,
        "ratio",
        "B.6",
        "projection_lag_vs_retention above this scales compaction up and degrades per §12.3.2 "
        "(§12.3.3).",
        per_tenant=False,
    )
    projection_write_ratio_max = Param(
        "projection_write_ratio_max",
        0.05,
        "ratio",
        "B.6",
        "Upper bound of persistent projection writes / (messages × users).",
        per_tenant=False,
        note=(
            "Appendix B attributes it to case 26.4.4, which is about SESSION_DELTA idempotency; "
            "probably an older numbering of 26.4.1 (digest §5 item 3)."
        ),
    )


class EphemeralAndChatroom:
    """B.6.1: typing, presence subscriptions, rooms, recall/edit, reactions, members.

    Part of the contract core: clients observe these values.
    """

    typing_merge_window = Param(
        "typing_merge_window",
        2 * SECOND,
        "ms",
        "B.6.1",
        "TYPING merged per (conversation, user): at most 1 frame per window (§13.2).",
    )
    typing_ttl = Param(
        "typing_ttl",
        5 * SECOND,
        "ms",
        "B.6.1",
        "Typing indicator lifetime; default expires_in_ms, so there is no stop frame.",
    )
    presence_sub_max_targets = Param(
        "presence_sub_max_targets",
        200,
        "count",
        "B.6.1",
        "Users one connection may subscribe to; over it RATE_LIMITED, never truncated (§13.2).",
    )
    presence_sub_merge_window = Param(
        "presence_sub_merge_window",
        2 * SECOND,
        "ms",
        "B.6.1",
        "Presence pushes merged per connection over this window (§13.2).",
    )
    max_rooms_per_connection = Param(
        "max_rooms_per_connection",
        20,
        "count",
        "B.6.1",
        "Chatrooms one connection may join; over it RATE_LIMITED (§14.5).",
    )
    recall_self_window = Param(
        "recall_self_window",
        2 * MINUTE,
        "ms",
        "B.6.1",
        "A sender may recall own messages within this; OWNER/ADMIN have no window.",
    )
    edit_self_window = Param(
        "edit_self_window",
        15 * MINUTE,
        "ms",
        "B.6.1",
        "A sender may edit own messages within this.",
    )
    large_group_member_threshold = Param(
        "large_group_member_threshold",
        1000,
        "count",
        "B.6.1",
        "Small vs large group split for push and display policies; aligned with the first "
        "per_conversation_msg_rate tier.",
    )
    max_members_per_group = Param(
        "max_members_per_group",
        100_000,
        "count",
        "B.6.1",
        "Group size cap; over-limit create/join is rejected whole with ERROR, never truncated.",
        note=(
            "Appendix B gives 100000 (§2.2 target tier) and 1000 for phase one (ADR-0007, a "
            "Redis MailboxStore limit). We take 100000: our mailbox is RocksDB fed by the dispatch "
            "log with bodies stored once per shard (direction §4.4). Set 1000 to get phase one."
        ),
    )
    e2ee_max_members = Param(
        "e2ee_max_members",
        1000,
        "count",
        "B.6.1",
        "Largest conversation E2EE applies to (§22.1).",
    )
    rtc_voip_push_daily_quota = Param(
        "rtc_voip_push_daily_quota",
        200,
        "per_day",
        "B.6.1",
        "VoIP pushes per device per day.",
    )
    rtc_ring_timeout = Param(
        "rtc_ring_timeout",
        60 * SECOND,
        "ms",
        "B.6.1",
        "Call ringing timeout (§13.5.3).",
    )
    e2ee_signed_prekey_rotation_days = Param(
        "e2ee_signed_prekey_rotation_days",
        7,
        "days",
        "B.6.1",
        "SignedPreKey rotation period (§22.2).",
    )
    e2ee_prekey_low_watermark = Param(
        "e2ee_prekey_low_watermark",
        20,
        "count",
        "B.6.1",
        "Refill OneTimePreKeys when fewer remain (§22.2).",
    )
    reaction_push_merge_window = Param(
        "reaction_push_merge_window",
        2 * SECOND,
        "ms",
        "B.6.1",
        "Reaction aggregate push merge; absolute values, so merging drops earlier frames.",
    )
    reaction_detail_max_members = Param(
        "reaction_detail_max_members",
        1000,
        "count",
        "B.6.1",
        "Above this member count MessageReaction detail is not written, only the aggregate.",
    )
    reaction_detail_max_per_message = Param(
        "reaction_detail_max_per_message",
        10_000,
        "count",
        "B.6.1",
        "Per-message reaction detail cap; beyond it only the aggregate grows.",
    )
    reaction_detail_page_limit = Param(
        "reaction_detail_page_limit",
        100,
        "count",
        "B.6.1",
        "PULL_REACTIONS page cap.",
    )
    per_user_reaction_rate = Param(
        "per_user_reaction_rate",
        Rate(count=5, period_ms=SECOND),
        "composite",
        "B.6.1",
        "Reactions per user per second; metered apart from per_user_msg_rate.",
    )
    member_page_limit = Param(
        "member_page_limit",
        100,
        "count",
        "B.6.1",
        "PULL_MEMBERS page size when the client gives no limit.",
    )
    member_page_hard_limit = Param(
        "member_page_hard_limit",
        200,
        "count",
        "B.6.1",
        "PULL_MEMBERS server hard cap; >= member_page_limit.",
    )
    member_search_min_prefix = Param(
        "member_search_min_prefix",
        2,
        "count",
        "B.6.1",
        "Min prefix length for filter=search (no full scans).",
    )
