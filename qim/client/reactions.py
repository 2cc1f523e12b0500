"""The client's reaction aggregates: absolute frames applied only when newer (13.6.2).

One entry per message ``(conversation_id, conversation_seq)``: ``counts``, ``summary_version``
and the user's own keys. Every source is absolute -- a pushed REACTION_UPDATE, the reply to this
device's REACT, the ``reactions`` a HISTORY_BATCH message or a MAILBOX_BATCH message entry
carries (18.3.1) -- so applying means
replacing, and only a greater ``summary_version`` replaces (delivering one frame 100 times, or an
older one late, leaves the newest state: 26.3.8). ``self_reaction_keys`` None means "yours did
not change" (``ReactionPush``): the held keys stay. The user's keys change only through its own
REACTs, so keys are versioned apart (``keys_version``): an older frame that carries them (the
REACT's reply overtaken by a later push that omitted them) still sets them if they are newer
than the held ones. A recalled message's entry is dropped by
:meth:`ReactionState.forget`. Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from qim.schemas.events import EventType
from qim.schemas.frames.history import HistoryBatch
from qim.schemas.frames.mailbox import SyncEntry
from qim.schemas.frames.reactions import MessageReactions, ReactionUpdate

__all__ = ["MessageReactionState", "ReactionState"]

_GONE = frozenset({"RECALLED", "DELETED"})


@dataclass(slots=True)
class MessageReactionState:
    """What this client knows of one message's reactions."""

    counts: dict[str, int] = field(default_factory=dict)
    summary_version: int = 0
    self_reaction_keys: tuple[str, ...] = ()
    keys_version: int = 0
    """The ``summary_version`` of the frame that last carried the user's own keys."""


class ReactionState:
    """Aggregates by message (module doc)."""

    def __init__(self) -> None:
        self._messages: dict[tuple[str, int], MessageReactionState] = {}
        self.dropped = 0  # frames not newer than what was held

    def get(self, conversation_id: str, conversation_seq: int) -> MessageReactionState | None:
        return self._messages.get((conversation_id, conversation_seq))

    @property
    def messages(self) -> Mapping[tuple[str, int], MessageReactionState]:
        return self._messages

    def apply(self, update: ReactionUpdate) -> bool:
        """Apply a REACTION_UPDATE if it is newer; returns whether it was."""
        return self._apply(
            update.conversation_id,
            update.conversation_seq,
            update.counts,
            update.summary_version,
            update.self_reaction_keys,
        )

    def apply_history(self, conversation_id: str, batch: HistoryBatch) -> int:
        """Apply the aggregates a HISTORY_BATCH joined onto its messages; returns how many.
        A recalled or deleted message's aggregate is forgotten (13.6.4: the server deleted it)."""
        applied = 0
        for message in batch.messages:
            if message.state in _GONE:
                self.forget(conversation_id, message.conversation_seq)
                continue
            joined: MessageReactions | None = message.reactions
            if joined is not None:
                applied += self._apply(
                    conversation_id,
                    message.conversation_seq,
                    joined.counts,
                    joined.summary_version,
                    joined.self_reaction_keys,
                )
        return applied

    def apply_entries(self, entries: Iterable[SyncEntry]) -> int:
        """Apply the aggregates a MAILBOX_BATCH joined onto its MESSAGE entries; returns how
        many. The shard keeps no per-user detail, so the held ``self_reaction_keys`` stay
        (like a push that omits them); a recalled message's entry carries no aggregate."""
        applied = 0
        for entry in entries:
            joined = entry.reactions
            if joined is None or entry.event_type != EventType.MESSAGE:
                continue
            applied += self._apply(
                entry.conversation_id,
                entry.conversation_seq,
                joined.counts,
                joined.summary_version,
                None,
            )
        return applied

    def forget(self, conversation_id: str, conversation_seq: int) -> None:
        """The message was recalled or deleted: its aggregate is gone (13.6.4)."""
        self._messages.pop((conversation_id, conversation_seq), None)

    def _apply(
        self,
        conversation_id: str,
        seq: int,
        counts: Mapping[str, int],
        version: int,
        mine: tuple[str, ...] | None,
    ) -> bool:
        held = self._messages.get((conversation_id, seq))
        if held is not None and version <= held.summary_version:
            self.dropped += 1
            if mine is not None and version > held.keys_version:
                held.self_reaction_keys, held.keys_version = mine, version
            return False
        state = MessageReactionState(counts=dict(counts), summary_version=version)
        if mine is not None:
            state.self_reaction_keys, state.keys_version = mine, version
        elif held is not None:
            state.self_reaction_keys = held.self_reaction_keys
            state.keys_version = held.keys_version
        self._messages[(conversation_id, seq)] = state
        return True
