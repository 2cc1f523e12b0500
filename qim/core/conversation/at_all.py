"""The @all gate of spec 11.4.2 as pure rules: who may @all, how often, and the daily quota.

A SEND_MESSAGE mentions all iff its ``mention_targets`` holds ``MENTION_ALL`` (7.1). On top of
the ordinary admission (in series, 11.4.2) such a send must pass, in this order:

1. ``at_all_min_role`` -- in a conversation with more than ``large_group_member_threshold``
   members, the sender's role must rank at least this (ADMIN by default; OWNER > ADMIN > MEMBER
   > GUEST, ``qim.core.membership.roles.rank``). Below the threshold anyone may @all;
2. ``at_all_rate_per_conversation`` -- a GCRA cell per conversation
   (``admission.at_all_charges``, 1 per 10 min by default);
3. ``at_all_daily_quota_per_sender`` -- :class:`DailyQuota`, a count per (tenant, sender) and
   UTC day of the record's ``committed_at`` (10 by default).

Every refusal is ``ERROR{code=RATE_LIMITED, retry_after_ms}`` (11.4.2 "any failure is rejected
in ConversationWriter with RATE_LIMITED", acceptance 26 #37), never a send downgraded to a plain
message (I-30). ``detail`` names the limit. The role refusal is not fixed by waiting, so its
``retry_after_ms`` is ``RETRY_AFTER_NEVER_MS`` (the convention of 20.4.1 rule 2 for limits no
wait can fix; the SDK does not retry it).

The day is a calendar day in UTC, not a sliding 24 h: "10 per day" read literally, with an exact
``retry_after_ms`` (to the next midnight). Tenants' time zones are not modelled. Like L1b the
count is per writer partition: a sender's @alls in conversations on P partitions are counted P
ways (module docstring of ``admission``).

State and determinism: the counts are taken in ``apply()`` of a committed @all at its
``committed_at`` and checked at the writer's log time, so they are a pure function of the
outbox (snapshot rows, replay); a rejected @all takes nothing anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

from qim.core.membership.roles import rank
from qim.schemas.frames.base import MENTION_ALL

__all__ = [
    "DAY_MS",
    "DETAIL_DAILY",
    "DETAIL_RATE",
    "DETAIL_ROLE",
    "DailyKey",
    "DailyQuota",
    "mentions_all",
    "role_refused",
]

DAY_MS: Final = 86_400_000
DETAIL_ROLE: Final = "at_all_min_role"
DETAIL_RATE: Final = "at_all_rate_per_conversation"
DETAIL_DAILY: Final = "at_all_daily_quota_per_sender"

DailyKey = tuple[str, str]
"""``(tenant_id, sender_id)``."""


def mentions_all(mention_targets: Iterable[str]) -> bool:
    """True iff the message is an @all (7.1: ``mention_targets`` holds ``MENTION_ALL``)."""
    return MENTION_ALL in mention_targets


def role_refused(
    member_count: int, role: str, *, min_role: str, large_group_member_threshold: int
) -> bool:
    """11.4.2: above the threshold, a sender ranking below ``min_role`` may not @all.

    An unknown ``role`` ranks lowest (never a reason to admit); an unknown ``min_role`` is
    refused by parameter validation (its ``choices``)."""
    return member_count > large_group_member_threshold and rank(role) < rank(min_role)


class DailyQuota:
    """@all counts per (tenant, sender) for the current UTC day, in first-use order.

    A row is ``(day, count)`` with ``day = committed_at // DAY_MS``; a row of an earlier day is
    an unused quota, equivalent to no row, so rows are evicted once their day is over.
    """

    __slots__ = ("_rows",)

    def __init__(self) -> None:
        self._rows: dict[DailyKey, tuple[int, int]] = {}

    def check(self, key: DailyKey, quota: int, now_ms: int) -> int | None:
        """None if one more @all fits today; else retry_after_ms (to the next UTC midnight)."""
        day = now_ms // DAY_MS
        used = self.used(key, now_ms)
        if used < quota:
            return None
        return max(1, (day + 1) * DAY_MS - now_ms)

    def used(self, key: DailyKey, now_ms: int) -> int:
        """@alls ``key`` committed on ``now_ms``'s UTC day."""
        row = self._rows.get(key)
        if row is None or row[0] != now_ms // DAY_MS:
            return 0
        return row[1]

    def debit(self, key: DailyKey, at_ms: int) -> None:
        """Count one committed @all at ``at_ms`` (its record's ``committed_at``)."""
        day = at_ms // DAY_MS
        row = self._rows.pop(key, None)
        if row is None or row[0] < day:
            row = (day, 0)
        # a record of an earlier day than the row's (log time never goes back) adds to the row
        self._rows[key] = (row[0], row[1] + 1)
        self.evict(at_ms)

    def evict(self, now_ms: int) -> int:
        """Drop rows of days before ``now_ms``'s, oldest first; stop at the first current one."""
        day = now_ms // DAY_MS
        dropped = 0
        while self._rows:
            key = next(iter(self._rows))
            if self._rows[key][0] >= day:
                break
            del self._rows[key]
            dropped += 1
        return dropped

    def items(self) -> Iterator[tuple[DailyKey, int, int]]:
        """``(key, day, count)`` in eviction order, for snapshots."""
        return ((key, day, count) for key, (day, count) in self._rows.items())

    def load(self, items: Iterable[tuple[DailyKey, int, int]]) -> None:
        """Restore from :meth:`items` output (order preserved)."""
        self._rows = {key: (day, count) for key, day, count in items}

    def __len__(self) -> int:
        return len(self._rows)
