"""The node-level send-buffer budget at work (spec 11.3.3, I-27): the sum, and who pays.

Why: per-connection watermarks stop one slow client, but 100k connections each just under
soft can still exhaust the node together. Every connection reports its buffered octets (its
outbound queue + what its transport still holds) on each change; the node total is kept
incrementally, so the common case costs O(1). Only when the total passes
``node_send_buffer_budget`` does :func:`~qim.core.push.enforce_node_budget` run over the
connections' loads; its decision is applied at once:

* steps 2-3: the chosen connections drop their queued large-group (then small-group)
  PUSH_EVENTS -- largest offender first -- and go DEGRADED + dirty (11.3.3);
* step 5: the largest connections are closed (SLOW_CONSUMER);
* step 1 has nothing to drop yet (no ROOM_BATCH on this node) and step 4 (a longer
  ``next_ping_interval_ms`` for everyone) is counted but not sent: PONG/AUTH_OK still carry the
  configured interval.

Re-evaluation is rate-limited (``min_interval_ms``): a node still over budget while closed
sockets drain must not re-sort every connection on every frame.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol

from qim.core.push import BudgetDecision, ConnectionLoad, enforce_node_budget

__all__ = ["BudgetMember", "NodeSendBudget", "available_memory_bytes"]

DEFAULT_MIN_INTERVAL_MS: Final = 100


class BudgetMember(Protocol):
    """What the budget needs of a connection."""

    @property
    def conn_id(self) -> str: ...

    def send_load(self) -> ConnectionLoad: ...

    def shed_pushes(self, classes: frozenset[str]) -> None: ...

    def close_over_budget(self) -> None: ...


class NodeSendBudget:
    """Running total of the node's send buffers; enforces the ladder when it is exceeded."""

    def __init__(
        self,
        budget_bytes: int,
        clock_ms: Callable[[], int],
        *,
        on_decision: Callable[[BudgetDecision], None] | None = None,
        min_interval_ms: int = DEFAULT_MIN_INTERVAL_MS,
    ) -> None:
        if budget_bytes < 1:
            raise ValueError("node_send_buffer_budget must be positive")
        self.budget_bytes = budget_bytes
        self._clock_ms = clock_ms
        self._on_decision = on_decision
        self._min_interval_ms = min_interval_ms
        self._members: dict[str, tuple[BudgetMember, int]] = {}
        self._total = 0
        self._enforcing = False
        self._last_ms: int | None = None

    @property
    def total(self) -> int:
        return self._total

    def update(self, member: BudgetMember, buffered: int) -> None:
        """``member`` now buffers ``buffered`` octets; enforce the budget if the sum passed it."""
        _, before = self._members.get(member.conn_id, (member, 0))
        self._members[member.conn_id] = (member, buffered)
        self._total += buffered - before
        if self._total > self.budget_bytes:
            self.enforce()

    def remove(self, member: BudgetMember) -> None:
        _, before = self._members.pop(member.conn_id, (member, 0))
        self._total -= before

    def enforce(self) -> BudgetDecision | None:
        """Run the ladder now (unless already running or run within ``min_interval_ms``)."""
        now = self._clock_ms()
        recent = self._last_ms is not None and now - self._last_ms < self._min_interval_ms
        if self._enforcing or recent:
            return None
        self._enforcing, self._last_ms = True, now
        try:
            members = {cid: m for cid, (m, _) in self._members.items()}
            decision = enforce_node_budget(
                (m.send_load() for m in members.values()), self.budget_bytes
            )
            classes: dict[str, set[str]] = {}
            for cid in decision.drop_large_group:
                classes.setdefault(cid, set()).add("large_group")
            for cid in decision.drop_small_group:
                classes.setdefault(cid, set()).add("small_group")
            for cid, shed in classes.items():
                members[cid].shed_pushes(frozenset(shed))
            for cid in decision.close:
                members[cid].close_over_budget()
            if self._on_decision is not None and decision.over_budget:
                self._on_decision(decision)
            return decision
        finally:
            self._enforcing = False


def available_memory_bytes() -> int:
    """MemAvailable of this host (Linux), for ``node_send_buffer_budget``'s share; when
    unknown, enough that the spec's 8 GiB cap is what applies."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 8 * 1024**3 * 5
