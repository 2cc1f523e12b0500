"""The Appendix B.6 values the session-list core works with, resolved once from ``Settings``.

Replay equality holds for equal configs: the unread truncation and the badge aggregation
depend on these values, so a standby folds with the same ones as its primary.
"""

from __future__ import annotations

from dataclasses import dataclass

from qim.params import Settings
from qim.params.values import PageLimit

__all__ = ["SessionListConfig"]


@dataclass(frozen=True, slots=True)
class SessionListConfig:
    """``unread_precise_limit``, ``include_muted_in_badge`` (per tenant), paging and quota."""

    unread_precise_limit: int = 200
    include_muted_in_badge: bool = False
    page_default: int = 50
    page_cap: int = 200
    max_conversations_per_user: int = 5000
    snapshot_ttl_ms: int = 300_000

    def __post_init__(self) -> None:
        if self.unread_precise_limit < 1:
            raise ValueError("unread_precise_limit must be >= 1")
        PageLimit(default=self.page_default, cap=self.page_cap)  # validates
        if self.max_conversations_per_user < 1:
            raise ValueError("max_conversations_per_user must be >= 1")

    @classmethod
    def from_settings(cls, settings: Settings) -> SessionListConfig:
        """Read with the tenant's settings (``Settings.for_tenant``): two values are per tenant."""
        page = settings.session_list_page_limit
        return cls(
            unread_precise_limit=settings.unread_precise_limit,
            include_muted_in_badge=settings.include_muted_in_badge,
            page_default=page.default,
            page_cap=page.cap,
            max_conversations_per_user=settings.max_conversations_per_user,
            snapshot_ttl_ms=settings.snapshot_ttl,
        )

    def page_limit(self, requested: int) -> int:
        """``limit`` 0 (absent) -> 50; above the cap -> 200 (12.8.1, case AT-36)."""
        return PageLimit(default=self.page_default, cap=self.page_cap).clamp(requested)
