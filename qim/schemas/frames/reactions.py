"""Reaction frames, opcodes 0x0900-0x09FF (§13.6).

REACT, REACTION_UPDATE, PULL_REACTIONS, REACTION_LIST.
"""

from __future__ import annotations

import msgspec

from qim.schemas.frames.base import U32, U64, Body

__all__ = ["MessageReactions", "PullReactions", "React", "ReactionList", "ReactionUpdate"]


class React(Body):
    """REACT (A.3 #18): ``action`` "add" or "remove"; duplicate add / no-op remove succeed."""

    conversation_id: str = ""
    conversation_seq: U64 = 0
    reaction_key: str = ""
    action: str = "add"


class ReactionUpdate(Body):
    """REACTION_UPDATE (A.4 #18): ``counts`` is the full map; apply only a greater version."""

    conversation_id: str = ""
    conversation_seq: U64 = 0
    counts: dict[str, U32] = msgspec.field(default_factory=dict)
    summary_version: U64 = 0
    self_reaction_keys: tuple[str, ...] | None = None


class PullReactions(Body):
    """PULL_REACTIONS (A.3 #19): limit <= reaction_detail_page_limit."""

    conversation_id: str = ""
    conversation_seq: U64 = 0
    reaction_key: str = ""
    offset: U32 = 0
    limit: U32 = 0


class ReactionList(Body):
    """REACTION_LIST (A.4 #19): ``users`` are user ids; empty past reaction_detail_max_members."""

    users: tuple[str, ...] = ()
    total: U32 = 0
    has_more: bool = False


class MessageReactions(Body):
    """The aggregate joined onto a message at read time (18.3.1; ``HistoryMessage.reactions``).

    Not a frame of Appendix A: the shape of ``REACTION_UPDATE`` minus the coordinates (the
    message carries them), so a device that reads history applies it like a pushed frame: only
    if ``summary_version`` is newer than what it holds. ``self_reaction_keys`` are the
    requester's, filled at read time (7.15), never stored.
    """

    counts: dict[str, U32] = msgspec.field(default_factory=dict)
    summary_version: U64 = 0
    self_reaction_keys: tuple[str, ...] = ()
