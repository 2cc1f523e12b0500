"""The SDK's local session list (spec 12.6.2, 12.8.3): pages, SESSION_DELTA, BADGE_UPDATE,
READ_SYNC, all by overwrite, never by addition.

Why versions per row: a SESSION_DELTA overwrites a row only with a strictly larger
``projection_mailbox_seq`` (12.6.2; late or duplicate frames are dropped whole), so frames can
be replayed or reordered without drift. A page row has no version; a conversation already
updated by a delta keeps the delta's values when a later page repeats it (12.8.3: deduplicate
later pages by ``conversation_id``). A page of another ``snapshot_revision`` than the one being
paged means the server restarted the list: everything is dropped and paging starts again.
A delta whose driving entry the device has not applied yet is a gap (12.6.4): it is held
(the latest per conversation, by replacement) and applied by :meth:`SessionList.caught_up`
once the device's mailbox position reaches its driving entry (a push or a PULL_MAILBOX);
nothing is guessed meanwhile.
A user-state CONTROL entry (another device's pin, mute, archive, delete; 12.9) carries the
absolute UserConversationState: a pushed one updates the row's structure at once (no
SESSION_DELTA carries it) and a delete removes the row (INV-32), newest entry first wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from qim.core.mailbox.user_state import USER_STATE_CUSTOM_TYPE
from qim.core.session_list import ClientSessionCache, DeltaOutcome, UserConversationState
from qim.schemas.frames import Body, PushEvents, SyncEntry
from qim.schemas.frames.base import EventType, u128_from_bytes
from qim.schemas.frames.control import ReadSync
from qim.schemas.frames.history import BadgeUpdate, SessionDelta, SessionEntry, SessionListBatch

__all__ = ["SessionList"]

_NO_PIN = 2**31
_STATE: msgspec.msgpack.Decoder[UserConversationState] = msgspec.msgpack.Decoder(
    UserConversationState
)


@dataclass
class SessionList:
    """One device's conversation list as it renders it (process memory)."""

    rows: dict[str, SessionEntry] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    cache: ClientSessionCache = field(default_factory=ClientSessionCache)
    revision: int = 0
    state_seqs: dict[str, int] = field(default_factory=dict)
    """mailbox_seq of the newest user-state CONTROL entry applied, per conversation."""
    gaps: int = 0
    held: dict[str, SessionDelta] = field(default_factory=dict)

    @property
    def badge(self) -> BadgeUpdate | None:
        return self.cache.badge

    def apply_page(self, batch: SessionListBatch, *, first: bool) -> bool:
        """Merge one page; False when its revision is not the one being paged (restart)."""
        if first or batch.snapshot_revision != self.revision:
            restarted = not first
            self.rows = {c: r for c, r in self.rows.items() if self.versions.get(c, 0) > 0}
            self.revision = batch.snapshot_revision
            if restarted:
                return False
        for entry in batch.sessions:
            conv = entry.conversation_id
            local = self.rows.get(conv)
            if local is None or self.versions.get(conv, 0) == 0:
                self.rows[conv] = entry
                continue
            # A delta-versioned row keeps its content (12.6.2: only a newer
            # projection_mailbox_seq overwrites it, and page rows carry none); the structure
            # (pin, mute, archive, policy) comes from the page, since no delta carries it.
            self.rows[conv] = msgspec.structs.replace(
                local,
                pin_rank=entry.pin_rank,
                muted=entry.muted,
                archived=entry.archived,
                write_policy=entry.write_policy,
                delivered_conversation_seq=entry.delivered_conversation_seq,
                read_conversation_seq=max(local.read_conversation_seq, entry.read_conversation_seq),
            )
        return True

    def apply_delta(self, delta: SessionDelta, last_applied_mailbox_seq: int) -> DeltaOutcome:
        outcome = self.cache.apply_delta(delta, last_applied_mailbox_seq)
        if outcome is DeltaOutcome.GAP:
            self.gaps += 1
            waiting = self.held.get(delta.conversation_id)
            if waiting is None or delta.projection_mailbox_seq > waiting.projection_mailbox_seq:
                self.held[delta.conversation_id] = delta
        if outcome is not DeltaOutcome.APPLIED:
            return outcome
        conv = delta.conversation_id
        held = self.rows.get(conv) or SessionEntry(conversation_id=conv)
        self.rows[conv] = msgspec.structs.replace(
            held,
            unread_count=delta.unread_count,
            mention_count=delta.mention_count,
            latest_conversation_seq=delta.latest_conversation_seq,
            last_activity_id=delta.last_activity_id,
            last_message_id=delta.last_message_id,
            preview_or_placeholder=delta.preview_or_placeholder,
            unread_exact=delta.unread_exact,
            mention_first_conversation_seq=delta.mention_first_conversation_seq,
        )
        self.versions[conv] = delta.projection_mailbox_seq
        return outcome

    def caught_up(self, last_applied_mailbox_seq: int) -> int:
        """Apply the held deltas whose driving entry is now applied; returns how many."""
        ready = [d for d in self.held.values() if d.driving_mailbox_seq <= last_applied_mailbox_seq]
        for delta in sorted(ready, key=lambda d: (d.projection_mailbox_seq, d.conversation_id)):
            del self.held[delta.conversation_id]
            self.apply_delta(delta, last_applied_mailbox_seq)
        return len(ready)

    def apply_read_sync(self, sync: ReadSync) -> bool:
        """A read watermark (another device's READ_SYNC, or this device's MARK_READ): forward
        only. READ_SYNC carries no count, the receiver recomputes (A.4): read up to the
        latest message -> nothing unread; otherwise the SESSION_DELTA brings the counts."""
        held = self.rows.get(sync.conversation_id)
        if held is None or sync.read_conversation_seq <= held.read_conversation_seq:
            return False
        updates: dict[str, object] = {"read_conversation_seq": sync.read_conversation_seq}
        if sync.read_conversation_seq >= held.latest_conversation_seq:
            updates |= {"unread_count": 0, "unread_exact": True, "mention_count": 0}
            updates["mention_first_conversation_seq"] = 0
        self.rows[sync.conversation_id] = msgspec.structs.replace(held, **updates)
        return True

    def apply_badge(self, update: BadgeUpdate) -> bool:
        return self.cache.apply_badge(update)

    def apply_state_entries(self, entries: tuple[SyncEntry, ...] | list[SyncEntry]) -> int:
        """Apply the user-state CONTROL entries among ``entries``; returns how many changed a
        row. Undecodable or older entries change nothing."""
        changed = 0
        for e in entries:
            if e.event_type != EventType.CONTROL or e.custom_type != USER_STATE_CUSTOM_TYPE:
                continue
            conv = e.conversation_id
            row = self.rows.get(conv)
            if row is None or e.mailbox_seq <= self.state_seqs.get(conv, 0):
                continue
            try:
                state = _STATE.decode(e.payload_or_ciphertext or b"")
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            self.state_seqs[conv] = e.mailbox_seq
            if state.deleted_before_conversation_seq >= row.latest_conversation_seq:
                del self.rows[conv]
                self.versions.pop(conv, None)
            else:
                self.rows[conv] = msgspec.structs.replace(
                    row,
                    pin_rank=state.pin_rank,
                    muted=state.muted,
                    archived=state.archived,
                    read_conversation_seq=max(
                        row.read_conversation_seq, state.read_conversation_seq
                    ),
                )
            changed += 1
        return changed

    def on_frame(self, body: Body, last_applied_mailbox_seq: int) -> bool:
        """Apply a server-initiated frame if it is one of ours; True when it was (a
        PUSH_EVENTS is the sync's: only its user-state entries are read here)."""
        if isinstance(body, PushEvents):
            self.apply_state_entries(body.events)
            return False
        if isinstance(body, SessionDelta):
            self.apply_delta(body, last_applied_mailbox_seq)
        elif isinstance(body, BadgeUpdate):
            self.apply_badge(body)
        elif isinstance(body, ReadSync):
            self.apply_read_sync(body)
        else:
            return False
        return True

    def ordered(self, *, include_archived: bool = True) -> list[SessionEntry]:
        """Pinned, then normal, then archived; newest activity first, conversation id last."""
        rows = [r for r in self.rows.values() if include_archived or not r.archived]

        def key(r: SessionEntry) -> tuple[int, int, int, str]:
            zone = 2 if r.archived else (0 if r.pin_rank is not None else 1)
            pin = r.pin_rank if r.pin_rank is not None and not r.archived else _NO_PIN
            return (zone, pin, -u128_from_bytes(r.last_activity_id), r.conversation_id)

        return sorted(rows, key=key)
