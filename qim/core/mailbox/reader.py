"""The read side of a MailboxShard's store: :class:`MailboxReader` over any :class:`KVReader`.

Why it reads the way it does (spec 2.3 criterion 1, 9.1, 18.3.1): ``read_user_range`` is one
prefix seek at ``(user, after_seq + 1)`` and then one key per entry, stopping at the first key
past ``up_to_seq`` or at the end of the user's prefix -- the shard's other users are never
touched, however many events the shard holds. Bodies are joined afterwards, once per
``message_id`` per batch (:func:`join_bodies`), never by a per-entry point lookup against the
MessageStore. A recalled or deleted message's body is never served again (13.4; issue 14): its
entry, inline or not, goes out with ``body_included=false`` -- the client shows the recalled
state from the CONTROL entry that follows, or from PULL_HISTORY. A MESSAGE entry also carries
the message's reaction aggregate as of the shard's log (``SyncEntry.reactions``, 13.6), read
from the same facts row as the recall state, so the join costs no extra read: a new device sees
the counts without replaying reaction events.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import msgspec

from qim.core.mailbox import keys
from qim.core.mailbox.ports import EventGroup, KVReader, MailboxReader
from qim.core.mailbox.session_store import StoredFacts, decode_facts, facts_key
from qim.core.mailbox.values import (
    StoredBody,
    StoredEntry,
    TrimState,
    decode_value,
    decode_vector,
)
from qim.schemas.events import EventType
from qim.schemas.frames.mailbox import SyncEntry
from qim.schemas.frames.reactions import MessageReactions
from qim.schemas.seqs import MAX_COUNTER, MAX_EPOCH

__all__ = ["StoreMailboxReader", "join_bodies", "sync_entry"]

_MAX_SEQ = (MAX_EPOCH << 48) | MAX_COUNTER


def sync_entry(key: keys.EntryKey, stored: StoredEntry) -> SyncEntry:
    """The A.4.1 wire shape of a stored entry; inline bodies come along, others are joined."""
    return SyncEntry(
        mailbox_seq=key.mailbox_seq,
        event_ordinal=key.event_ordinal,
        event_id=key.event_id,
        event_type=stored.event_type,
        message_id=stored.message_id,
        conversation_id=stored.conversation_id,
        conversation_seq=stored.conversation_seq,
        last_activity_id=stored.last_activity_id,
        sender_id=stored.sender_id,
        visibility_floor_conversation_seq=stored.visibility_floor_conversation_seq,
        flags=stored.flags,
        mention_type=stored.mention_type,
        created_at=stored.created_at,
        client_message_id=stored.client_message_id,
        origin_device_id=stored.origin_device_id,
        target_message_id=stored.target_message_id,
        target_conversation_seq=stored.target_conversation_seq,
        target_sender_id=stored.target_sender_id,
        target_flags=stored.target_flags,
        target_mention_type=stored.target_mention_type,
        body_included=stored.inline,
        message_type=stored.inline_message_type if stored.inline else None,
        custom_type=(stored.inline_custom_type or None) if stored.inline else None,
        schema_version=stored.inline_schema_version if stored.inline else None,
        payload_or_ciphertext=stored.inline_payload if stored.inline else None,
    )


class StoreMailboxReader:
    """:class:`~qim.core.mailbox.ports.MailboxReader` over one shard's committed store."""

    def __init__(self, store: KVReader, lane_count: int) -> None:
        self._store = store
        self._lane_count = lane_count

    def read_user_range(
        self, tenant_id: str, user_id: str, after_seq: int, up_to_seq: int
    ) -> Iterator[EventGroup]:
        if after_seq >= up_to_seq:
            return
        prefix = keys.user_entry_prefix(tenant_id, user_id)
        start = prefix + keys.u64(min(after_seq + 1, _MAX_SEQ))
        seq = -1
        group: list[SyncEntry] = []
        for key, value in self._store.scan(prefix, start, False):
            parsed = keys.parse_entry_key(key)
            if parsed.mailbox_seq > up_to_seq:
                break
            if group and parsed.mailbox_seq != seq:
                yield seq, group
                group = []
            seq = parsed.mailbox_seq
            group.append(sync_entry(parsed, decode_value(value, StoredEntry)))
        if group:
            yield seq, group

    def lane_watermark(self, lane: int) -> int:
        if not 0 <= lane < self._lane_count:
            raise ValueError(f"lane {lane} out of range")
        return self.watermarks()[lane]

    def watermarks(self) -> tuple[int, ...]:
        """The whole ``W[]`` vector (one key read)."""
        return decode_vector(self._store.get(keys.WATERMARKS), self._lane_count)

    def watermark_floor(self) -> tuple[int, ...]:
        """``W_floor[]``, the value to publish for the next owner (10.4.2 (2))."""
        return decode_vector(self._store.get(keys.FLOOR), self._lane_count)

    def effective_trim(self, tenant_id: str, user_id: str) -> int:
        raw = self._store.get(keys.trim_key(tenant_id, user_id))
        return 0 if raw is None else decode_value(raw, TrimState).effective

    def body(self, tenant_id: str, message_id: bytes) -> StoredBody | None:
        raw = self._store.get(keys.body_key(tenant_id, message_id))
        return None if raw is None else decode_value(raw, StoredBody)

    def facts(
        self, tenant_id: str, conversation_id: str, conversation_seq: int, message_id: bytes
    ) -> StoredFacts | None:
        raw = self._store.get(facts_key(tenant_id, conversation_id, conversation_seq, message_id))
        return None if raw is None else decode_facts(raw)


def join_bodies(
    reader: MailboxReader, tenant_id: str, entries: Sequence[SyncEntry]
) -> list[SyncEntry]:
    """Entries with their bodies and reaction aggregates joined, each ``message_id`` looked up
    once (18.3.1 step 2-5).

    A MESSAGE entry reads its facts row (recalled? reactions?) and, when not inline, the body
    copy; other inline entries are left alone. An entry whose body is gone (past retention)
    keeps ``body_included=false`` and the client fetches it with PULL_HISTORY (A.4.1).
    """
    bodies: dict[bytes, StoredBody | None] = {}
    facts: dict[bytes, StoredFacts | None] = {}
    out: list[SyncEntry] = []
    for entry in entries:
        reactions = None
        if entry.event_type == EventType.MESSAGE:
            if entry.message_id not in facts:
                facts[entry.message_id] = reader.facts(
                    tenant_id, entry.conversation_id, entry.conversation_seq, entry.message_id
                )
            row = facts[entry.message_id]
            if row is not None and row.removed_mailbox_seq != 0:
                out.append(_without_body(entry))
                continue
            reactions = None if row is None else _reactions(row)
        if reactions is not None:
            entry = msgspec.structs.replace(entry, reactions=reactions)
        if entry.body_included:  # inline: its body stays as written
            out.append(entry)
            continue
        if entry.message_id not in bodies:
            bodies[entry.message_id] = reader.body(tenant_id, entry.message_id)
        body = bodies[entry.message_id]
        if body is None:
            out.append(entry)
            continue
        out.append(
            msgspec.structs.replace(
                entry,
                body_included=True,
                message_type=body.message_type,
                custom_type=body.custom_type or None,
                schema_version=body.schema_version,
                payload_or_ciphertext=body.payload,
            )
        )
    return out


def _reactions(row: StoredFacts) -> MessageReactions | None:
    """The row's aggregate as the frame carries it; None when nobody has reacted (the row
    never saw a ``ReactionSummary``). ``self_reaction_keys`` stay empty: the shard keeps no
    per-user detail (PULL_HISTORY fills them)."""
    if row.summary_version == 0:
        return None
    return MessageReactions(counts=dict(row.reaction_counts), summary_version=row.summary_version)


def _without_body(entry: SyncEntry) -> SyncEntry:
    """A recalled / deleted message's entry: the reference only (``body_included=false``)."""
    return msgspec.structs.replace(
        entry,
        body_included=False,
        message_type=None,
        custom_type=None,
        schema_version=None,
        payload_or_ciphertext=None,
        media_metadata=None,
    )
