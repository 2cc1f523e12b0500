"""TYPING (spec 13.2): who gets a user's typing indicator, and how often.

Decided where the membership is, the conversation's ConversationWriter, because only it knows
who the members are and how many (the gateway does not):

* only a current member may type; anyone else is refused (PERMISSION_DENIED, like a send);
* above ``large_group_member_threshold`` members nothing is forwarded at all;
* at most one indicator per ``(tenant, conversation, user)`` per ``typing_merge_window``: a
  TYPING inside the window of the last forwarded one is merged into it (dropped), since the
  indicator it would refresh is still shown (it lives ``typing_ttl``, there is no stop frame);
* the recipients are the *other* members: never the sender's own devices.

The gate's memory is bounded: keys older than the window are forgotten as new ones arrive,
and past ``max_keys`` the oldest go first (forgetting one only lets one early frame through).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "TypingForward",
    "TypingGate",
    "TypingRules",
    "TypingVerdict",
    "by_connection_shard",
    "decide_typing",
]

TypingKey = tuple[str, str, str]  # tenant, conversation, user


@dataclass(frozen=True, slots=True)
class TypingRules:
    """Appendix B's typing rows (B.6.1), tenant-configurable."""

    merge_window_ms: int = 2000  # typing_merge_window
    ttl_ms: int = 5000  # typing_ttl, the downlink's expires_in_ms
    large_group_member_threshold: int = 1000


class TypingVerdict(Enum):
    NOT_A_MEMBER = "not_a_member"
    TOO_LARGE = "too_large"  # more members than large_group_member_threshold
    MERGED = "merged"  # inside the merge window of the last forwarded one
    ALONE = "alone"  # no other member to tell
    FORWARD = "forward"


@dataclass(frozen=True, slots=True)
class TypingForward:
    """What to do with one TYPING; ``recipients`` (sorted) are set for FORWARD only."""

    verdict: TypingVerdict
    recipients: tuple[str, ...] = ()
    expires_in_ms: int = 0


class TypingGate:
    """The merge window's memory: when each key last had an indicator forwarded."""

    def __init__(self, window_ms: int, *, max_keys: int = 100_000) -> None:
        self.window_ms = window_ms
        self.max_keys = max_keys
        self._last: dict[TypingKey, int] = {}  # insertion order = forwarding order

    def admit(self, key: TypingKey, now_ms: int) -> bool:
        """True (and remember ``now_ms``) when ``key`` had nothing forwarded in the window."""
        self._forget(now_ms)
        last = self._last.get(key)
        if last is not None and now_ms - last < self.window_ms:
            return False
        self._last.pop(key, None)  # re-insert at the end: the dict stays in forwarding order
        self._last[key] = now_ms
        return True

    def __len__(self) -> int:
        return len(self._last)

    def _forget(self, now_ms: int) -> None:
        last = self._last
        while last:
            oldest = next(iter(last))
            if now_ms - last[oldest] < self.window_ms and len(last) < self.max_keys:
                return
            del last[oldest]


def decide_typing(
    key: TypingKey,
    *,
    members: Callable[[], Iterable[str]] | None,
    member_count: int,
    gate: TypingGate,
    rules: TypingRules,
    now_ms: int,
) -> TypingForward:
    """One TYPING by ``key``'s user. ``members`` lists the current members (None: the user is
    not one); it is only called once the indicator is to be forwarded."""
    if members is None:
        return TypingForward(TypingVerdict.NOT_A_MEMBER)
    if member_count > rules.large_group_member_threshold:
        return TypingForward(TypingVerdict.TOO_LARGE)
    if not gate.admit(key, now_ms):
        return TypingForward(TypingVerdict.MERGED)
    sender = key[2]
    others = tuple(sorted({m for m in members() if m != sender}))
    if not others:
        return TypingForward(TypingVerdict.ALONE)
    return TypingForward(TypingVerdict.FORWARD, others, rules.ttl_ms)


def by_connection_shard(
    users: Iterable[str], shard_of: Callable[[str], int]
) -> Mapping[int, tuple[str, ...]]:
    """Users grouped by their ConnectionShard, shards ascending, users sorted: one to-gateway
    record per shard carries all of them (``shard_of`` maps a user id to its shard)."""
    grouped: dict[int, list[str]] = {}
    for user in sorted(set(users)):
        grouped.setdefault(shard_of(user), []).append(user)
    return {shard: tuple(grouped[shard]) for shard in sorted(grouped)}
