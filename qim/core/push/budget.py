"""The node-level send-buffer budget (spec 11.3.3, I-27): which connections pay when it is
exceeded.

Why a second level: per-connection watermarks stop one slow client, but 100k connections
each just under soft can still exhaust a node together. ``node_send_buffer_budget`` =
``min(available memory x 20 %, 8 GiB)`` (B.5) caps the sum. Over budget, the ladder runs
strictly in order, re-evaluating after each step and stopping once back under budget:

1. drop pending ROOM_BATCH frames (chatroom loss is by design, 14);
2. drop large-group PUSH_EVENTS and put those connections in DEGRADED + dirty;
3. the same for small-group PUSH_EVENTS;
4. lengthen ``next_ping_interval_ms`` on every connection (frees nothing now: it cuts the
   heartbeat and pull pressure that follows, 15.1.3);
5. close connections in descending order of buffer usage (reconnects are throttled by
   ``takeover_admit_rate``).

Within steps 1-3 and 5 we go connection by connection, **largest offender first**, and stop
as soon as the total is under budget, so a slightly-over node degrades a few heavy
connections instead of every large-group reader. Ties break on ``connection_id``, so the
decision is a pure function of its input. Drops never touch a mailbox (I-26).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["BudgetDecision", "ConnectionLoad", "enforce_node_budget"]


@dataclass(frozen=True, slots=True)
class ConnectionLoad:
    """One connection's buffered bytes, and how much of it each droppable class holds."""

    connection_id: str
    buffered_bytes: int  # everything queued for the socket, all streams
    room_bytes: int = 0  # ROOM_BATCH
    large_group_bytes: int = 0  # PUSH_EVENTS of groups above large_group_member_threshold
    small_group_bytes: int = 0  # PUSH_EVENTS of the other groups

    def __post_init__(self) -> None:
        droppable = self.room_bytes + self.large_group_bytes + self.small_group_bytes
        if min(self.buffered_bytes, self.room_bytes) < 0 or droppable > self.buffered_bytes:
            raise ValueError(f"inconsistent load of {self.connection_id!r}")


@dataclass(frozen=True, slots=True)
class BudgetDecision:
    """What the ConnectionNode does now; empty when the node is within budget."""

    total_before: int
    total_after: int  # estimated, once the drops and closes below are done
    drop_room: tuple[str, ...] = ()  # step 1: purge their ROOM_BATCH frames
    drop_large_group: tuple[str, ...] = ()  # step 2: purge their large-group PUSH_EVENTS
    drop_small_group: tuple[str, ...] = ()  # step 3: purge their small-group PUSH_EVENTS
    lengthen_ping: bool = False  # step 4
    close: tuple[str, ...] = ()  # step 5
    steps: tuple[int, ...] = field(default=())

    @property
    def over_budget(self) -> bool:
        return bool(self.steps)

    @property
    def degrade(self) -> tuple[str, ...]:
        """Steps 2-3: call ``ConnectionPush.over_budget(purged...)`` on each, once."""
        return tuple(dict.fromkeys(self.drop_large_group + self.drop_small_group))


def enforce_node_budget(loads: Iterable[ConnectionLoad], budget_bytes: int) -> BudgetDecision:
    """Run the 11.3.3 ladder over the node's connections (module doc)."""
    conns = sorted(loads, key=lambda c: c.connection_id)
    total = sum(c.buffered_bytes for c in conns)
    before = total
    if total <= budget_bytes:
        return BudgetDecision(before, total)
    remaining = {c.connection_id: c.buffered_bytes for c in conns}
    steps: list[int] = []
    chosen: dict[int, list[str]] = {1: [], 2: [], 3: [], 5: []}

    def shed(step: int, amount: dict[str, int]) -> None:
        nonlocal total
        candidates = sorted((-n, cid) for cid, n in amount.items() if n > 0)
        if total <= budget_bytes or not candidates:
            return
        steps.append(step)
        for negative, cid in candidates:
            if total <= budget_bytes:
                break
            freed = min(-negative, remaining[cid])
            remaining[cid] -= freed
            total -= freed
            chosen[step].append(cid)

    shed(1, {c.connection_id: c.room_bytes for c in conns})
    shed(2, {c.connection_id: c.large_group_bytes for c in conns})
    shed(3, {c.connection_id: c.small_group_bytes for c in conns})
    lengthen = total > budget_bytes
    if lengthen:
        steps.append(4)
    shed(5, dict(remaining))
    return BudgetDecision(
        total_before=before,
        total_after=total,
        drop_room=tuple(chosen[1]),
        drop_large_group=tuple(chosen[2]),
        drop_small_group=tuple(chosen[3]),
        lengthen_ping=lengthen,
        close=tuple(chosen[5]),
        steps=tuple(steps),
    )
