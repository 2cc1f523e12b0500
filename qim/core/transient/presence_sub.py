"""PRESENCE_SUB (spec 13.2, AT-52/53): one connection's subscription set and its merge window.

Soft state per connection, never persisted, gone with the connection (a reconnect or a
REDIRECT starts with nothing; the client subscribes again). Rules:

* ``subscribe`` adds, ``unsubscribe`` removes, ``replace`` swaps the whole set; targets are
  user ids of the subscriber's own tenant (a conversation's members are resolved into user ids
  before they get here);
* at most ``presence_sub_max_targets`` users per connection: a request that would go over it
  changes **nothing** (never a partial subscription) and is refused (``None``);
* a ``subscribe`` / ``replace`` is answered with a **full snapshot** of every target; later,
  only the targets whose state changed since they were last shown are sent;
* merged per connection over ``presence_sub_merge_window``: at most one incremental frame per
  window. The first change after a quiet window goes out at once (propagation target
  ``presence_propagation_target`` p99 <= 1 s); changes inside the window wait for its end and
  leave together, each user once, in its latest state.

Time is an argument (epoch ms); nothing here reads a clock or does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

__all__ = [
    "ACTIONS",
    "OFFLINE",
    "ONLINE",
    "PresenceState",
    "PresenceSubscription",
    "SubscriptionChange",
]

ONLINE: Final = "online"
OFFLINE: Final = "offline"
ACTIONS: Final = ("subscribe", "unsubscribe", "replace")

Action = Literal["subscribe", "unsubscribe", "replace"]


@dataclass(frozen=True, slots=True)
class PresenceState:
    """What a subscriber is shown of one user: ``state`` and ``last_active_at`` (epoch ms)."""

    state: str = OFFLINE
    last_active_at: int = 0


@dataclass(frozen=True, slots=True)
class SubscriptionChange:
    """An accepted request: ``snapshot`` (sorted) is what its reply shows, ``added`` and
    ``removed`` what the node's watch index must learn."""

    snapshot: tuple[str, ...]
    added: tuple[str, ...]
    removed: tuple[str, ...]


@dataclass
class PresenceSubscription:
    """The PRESENCE_SUB state of one connection."""

    max_targets: int = 200
    merge_window_ms: int = 2000
    targets: set[str] = field(default_factory=set)
    shown: dict[str, str] = field(default_factory=dict)  # user -> state last sent
    dirty: set[str] = field(default_factory=set)
    last_push_ms: int | None = None

    def update(self, action: str, users: Iterable[str]) -> SubscriptionChange | None:
        """Apply one request; None (and nothing changed) when it would exceed the limit."""
        wanted = set(users)
        if action == "unsubscribe":
            removed = self.targets & wanted
            self.targets -= removed
            self._forget(removed)
            return SubscriptionChange((), (), tuple(sorted(removed)))
        new = wanted if action == "replace" else self.targets | wanted
        if len(new) > self.max_targets:
            return None
        added, removed = new - self.targets, self.targets - new
        self.targets = new
        self._forget(removed)
        return SubscriptionChange(tuple(sorted(new)), tuple(sorted(added)), tuple(sorted(removed)))

    def snapshot(
        self, users: Iterable[str], states: Mapping[str, PresenceState]
    ) -> list[tuple[str, PresenceState]]:
        """The reply's entries; they count as shown (a pending change of theirs is moot)."""
        out: list[tuple[str, PresenceState]] = []
        for user in users:
            state = states.get(user, PresenceState())
            self.shown[user] = state.state
            self.dirty.discard(user)
            out.append((user, state))
        return out

    def changed(self, user: str, now_ms: int) -> int | None:
        """A target's state may have changed: when to flush (now or the window's end), or
        None when this connection does not watch the user."""
        if user not in self.targets:
            return None
        self.dirty.add(user)
        return self.due_ms(now_ms)

    def due_ms(self, now_ms: int) -> int | None:
        """When the pending changes may leave (None: nothing pending)."""
        if not self.dirty:
            return None
        if self.last_push_ms is None:
            return now_ms
        return max(now_ms, self.last_push_ms + self.merge_window_ms)

    def flush(
        self, now_ms: int, states: Mapping[str, PresenceState]
    ) -> list[tuple[str, PresenceState]]:
        """The incremental entries due at ``now_ms`` (empty: none due or none differ)."""
        due = self.due_ms(now_ms)
        if due is None or due > now_ms:
            return []
        out: list[tuple[str, PresenceState]] = []
        for user in sorted(self.dirty):
            state = states.get(user, PresenceState())
            if self.shown.get(user) != state.state:
                self.shown[user] = state.state
                out.append((user, state))
        self.dirty.clear()
        if out:
            self.last_push_ms = now_ms
        return out

    def _forget(self, users: Iterable[str]) -> None:
        for user in users:
            self.shown.pop(user, None)
            self.dirty.discard(user)
