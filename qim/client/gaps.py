"""The client's gap rule for ``mention_only`` conversations (spec 10.2.3 hard rules 2-3, 6.10.1).

Why the client keeps its own coverage: in a read-diffusion conversation the silent-period
messages have no mailbox entry, and 6.10.1 forbids reading a gap from ``conversation_seq``
differences. The only legal signal is the server's bound: ``SESSION_LIST_BATCH.sessions[]``
says ``write_policy = mention_only`` and gives ``latest_conversation_seq``. So the client
records how far its history is known complete (``through``: every message up to it is held,
filled by PULL_HISTORY pages, never by mailbox entries), and on entering the conversation
compares that with ``latest_conversation_seq``: anything above is one gap, filled with
PULL_HISTORY ``newer`` from ``through``. An ``always`` conversation never asks (rule 3): its
mailbox entries are complete.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qim.schemas.frames.history import HistoryBatch, SessionEntry

__all__ = ["MENTION_ONLY", "HistoryCoverage"]

MENTION_ONLY = "mention_only"


@dataclass
class HistoryCoverage:
    """Per conversation, the highest ``conversation_seq`` through which history is complete."""

    through: dict[str, int] = field(default_factory=dict)

    def gap(self, row: SessionEntry | None) -> tuple[int, int] | None:
        """``(after, up_to]`` to fill before rendering ``row``'s conversation, or None."""
        if row is None or row.write_policy != MENTION_ONLY:
            return None
        held = self.through.get(row.conversation_id, 0)
        if held >= row.latest_conversation_seq:
            return None
        return held, row.latest_conversation_seq

    def filled(self, conversation_id: str, after: int, batch: HistoryBatch) -> int:
        """Record a ``newer`` page pulled from ``after``; returns the new ``through``. A page
        without more ends at the server's latest; one with more at its last message."""
        held = self.through.get(conversation_id, 0)
        if after > held:
            return held  # a page above a hole proves nothing about the hole
        seqs = [m.conversation_seq for m in batch.messages]
        top = batch.latest_conversation_seq if not batch.has_more else max(seqs, default=after)
        new = max(held, top)
        self.through[conversation_id] = new
        return new
