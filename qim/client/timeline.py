"""A device's local timelines and unread counts from sync entries, type-agnostic (spec 13.3).

Why this exists: a client that meets a ``custom_type`` it does not know (or a ``schema_version``
newer than it supports) MUST still apply the entry's ``flags`` and ``anchor_mode`` to unread and
ordering, render a placeholder or skip the row, and MUST NOT fail the batch or stop its cursor
(13.3 hard requirement, 27.1.2). So nothing here reads a payload to decide anything, and no
entry can raise: every decision comes from fields of the A.4.1 entry struct.

The anchor of an entry is read from the entry itself, so an unknown type needs no registry:

* ``target_conversation_seq`` set -> ``anchor_target``: the row at that seq is updated in place
  (recall / edit, a custom status update); with no local row the entry is ignored, never an
  orphan row (13.4.2);
* ``TIMELINE_VISIBLE`` unset -> ``none``: no row;
* otherwise ``own_seq``: a row at its own ``conversation_seq``.

``COUNTS_UNREAD`` adds one unread above the conversation's read position (a sender's own entry
never carries it), ``AFFECTS_SESSION_ORDER`` moves the conversation's last activity. Entries
are applied once (by ``(conversation_id, mailbox_seq, event_id)``), so a re-pull or a push of
something already pulled changes nothing. Entries of unknown ``event_type`` are skipped for
rendering and counted (``unknown_event_skipped``); a MENTION entry adds nothing (its primary
entry carries the flags); user-state CONTROL entries belong to :class:`qim.client.SessionList`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from qim.schemas.frames import SyncEntry
from qim.schemas.frames.base import EntryFlags, EventType, u128_from_bytes

__all__ = ["Anchor", "ConversationTimeline", "Timeline", "TimelineRow", "anchor_of"]

Anchor: TypeAlias = Literal["own_seq", "anchor_target", "none"]
_KNOWN_EVENTS = frozenset(
    {int(EventType.MESSAGE), int(EventType.MEMBERSHIP), int(EventType.CONTROL)}
)


def anchor_of(entry: SyncEntry) -> Anchor:
    """The 13.3 ``anchor_mode`` an entry declares through its fields (module docstring)."""
    if entry.target_conversation_seq is not None:
        return "anchor_target"
    if not entry.flags & EntryFlags.TIMELINE_VISIBLE:
        return "none"
    return "own_seq"


@dataclass
class TimelineRow:
    """One rendered row. ``placeholder``: render the generic "[unsupported message]" (unknown
    type, newer schema, or no body in the entry); ``updates`` are the anchor_target entries
    applied to it, oldest first (the renderer shows the latest state)."""

    conversation_seq: int
    message_id: bytes
    sender_id: str
    message_type: int
    custom_type: str
    schema_version: int
    payload: bytes | None
    placeholder: bool
    updates: list[SyncEntry] = field(default_factory=list)


@dataclass
class ConversationTimeline:
    """Rows by seq, the local unread count above ``read_seq`` and the last activity."""

    rows: dict[int, TimelineRow] = field(default_factory=dict)
    unread: int = 0
    read_seq: int = 0
    last_activity_id: int = 0

    def ordered(self) -> list[TimelineRow]:
        return [self.rows[seq] for seq in sorted(self.rows)]


class Timeline:
    """Every conversation's local timeline of one user; :meth:`apply` never raises.

    ``known_custom_types`` maps the custom types this build renders to the highest
    ``schema_version`` it understands; anything else is a placeholder.
    """

    def __init__(self, user_id: str, known_custom_types: Mapping[str, int] | None = None) -> None:
        self.user_id = user_id
        self.known = dict(known_custom_types or {})
        self.conversations: dict[str, ConversationTimeline] = {}
        self.unknown_event_skipped = 0
        self.orphan_updates_ignored = 0
        self._applied: set[tuple[str, int, int]] = set()

    def conversation(self, conversation_id: str) -> ConversationTimeline:
        return self.conversations.setdefault(conversation_id, ConversationTimeline())

    def apply(self, entries: Iterable[SyncEntry]) -> int:
        """Apply entries in the order given (mailbox order); returns how many were new."""
        fresh = 0
        for entry in entries:
            key = (entry.conversation_id, entry.mailbox_seq, entry.event_id)
            if key in self._applied:
                continue
            self._applied.add(key)
            fresh += 1
            self._apply(entry)
        return fresh

    def mark_read(self, conversation_id: str, seq: int) -> None:
        """The local read position (this device's MARK_READ or a READ_SYNC): clears the count
        when it reaches the newest counted row; the server's SESSION_DELTA stays authoritative."""
        conv = self.conversation(conversation_id)
        if seq > conv.read_seq:
            conv.read_seq = seq
            conv.unread = 0

    def order(self) -> list[str]:
        """Conversation ids, most recent activity first (ties by id)."""
        return sorted(
            self.conversations,
            key=lambda c: (-self.conversations[c].last_activity_id, c),
        )

    def _apply(self, e: SyncEntry) -> None:
        if e.event_type == EventType.MENTION:
            return  # unread and order ride the primary entry of its event group
        if e.event_type not in _KNOWN_EVENTS:
            self.unknown_event_skipped += 1
            return
        if e.event_type == EventType.CONTROL and e.target_conversation_seq is None:
            return  # user-state events: SessionList.apply_state_entries
        conv = self.conversation(e.conversation_id)
        counts = e.flags & EntryFlags.COUNTS_UNREAD and e.sender_id != self.user_id
        if counts and e.conversation_seq > conv.read_seq:
            conv.unread += 1
        if e.flags & EntryFlags.AFFECTS_SESSION_ORDER:
            conv.last_activity_id = max(conv.last_activity_id, u128_from_bytes(e.last_activity_id))
        anchor = anchor_of(e)
        if anchor == "none":
            return
        if anchor == "anchor_target":
            target = conv.rows.get(e.target_conversation_seq or 0)
            if target is None:
                self.orphan_updates_ignored += 1
                return
            target.updates.append(e)
            return
        conv.rows[e.conversation_seq] = TimelineRow(
            conversation_seq=e.conversation_seq,
            message_id=e.message_id,
            sender_id=e.sender_id,
            message_type=e.message_type or 0,
            custom_type=e.custom_type or "",
            schema_version=e.schema_version or 0,
            payload=e.payload_or_ciphertext if e.body_included else None,
            placeholder=self._placeholder(e),
        )

    def _placeholder(self, e: SyncEntry) -> bool:
        if not e.body_included:
            return True
        if not e.custom_type:
            return False
        supported = self.known.get(e.custom_type)
        return supported is None or (e.schema_version or 0) > supported
