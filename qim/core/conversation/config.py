"""The Appendix B values the ConversationWriter reads, resolved once from ``Settings``.

Typed and frozen so the hot path reads attributes, not a settings lookup per message. Limits that
Appendix B marks per-tenant (rates, payload size, group threshold) are resolved per tenant through
:meth:`WriterConfig.limits_for`; the rest are cluster-wide.

Replay equality depends on these values: the admission buckets and the dedup window are rebuilt
from the outbox with the config in force at replay, so a config change between a snapshot and a
replay changes future admission decisions, never a committed record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from qim.core.conversation.custom_types import CustomTypeRegistry
from qim.core.fanout.write_policy import TierRule
from qim.params import Rate, Settings, TieredRate
from qim.schemas.message_types import CustomTypeContract

__all__ = ["WriterConfig", "WriterLimits"]


@dataclass(frozen=True, slots=True)
class WriterLimits:
    """Per-tenant admission, size and recall/edit window limits (spec 8.2, 13.4.3, App. B)."""

    per_user_msg_rate: Rate
    per_user_msg_rate_burst: int
    per_sender_in_conversation_rate: Rate
    per_conversation_msg_rate: TieredRate
    large_group_member_threshold: int
    max_custom_payload_bytes: int
    sender_in_conversation_min_members: int | None = None
    """Member count above which ``per_sender_in_conversation_rate`` applies; None means
    ``large_group_member_threshold`` (our default, see ``admission``). 0 applies it everywhere,
    the literal reading of spec 8.2 / T3."""
    recall_self_window_ms: int = 2 * 60_000
    """Spec 13.4.3 ``recall_self_window``: a sender recalls own messages within it."""
    edit_self_window_ms: int = 15 * 60_000
    """Spec 13.4.3 ``edit_self_window``: a sender edits own messages within it."""
    per_user_reaction_rate: Rate = field(default_factory=lambda: Rate(count=5, period_ms=1000))
    """Spec 13.6.3 item 4: REACTs per user, a bucket apart from ``per_user_msg_rate``."""
    reaction_detail_max_members: int = 1000
    reaction_detail_max_per_message: int = 10_000
    reaction_detail_page_limit: int = 100
    at_all_rate_per_conversation: Rate = field(
        default_factory=lambda: Rate(count=1, period_ms=10 * 60_000)
    )
    """Spec 11.4.2: @all messages per conversation, a bucket of its own (not L2's tokens)."""
    at_all_daily_quota_per_sender: int = 10
    """Spec 11.4.2: @all messages per sender per UTC day (``at_all.DailyQuota``)."""
    at_all_min_role: str = "ADMIN"
    """Spec 11.4.2: the lowest role that may @all once member_count exceeds
    ``large_group_member_threshold``."""
    tenant_fanout_quota: Rate | None = None
    """Spec 8.2 L3 / 10.5.2: entries per period, a token bucket; None = not enforced."""
    write_tier: TierRule = field(default_factory=TierRule)
    """Spec 10.2.3: the tenant's ``mailbox_write_policy`` switch and the tier's B.5.1 values."""

    def __post_init__(self) -> None:
        if self.per_user_msg_rate_burst < 1:
            raise ValueError("per_user_msg_rate_burst must be >= 1")
        if self.max_custom_payload_bytes < 0:
            raise ValueError("max_custom_payload_bytes must be >= 0")
        if self.at_all_daily_quota_per_sender < 0:
            raise ValueError("at_all_daily_quota_per_sender must be >= 0")

    @property
    def sender_rate_threshold(self) -> int:
        """Groups with more members than this get the per-sender-in-conversation bucket."""
        if self.sender_in_conversation_min_members is None:
            return self.large_group_member_threshold
        return self.sender_in_conversation_min_members

    @classmethod
    def from_settings(cls, settings: Settings) -> WriterLimits:
        return cls(
            per_user_msg_rate=settings.per_user_msg_rate,
            per_user_msg_rate_burst=settings.per_user_msg_rate_burst,
            per_sender_in_conversation_rate=settings.per_sender_in_conversation_rate,
            per_conversation_msg_rate=settings.per_conversation_msg_rate,
            large_group_member_threshold=settings.large_group_member_threshold,
            max_custom_payload_bytes=settings.max_custom_payload_bytes,
            recall_self_window_ms=settings.recall_self_window,
            edit_self_window_ms=settings.edit_self_window,
            per_user_reaction_rate=settings.per_user_reaction_rate,
            reaction_detail_max_members=settings.reaction_detail_max_members,
            reaction_detail_max_per_message=settings.reaction_detail_max_per_message,
            reaction_detail_page_limit=settings.reaction_detail_page_limit,
            at_all_rate_per_conversation=settings.at_all_rate_per_conversation,
            at_all_daily_quota_per_sender=int(settings.at_all_daily_quota_per_sender),
            at_all_min_role=str(settings.at_all_min_role),
            tenant_fanout_quota=settings.tenant_fanout_quota,
            write_tier=TierRule.from_settings(settings),
        )


@dataclass(frozen=True, slots=True)
class WriterConfig:
    """Everything a ``ConversationWriterState`` needs besides its identity and epoch."""

    limits: WriterLimits
    client_dedup_ttl_seconds: int = 7200
    client_dedup_max_entries: int = 1_000_000
    """Ours: a hard memory cap per partition; evicting earlier than the TTL shortens the window
    (a later retry becomes a new message, the residual risk spec 8.3 already accepts)."""
    inline_body_budget_bytes: int = 8192
    inline_body_max_bytes: int = 2048
    clock_regression_reject_ms: int = 5000
    tenant_limits: Mapping[str, WriterLimits] = field(default_factory=dict)
    custom_types: CustomTypeRegistry = field(default_factory=CustomTypeRegistry)
    """Spec 13.3 declarations per tenant (``QIM_CUSTOM_TYPES``); read by ``send_contract`` only,
    never by ``apply``: a committed record carries its contract, so replay ignores this."""
    e2ee_direct_tenants: frozenset[str] = frozenset()
    """Tenants whose one-to-one conversations are E2EE (spec 22.1 "a tenant can make it the
    default"; ``QIM_E2EE_DIRECT_TENANTS``). Read only when a direct conversation's first
    message is decided: from then on its head's flag holds (fixed at creation), so changing
    the setting affects new conversations only and replay never reads it."""

    def __post_init__(self) -> None:
        if self.client_dedup_ttl_seconds < 1 or self.client_dedup_max_entries < 1:
            raise ValueError("the ClientDedup window and cap must be positive")

    def limits_for(self, tenant_id: str) -> WriterLimits:
        """The tenant's overrides when it has any, else the cluster's limits."""
        return self.tenant_limits.get(tenant_id, self.limits)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        tenants: Mapping[str, Settings] | None = None,
        custom_types: Mapping[str, tuple[CustomTypeContract, ...]] | None = None,
        e2ee_direct_tenants: frozenset[str] = frozenset(),
    ) -> WriterConfig:
        """Build from ``Settings.load()``, optional per-tenant views (``for_tenant``) and the
        tenants' custom-type declarations (``decode_custom_types``)."""
        registry = CustomTypeRegistry.build(
            custom_types or {},
            max_payload_bytes={t: v.max_custom_payload_bytes for t, v in (tenants or {}).items()},
            default_max_payload_bytes=settings.max_custom_payload_bytes,
            custom_type_max_bytes=settings.custom_type_max_bytes,
        )
        return cls(
            custom_types=registry,
            limits=WriterLimits.from_settings(settings),
            client_dedup_ttl_seconds=settings.client_dedup_ttl_seconds,
            inline_body_budget_bytes=settings.inline_body_budget_bytes,
            inline_body_max_bytes=settings.inline_body_max_bytes,
            clock_regression_reject_ms=settings.clock_regression_reject_ms,
            tenant_limits={
                tenant: WriterLimits.from_settings(view) for tenant, view in (tenants or {}).items()
            },
            e2ee_direct_tenants=e2ee_direct_tenants,
        )
