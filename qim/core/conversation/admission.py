"""Admission L1/L2 (spec 8.2) as GCRA token buckets derived from the commit log.

Order (spec 8.2): L1a ``per_sender_in_conversation_rate`` -> L1b ``per_user_msg_rate`` -> L2
``per_conversation_msg_rate`` (tiered by member count). The first layer that says no answers
``RATE_LIMITED`` with its ``retry_after_ms`` and nothing is consumed anywhere: :meth:`check` only
reads; tokens are taken by :meth:`debit`, which the writer calls from ``apply()`` for a committed
record at the record's ``committed_at``. A rejected, duplicate or crashed request therefore
consumes no token of any layer by construction (check first, then take), and the buckets are a
pure function of the outbox: replay and snapshots rebuild them exactly, so a rebalance does not
hand every sender a fresh burst (the Kafka-mapping note of spec 8 accepted that reset; we avoid it).

Each bucket is a GCRA cell: one integer, the theoretical arrival time ``tat`` (microseconds, Unix
epoch). A request at ``t`` conforms iff ``t >= tat - tolerance``; taking it sets
``tat = max(tat, t) + interval``. A cell with ``tat <= t`` is a full bucket, equivalent to no
cell, so cells are evicted in last-debit order once full: memory is bounded by the senders and
conversations of the last few seconds (at most ``burst x interval``: 2 s for L1b, 3 s for L1a).

A cell's state is time debt, not a token count, so when a conversation changes tier (spec 8.2:
"the tier flips on the next message after member_count crosses a threshold") the debt carries
over and the next message is checked and debited with the new tier's parameters.

Retry hints: ``check`` says when the refusing bucket's next token comes, which is exact for one
client but sends every sender refused in the same moment back together (one wins, the rest
are refused again). :meth:`AdmissionBuckets.promise` therefore tells each refusal a different
future token of that bucket (the same promise rule as the gateway's ``qim.core.ratelimit``):
an in-memory hint map beside the cells, never part of a decision, a snapshot or a replay (the
replies it shapes are not materialized), bounded by ``_MAX_HINT_US`` ahead.

Capacities: L1b's is ``per_user_msg_rate_burst`` (40); L1a's is the rate's count (1 per 3 s);
Appendix B gives L2 only a rate, so its capacity is one second of it (20, 5, 2; at least 1).

Where the buckets live, and two deliberate deviations:

* Spec 8.2 counts L1 at the ConnectionNode (local, cheap) and re-checks it at the ConversationWriter
  (authoritative, since a user's devices reach different ConnectionNodes); spec 20.4.1 lists
  ``per_user_msg_rate`` at the ConnectionNode. Our writer state is per outbox partition, so the
  L1b cell ``(tenant, user)`` is exact for all of a user's devices within one partition but a user
  writing to conversations on P partitions gets up to P x 20 msg/s in aggregate; the gateway's
  per-connection bucket is the other half. Cross-partition exactness would need a per-user
  counter on the send path (a second hop or Redis, which spec 3 item 9 forbids); spec T4 leaves
  the cross-conversation aggregate open (Q5).
* L1a applies only to conversations with more than ``large_group_member_threshold`` members,
  i.e. large groups (issue 4): at 1 msg / 3 s everywhere, ordinary one-to-one and small-group
  chatting would be throttled. ``WriterLimits.sender_in_conversation_min_members = 0`` restores
  the literal spec 8.2 / T3 rule (every conversation).

L2 is exact: one writer per conversation (spec 8.2: "the only natural counter").

Two more cells, with long intervals (they live in their own :class:`AdmissionBuckets`, so a
10-minute cell never holds back the eviction of the seconds-long ones):

* ``at_all_rate_per_conversation`` (spec 11.4.2, :func:`at_all_charges`): a cell per
  conversation taken by every committed @all; capacity = the rate's count. An @all is checked
  against L2 as well (in series) but takes no L2 token (``weight=0``): "the AT_ALL quota is
  metered separately and does not consume per_conversation_msg_rate tokens" (11.4.2, I-30).
* L3 ``tenant_fanout_quota`` (spec 8.2 / 10.5.2, :func:`fanout_charges`): one cell per tenant,
  charged by estimated entries (``weight`` = the pinned ``member_count``: 1:1 = 2, a group its
  version's count, I-11), capacity = the rate's count. Every send is debited; only a large
  group's send (more than ``large_group_member_threshold`` members) is refused, and only while
  the bucket is overdrawn: a send is admitted while at least one token is left and may take the
  level below zero (10.5.2: "> 100 % -> reject this tenant's large-group sends"), so a group
  larger than the bucket still gets its turn. Unset (the default) = not enforced. Metered per
  writer partition like L1b: the spec's FanoutCoordinator lease (8.2) that would make the
  bucket tenant-wide is not built, so a tenant writing on P partitions gets up to P x its
  quota in aggregate (topology.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

from qim.core.conversation.config import WriterLimits

__all__ = [
    "AT_ALL",
    "CONVERSATION",
    "FANOUT",
    "LONG_LAYERS",
    "REACTION",
    "SENDER_IN_CONVERSATION",
    "USER",
    "AdmissionBuckets",
    "BucketKey",
    "Cell",
    "Charge",
    "at_all_charges",
    "charges_for",
    "fanout_charges",
    "reaction_charges",
]

USER: Final = "user"
SENDER_IN_CONVERSATION: Final = "sender"
CONVERSATION: Final = "conversation"
REACTION: Final = "reaction"
AT_ALL: Final = "at_all"
FANOUT: Final = "fanout"
LONG_LAYERS: Final = frozenset({AT_ALL, FANOUT})
"""Layers whose cells live in the writer's second :class:`AdmissionBuckets` (long intervals)."""

BucketKey = tuple[str, str, str, str]
"""``(layer, tenant_id, conversation_id, user_id)``; unused parts are ``""``."""

_US_PER_MS: Final = 1000
_MAX_HINT_US: Final = 30_000_000  # promises run at most 30 s ahead


@dataclass(frozen=True, slots=True)
class Cell:
    """GCRA parameters: ``interval`` per token, ``tolerance = (capacity - 1) x interval``."""

    interval_us: int
    tolerance_us: int

    @classmethod
    def of(cls, per_second: float, capacity: int) -> Cell:
        if per_second <= 0 or capacity < 1:
            raise ValueError("a bucket needs a positive rate and capacity")
        interval = math.ceil(1_000_000 / per_second)  # round the rate down, never up
        return cls(interval, (capacity - 1) * interval)


@dataclass(frozen=True, slots=True)
class Charge:
    """One bucket a send would take ``weight`` tokens from; ``checked=False``: debited only,
    never a reason to refuse (L3 for a small conversation)."""

    key: BucketKey
    cell: Cell
    weight: int = 1
    checked: bool = True


def charges_for(
    limits: WriterLimits,
    tenant_id: str,
    conversation_id: str,
    member_count: int,
    sender_id: str,
    *,
    at_all: bool = False,
) -> tuple[Charge, ...]:
    """The buckets of one send, in the spec's evaluation order (L1a, L1b, L2).

    L1a is charged when the conversation has more members than the threshold; with the default
    (``large_group_member_threshold``, 1000) that is large groups only, a direct conversation
    never has more than 2. An @all (``at_all``) is checked against L2 but takes no L2 token.
    """
    out: list[Charge] = []
    if member_count > limits.sender_rate_threshold:
        rate = limits.per_sender_in_conversation_rate
        key = (SENDER_IN_CONVERSATION, tenant_id, conversation_id, sender_id)
        out.append(Charge(key, Cell.of(rate.per_second, rate.count)))
    user_rate = limits.per_user_msg_rate
    out.append(
        Charge(
            (USER, tenant_id, "", sender_id),
            Cell.of(user_rate.per_second, limits.per_user_msg_rate_burst),
        )
    )
    per_second = limits.per_conversation_msg_rate.for_members(member_count)
    out.append(
        Charge(
            (CONVERSATION, tenant_id, conversation_id, ""),
            Cell.of(per_second, max(1, math.floor(per_second))),
            weight=0 if at_all else 1,
        )
    )
    return tuple(out)


def at_all_charges(limits: WriterLimits, tenant_id: str, conversation_id: str) -> tuple[Charge]:
    """The ``at_all_rate_per_conversation`` cell of an @all (11.4.2); capacity = its count."""
    rate = limits.at_all_rate_per_conversation
    return (Charge((AT_ALL, tenant_id, conversation_id, ""), Cell.of(rate.per_second, rate.count)),)


def fanout_charges(limits: WriterLimits, tenant_id: str, member_count: int) -> tuple[Charge, ...]:
    """L3: ``member_count`` tokens of the tenant's ``tenant_fanout_quota`` (none when unset);
    checked for large groups only (module docstring)."""
    quota = limits.tenant_fanout_quota
    if quota is None:
        return ()
    return (
        Charge(
            (FANOUT, tenant_id, "", ""),
            Cell.of(quota.per_second, quota.count),
            weight=max(0, member_count),
            checked=member_count > limits.large_group_member_threshold,
        ),
    )


def reaction_charges(limits: WriterLimits, tenant_id: str, user_id: str) -> tuple[Charge, ...]:
    """The one bucket of a REACT: ``per_user_reaction_rate`` (13.6.3 item 4), capacity = its
    count (5 in a second), apart from every message bucket. Per writer partition, like L1b."""
    rate = limits.per_user_reaction_rate
    return (Charge((REACTION, tenant_id, "", user_id), Cell.of(rate.per_second, rate.count)),)


class AdmissionBuckets:
    """The GCRA cells of one writer partition, in last-debit order (the eviction order)."""

    __slots__ = ("_promised", "_tat")

    def __init__(self) -> None:
        self._tat: dict[BucketKey, int] = {}
        self._promised: dict[BucketKey, int] = {}  # hints only (module docstring)

    def check(self, charges: Iterable[Charge], now_ms: int) -> int | None:
        """None if every bucket conforms at ``now_ms``; else the first one's retry_after_ms."""
        t = now_ms * _US_PER_MS
        for charge in charges:
            if not charge.checked:
                continue
            tat = self._tat.get(charge.key)
            if tat is not None and t < tat - charge.cell.tolerance_us:
                wait_us = tat - charge.cell.tolerance_us - t
                return max(1, math.ceil(wait_us / _US_PER_MS))
        return None

    def promise(self, charges: Iterable[Charge], now_ms: int) -> int | None:
        """Like :meth:`check`, but a refusal is promised the refusing bucket's next token that
        no earlier refusal was promised, and its retry_after_ms says when that token comes."""
        t = now_ms * _US_PER_MS
        for charge in charges:
            if not charge.checked:
                continue
            tat = self._tat.get(charge.key)
            tolerance = charge.cell.tolerance_us
            if tat is None or t >= tat - tolerance:
                continue
            base = max(tat, self._promised.pop(charge.key, tat))
            conform_at = min(base - tolerance, max(t + _MAX_HINT_US, tat - tolerance))
            step = max(1, charge.weight) * charge.cell.interval_us
            self._promised[charge.key] = conform_at + tolerance + step
            return max(1, math.ceil((conform_at - t) / _US_PER_MS))
        return None

    def debit(self, charges: Iterable[Charge], at_ms: int) -> None:
        """Take ``weight`` tokens from each bucket at ``at_ms`` (a committed record's time)."""
        t = at_ms * _US_PER_MS
        for charge in charges:
            if charge.weight == 0:
                continue
            tat = self._tat.pop(charge.key, t)
            self._tat[charge.key] = max(tat, t) + charge.weight * charge.cell.interval_us
        self.evict(at_ms)

    def evict(self, now_ms: int) -> int:
        """Drop full buckets from the oldest debit on; stop at the first one still draining."""
        t = now_ms * _US_PER_MS
        while self._promised and next(iter(self._promised.values())) <= t:
            del self._promised[next(iter(self._promised))]
        dropped = 0
        while self._tat:
            key = next(iter(self._tat))
            if self._tat[key] > t:
                break
            del self._tat[key]
            dropped += 1
        return dropped

    def items(self) -> Iterator[tuple[BucketKey, int]]:
        """``(key, tat_us)`` in eviction order, for snapshots."""
        return iter(self._tat.items())

    def load(self, items: Iterable[tuple[BucketKey, int]]) -> None:
        """Restore from :meth:`items` output (order preserved)."""
        self._tat = dict(items)

    def __len__(self) -> int:
        return len(self._tat)
