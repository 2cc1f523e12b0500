"""``reaction_push_merge_window`` (13.6.3 item 2) on the ConversationWriter, pure.

Why the writer merges, and not the gateway: every reaction of a message is decided by the one
writer of its conversation, so holding there gives at most one REACTION_UPDATE per message per
window to every recipient connection (26.3.8: frames per ``conversation_seq`` within the window
<= 1) and also bounds the to-gateway traffic to one record per (message, ConnectionShard) per
window, whatever the reaction burst. Trailing window, like ``session_delta_merge_window``: the
first reaction of a message opens it, later ones replace the held aggregate (absolute values, so
merging drops earlier frames), and the window's end sends the newest. Versions only move forward:
a record whose ``summary_version`` is not above the held one changes nothing.

Each reactor's own keys are kept for the window (``self_reaction_keys``, 7.15: per requester):
the frame of a user who reacted carries its keys after its last reaction; everyone else's omits
them (``ReactionPush`` docstring).

Not durable, on purpose: a window held when the writer stops is lost. Nothing is lost for
good -- the aggregate is in the MessageStore and every read joins it (13.6.1); only the live
frame of that window is missing, the same as for a member who was offline.

Deterministic: no clock inside; the shell passes ``now_ms`` (monotonic) and asks :meth:`due`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import count

from qim.schemas.records.outbox import MessageReacted
from qim.schemas.records.reactions import ReactionPush

__all__ = ["MergedReaction", "ReactionPushMerge", "push_records"]

MessageKey = tuple[str, str, int]
"""``(tenant_id, conversation_id, conversation_seq)``."""


@dataclass(slots=True)
class MergedReaction:
    """A message's window: its newest record and the window's reactors' own keys."""

    due_ms: int
    record: MessageReacted
    self_keys: dict[str, tuple[str, ...]] = field(default_factory=dict)


class ReactionPushMerge:
    """Held reaction aggregates per message (module doc)."""

    def __init__(self, window_ms: int) -> None:
        if window_ms < 0:
            raise ValueError("window_ms must be >= 0")
        self.window_ms = window_ms
        self._held: dict[MessageKey, MergedReaction] = {}
        self._due: list[tuple[int, int, MessageKey]] = []
        self._arrival = count()
        self.offered = 0
        self.merged_away = 0

    def __len__(self) -> int:
        return len(self._held)

    def offer(self, record: MessageReacted, now_ms: int) -> int:
        """Hold ``record``; returns how many frames this merged away (0 or 1)."""
        self.offered += 1
        key = (record.tenant_id, record.conversation_id, record.target_conversation_seq)
        held = self._held.get(key)
        if held is None:
            held = MergedReaction(now_ms + self.window_ms, record)
            self._held[key] = held
            heapq.heappush(self._due, (held.due_ms, next(self._arrival), key))
            held.self_keys[record.user_id] = record.self_reaction_keys
            return 0
        self.merged_away += 1
        if record.summary_version > held.record.summary_version:
            held.record = record
            held.self_keys[record.user_id] = record.self_reaction_keys
        return 1

    def next_due_ms(self) -> int | None:
        return self._due[0][0] if self._due else None

    def due(self, now_ms: int) -> list[MergedReaction]:
        """Every window that ended by ``now_ms``, in due order; they are no longer held."""
        out: list[MergedReaction] = []
        while self._due and self._due[0][0] <= now_ms:
            _, _, key = heapq.heappop(self._due)
            out.append(self._held.pop(key))
        return out


def push_records(
    merged: MergedReaction,
    recipients: Iterable[str],
    connection_shard: Callable[[str], int],
) -> list[ReactionPush]:
    """One ReactionPush per ConnectionShard of ``recipients`` (ascending shard, sorted users)."""
    record = merged.record
    by_shard: dict[int, list[str]] = {}
    for user in sorted(set(recipients)):
        by_shard.setdefault(connection_shard(user), []).append(user)
    counts = dict(sorted(record.counts.items()))
    out = []
    for shard, users in sorted(by_shard.items()):
        mine = {u: merged.self_keys[u] for u in users if u in merged.self_keys}
        out.append(
            ReactionPush(
                tenant_id=record.tenant_id,
                connection_shard=shard,
                conversation_id=record.conversation_id,
                conversation_seq=record.target_conversation_seq,
                counts=counts,
                summary_version=record.summary_version,
                recipients=tuple(users),
                self_keys=mine,
            )
        )
    return out
