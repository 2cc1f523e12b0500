"""The Appendix B values a MailboxNode materializes with, resolved once from ``Settings``.

Replay equality holds for equal configs: the fold's decisions (shard membership of direct
participants, the entry-cap backstop, dedup windows) depend on these values, so a standby and
its primary run with the same ones. ``mailbox_retention_days`` is per tenant (B.3).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from qim.core.session_list.config import SessionListConfig
from qim.params import Settings
from qim.schemas.routing import mailbox_shard_id, user_bucket, validate_shard_config

__all__ = ["DAY_MS", "MailboxConfig"]

DAY_MS = 86_400_000


@dataclass(frozen=True, slots=True)
class MailboxConfig:
    """Everything ``materialize`` and the retention functions need besides the store."""

    mailbox_shard: int
    mailbox_shard_count: int = 64
    virtual_bucket_count: int = 65536
    connection_shard_count: int = 256
    lane_count: int = 64
    mailbox_retention_days: int = 7
    tenant_retention_days: Mapping[str, int] = field(default_factory=dict)
    max_mailbox_entries_per_user: int = 50_000
    mailbox_entry_cap_hysteresis: float = 0.8
    dispatch_progress_retention_ms: int = 7 * DAY_MS
    mention_entries: bool = False
    """Write a separate MENTION entry for targeted mentions (AT_ME / REPLY_ME) in the same event
    group. Off by default: under ``mailbox_write_policy = always`` a mention only sets the
    MESSAGE entry's ``mention_type`` (spec 11.4.1, I-29 of ch. 10-11, case 26.3.1); the
    MENTION entry is the ``mention_only`` tier's (which needs an ADR to enable, I-32). Moves to
    the dispatch's event_template once the FanoutCoordinator decides the tier per message."""
    active_window_ms: int = 7 * DAY_MS
    """B.5.1 ``active_window_days``: a member with a send or a user-state command on this
    shard within it is in the ``mention_only`` tier's active set (10.2.3, ``read_diffusion``)."""
    session_list: SessionListConfig = field(default_factory=SessionListConfig)
    """The session fold's B.6 values (``sessions``): replay needs the same ones."""

    def __post_init__(self) -> None:
        validate_shard_config(
            self.virtual_bucket_count,
            self.mailbox_shard_count,
            self.connection_shard_count,
            self.lane_count,
        )
        if not 0 <= self.mailbox_shard < self.mailbox_shard_count:
            raise ValueError("mailbox_shard out of range")
        if self.max_mailbox_entries_per_user < 1:
            raise ValueError("max_mailbox_entries_per_user must be >= 1")
        if not 0 < self.mailbox_entry_cap_hysteresis <= 1:
            raise ValueError("mailbox_entry_cap_hysteresis must be in (0, 1]")
        if self.mailbox_retention_days < 1 or any(
            d < 1 for d in self.tenant_retention_days.values()
        ):
            raise ValueError("mailbox_retention_days must be >= 1")

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        mailbox_shard: int,
        *,
        tenant_retention_days: Mapping[str, int] | None = None,
    ) -> MailboxConfig:
        return cls(
            mailbox_shard=mailbox_shard,
            mailbox_shard_count=settings.mailbox_shard_count,
            virtual_bucket_count=settings.virtual_bucket_count,
            connection_shard_count=settings.connection_shard_count,
            lane_count=settings.lane_count,
            mailbox_retention_days=settings.mailbox_retention_days,
            tenant_retention_days=dict(tenant_retention_days or {}),
            max_mailbox_entries_per_user=settings.max_mailbox_entries_per_user,
            mailbox_entry_cap_hysteresis=settings.mailbox_entry_cap_hysteresis,
            dispatch_progress_retention_ms=settings.dispatch_progress_retention,
            active_window_ms=int(settings.active_window_days) * DAY_MS,
            session_list=SessionListConfig.from_settings(settings),
        )

    @property
    def cap_target(self) -> int:
        """The entry-cap trim goes down to this many entries (18.3.3: threshold x 0.8)."""
        return int(self.max_mailbox_entries_per_user * self.mailbox_entry_cap_hysteresis)

    def retention_days(self, tenant_id: str) -> int:
        return self.tenant_retention_days.get(tenant_id, self.mailbox_retention_days)

    def shard_of(self, tenant_id: str, user_id: str) -> int:
        """The MailboxShard of a user (the 5.2 mask mapping)."""
        bucket = user_bucket(tenant_id, user_id, self.virtual_bucket_count)
        return mailbox_shard_id(bucket, self.mailbox_shard_count)

    def in_this_shard(self, tenant_id: str, user_id: str) -> bool:
        return self.shard_of(tenant_id, user_id) == self.mailbox_shard
