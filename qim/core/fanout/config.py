"""The Appendix B values the FanoutCoordinator reads, resolved once from ``Settings``.

Why a frozen config and not a settings lookup: every output of the FanoutCoordinator must be a
pure function of the outbox (direction 4.7, spec 6.7 I-5), so the values that shape it are
fixed for the life of a ``FanoutState`` and a replay runs with the same ones. Two of them are
decided here and not by the ConversationWriter, so a change between a run and its replay
changes the dispatches of membership CONTROL messages and of over-cap event groups; the
``audit_fanout`` replay must run with the config the live coordinator used:

* ``membership_event_broadcast_max_members`` (B.5.1, spec 10.1.3): whether a membership change
  is broadcast to the other members or written only to its subjects;
* ``mention_entries``: whether a mentioned recipient gets its own ``MENTION`` entry (spec 11.4.1:
  only in the reserved ``mention_only`` tier; under the default ``always`` policy the mention is
  the ``mention_type`` of the recipient's one MESSAGE entry).
"""

from __future__ import annotations

from dataclasses import dataclass

from qim.params import Settings
from qim.schemas.routing import (
    DEFAULT_VIRTUAL_BUCKET_COUNT,
    is_power_of_two,
    mailbox_shard_id,
    user_bucket,
)

__all__ = ["INLINE_DEK_ID_ALLOWANCE", "FanoutConfig"]

INLINE_DEK_ID_ALLOWANCE = 48
"""Bytes reserved per inline entry for ``dek_id`` (spec 7.3: mandatory when inline). The stored
entry schema has no ``dek_id`` yet, so the worst-case event group adds this allowance."""


@dataclass(frozen=True, slots=True)
class FanoutConfig:
    """Routing, event-group caps and the two fanout-time policies (module docstring)."""

    mailbox_shard_count: int = 64
    """B.1 (64 locally, direction 6): the number of dispatch partitions."""
    virtual_bucket_count: int = DEFAULT_VIRTUAL_BUCKET_COUNT
    event_group_max_items: int = 8
    """B.2 ``mailbox_event_group_max_items``: entries per ``(user, mailbox_seq)`` (spec 6.7)."""
    event_group_max_bytes: int = 8 * 1024
    """B.2 ``mailbox_event_group_max_bytes``: bytes per ``(user, mailbox_seq)`` (spec 6.7)."""
    membership_event_broadcast_max_members: int = 500
    """B.5.1: at most this many members after a change -> the change is broadcast (10.1.3)."""
    mention_entries: bool = False
    """True = the ``mention_only`` tier's separate MENTION entries (11.4.1); off by default."""
    max_retained_versions: int = 256
    """Per group, how many membership versions keep their target-shard list for redelivered
    records (ours: a memory bound; a message pinned to an older one is ``VERSION_RETIRED``)."""

    def __post_init__(self) -> None:
        if not is_power_of_two(self.mailbox_shard_count) or not is_power_of_two(
            self.virtual_bucket_count
        ):
            raise ValueError("shard and bucket counts must be powers of two (spec 5.2)")
        if self.mailbox_shard_count > self.virtual_bucket_count:
            raise ValueError("mailbox_shard_count must be <= virtual_bucket_count (spec 5.2)")
        if self.event_group_max_items < 1 or self.event_group_max_bytes < 1:
            raise ValueError("event-group caps must be positive")
        if self.membership_event_broadcast_max_members < 0:
            raise ValueError("membership_event_broadcast_max_members must be >= 0")
        if self.max_retained_versions < 1:
            raise ValueError("max_retained_versions must be >= 1")

    @classmethod
    def from_settings(cls, settings: Settings) -> FanoutConfig:
        """The cluster-wide values in force (none of these is per tenant in Appendix B)."""
        return cls(
            mailbox_shard_count=settings.mailbox_shard_count,
            virtual_bucket_count=settings.virtual_bucket_count,
            event_group_max_items=settings.mailbox_event_group_max_items,
            event_group_max_bytes=settings.mailbox_event_group_max_bytes,
            membership_event_broadcast_max_members=settings.membership_event_broadcast_max_members,
        )

    def shard_of(self, tenant_id: str, user_id: str) -> int:
        """The MailboxShard of a user under this routing (spec 5.2)."""
        bucket = user_bucket(tenant_id, user_id, self.virtual_bucket_count)
        return mailbox_shard_id(bucket, self.mailbox_shard_count)

    def broadcasts(self, member_count: int) -> bool:
        """Spec 10.1.3: a change is broadcast iff the group is at most the threshold."""
        return member_count <= self.membership_event_broadcast_max_members
