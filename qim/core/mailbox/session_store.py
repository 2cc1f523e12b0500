"""The session list's keyspaces in the MailboxShard store, and their readers and writers.

Grammar (as ``keys.py``)::

    U tenant 00 user 00 conversation_id                   -> UserConversationState (7.5)
      authoritative, changed only by ``UserStateCommand`` records; never trimmed.
    J tenant 00 user                                      -> ProjectionHeader: the 7.7 badge
      and the fold's position (``applied_through``).
    K tenant 00 user 00 conversation_id                   -> SessionRow (7.6), JSON (u128 ids)
      one row per conversation, so a message rewrites one row, not the user's whole list.
      ``J`` + ``K`` are the projection: droppable, rebuilt by ``sessions.rebuild_user`` from the
      retained entries plus ``U``.
    R tenant 00 conversation_id 00 conversation_seq:u64 message_id:16  -> StoredFacts
      what the bounded recount (12.5.2) and the preview need of one message, once per shard,
      expiring with the body. The log-consistent :class:`ShardMessageSource` reads it. A
      recall / edit / delete rewrites its target's row (``amend``): removed as of its
      mailbox_seq, preview replaced.

Why JSON for ``K``: a row's ``last_activity_id`` / ``last_message_id`` are u128 ints, which
msgpack cannot carry. Reads here are log-consistent (:class:`ShardMessageSource`: a fact is
visible only as of the mailbox record being folded, 12.5.2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from qim.core.keys.envelope import is_sealed
from qim.core.mailbox.carry import carried_entries
from qim.core.mailbox.keys import u64, user_entry_prefix
from qim.core.mailbox.kvstore import Overlay
from qim.core.mailbox.ports import KVReader
from qim.core.mailbox.values import StoredEntry, decode_value
from qim.core.session_list import (
    MessageFacts,
    UserConversationState,
    UserProjection,
)
from qim.core.session_list.rows import InputKey, SessionRow, UserBadgeState
from qim.schemas.frames.base import MENTION_ALL, U32, U64, EntryFlags, EventType, MentionType
from qim.schemas.hashing import validate_identifier
from qim.schemas.records.dispatch import GroupDispatch

__all__ = [
    "CONV_STATE",
    "FACTS",
    "PREVIEW_BYTES",
    "PROJECTION",
    "REMOVING",
    "ROW",
    "ProjectionHeader",
    "ShardMessageSource",
    "StoredFacts",
    "amended_facts",
    "decode_facts",
    "decode_state",
    "encode_facts",
    "encode_state",
    "facts_key",
    "facts_of",
    "facts_prefix",
    "is_e2ee_message",
    "load_header",
    "load_projection",
    "load_row",
    "load_state",
    "load_states",
    "preview_of",
    "projection_key",
    "row_key",
    "row_prefix",
    "shown_preview",
    "state_key",
    "state_prefix",
    "store_projection",
]

CONV_STATE: Final = b"U"
PROJECTION: Final = b"J"
ROW: Final = b"K"
FACTS: Final = b"R"
PREVIEW_BYTES: Final = 256


def _t(value: str, name: str) -> bytes:
    validate_identifier(value, name)
    return value.encode("utf-8")


def projection_key(tenant_id: str, user_id: str) -> bytes:
    return PROJECTION + _t(tenant_id, "tenant_id") + b"\x00" + _t(user_id, "user_id")


def row_prefix(tenant_id: str, user_id: str) -> bytes:
    return ROW + _t(tenant_id, "tenant_id") + b"\x00" + _t(user_id, "user_id") + b"\x00"


def row_key(tenant_id: str, user_id: str, conversation_id: str) -> bytes:
    return row_prefix(tenant_id, user_id) + _t(conversation_id, "conversation_id")


def state_prefix(tenant_id: str, user_id: str) -> bytes:
    return CONV_STATE + _t(tenant_id, "tenant_id") + b"\x00" + _t(user_id, "user_id") + b"\x00"


def state_key(tenant_id: str, user_id: str, conversation_id: str) -> bytes:
    return state_prefix(tenant_id, user_id) + _t(conversation_id, "conversation_id")


def facts_prefix(tenant_id: str, conversation_id: str) -> bytes:
    return FACTS + _t(tenant_id, "tenant_id") + b"\x00" + _t(conversation_id, "conv") + b"\x00"


def facts_key(
    tenant_id: str, conversation_id: str, conversation_seq: int, message_id: bytes
) -> bytes:
    """``message_id`` last: one seq is one message, but a key of its own per message keeps
    each row's expiry its own even if a log reused a seq."""
    return facts_prefix(tenant_id, conversation_id) + u64(conversation_seq) + message_id


class StoredFacts(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True, kw_only=True):
    """One message as the recount and the preview see it; ``mailbox_seq`` is when it arrived
    (the "as of" filter of :class:`ShardMessageSource`).

    ``removed_mailbox_seq`` (0 = never): the mailbox_seq of the recall / delete that removed
    it, so a recount as of an earlier record still counts it (log-consistent replay, 12.5.5).
    ``amended_mailbox_seq``: the last recall / edit / delete applied (``preview`` is then the
    amended one); a re-applied dispatch of the message keeps such a row (``keep_facts``).
    ``expire_at``: when retention removes the row (the time of its expiry index key).
    ``reaction_counts`` / ``summary_version``: the message's MessageReactionSummary as of the
    newest ``ReactionSummary`` of the shard's log (13.6, 18.3.1: PULL_MAILBOX joins it onto the
    message's entries), keys sorted so the bytes never follow arrival order; a recall / delete
    empties the counts (13.6.4) and keeps the version, so no older summary brings them back.
    Fields are append-only, like ``values.py``'s rows."""

    mailbox_seq: U64
    sender_id: str
    counts_unread: bool = False
    mention_targets: tuple[str, ...] = ()
    reply_to_sender_id: str = ""
    preview: bytes = b""
    removed_mailbox_seq: U64 = 0
    amended_mailbox_seq: U64 = 0
    expire_at: U64 = 0
    reaction_counts: dict[str, U32] = msgspec.field(default_factory=dict)
    summary_version: U64 = 0
    e2ee: bool = False
    """The message is end-to-end encrypted (its dispatch's ``e2ee``): push sends the 16.7
    placeholder only."""

    def expired_by(self, log_now_ms: int) -> bool:
        """Retention ended by this log time (0: a row from before the field, never): the row
        counts as gone whether or not a sweep removed it yet, so a fold never depends on
        when sweeps ran (18.3; the dedup row's ``expire_at`` works the same way)."""
        return 0 < self.expire_at <= log_now_ms

    def removed_as_of(self, as_of_mailbox_seq: int) -> bool:
        return 0 < self.removed_mailbox_seq <= as_of_mailbox_seq

    def mention_type(self, user_id: str) -> int:
        """11.4.1 precedence, as ``qim.core.fanout.recipients.mention_type_of``."""
        if user_id in self.mention_targets:
            return int(MentionType.AT_ME)
        if MENTION_ALL in self.mention_targets:
            return int(MentionType.AT_ALL)
        if self.reply_to_sender_id and self.reply_to_sender_id == user_id:
            return int(MentionType.REPLY_ME)
        return int(MentionType.NONE)


class ProjectionHeader(msgspec.Struct, frozen=True, kw_only=True):
    """The per-user part of the projection: badge and position (one version source)."""

    badge: UserBadgeState = UserBadgeState()
    applied_through: InputKey = (0, 0, 0)


_ENC: Final = msgspec.msgpack.Encoder()
_FACTS: Final = msgspec.msgpack.Decoder(StoredFacts)
_STATE: Final = msgspec.msgpack.Decoder(UserConversationState)
_HEADER: Final = msgspec.msgpack.Decoder(ProjectionHeader)
_ROW_ENC: Final = msgspec.json.Encoder()
_ROW: Final = msgspec.json.Decoder(SessionRow)


def facts_of(d: GroupDispatch, mailbox_seq: int, expire_at: int = 0) -> StoredFacts:
    template = d.event_template
    return StoredFacts(
        mailbox_seq=mailbox_seq,
        expire_at=expire_at,
        sender_id=d.sender_id,
        counts_unread=template.counts_unread,
        mention_targets=tuple(template.mention_targets),
        reply_to_sender_id=template.reply_to_sender_id,
        # a custom type's preview is its writer-fixed placeholder (spec 13.3 preview_template),
        # never a slice of a business payload the server does not parse
        # and never a slice of ciphertext: a sealed body's preview is sealed by the writer
        preview=d.preview_or_placeholder or _payload_preview(d.payload),
        e2ee=d.e2ee,
    )


def _payload_preview(payload: bytes) -> bytes:
    """A plaintext body's first ``PREVIEW_BYTES``; nothing for a sealed one (its preview came
    sealed in ``preview_or_placeholder``, topology.md decision 44)."""
    return b"" if is_sealed(payload) else payload[:PREVIEW_BYTES]


def _preview_slice(preview: bytes) -> bytes:
    """A preview as kept: a sealed one whole (a slice would not open), others capped."""
    return preview if is_sealed(preview) else preview[:PREVIEW_BYTES]


def encode_facts(facts: StoredFacts) -> bytes:
    return _ENC.encode(facts)


def decode_facts(data: bytes) -> StoredFacts:
    return _FACTS.decode(data)


REMOVING: Final = frozenset({"recall", "delete"})
"""The ``amend_action``s that remove their target (``removes_target``, 12.5.1 ``¬recalled``)."""


def amended_facts(facts: StoredFacts, d: GroupDispatch, mailbox_seq: int) -> StoredFacts:
    """The target's row after the amend ``d`` at ``mailbox_seq`` (13.4.1 step 4 on this shard):
    a recall / delete removes it as of ``mailbox_seq`` (the first removal wins) and shows the
    placeholder; an edit shows the new text unless the message is already removed."""
    preview = _preview_slice(d.preview_or_placeholder)
    if d.amend_action in REMOVING:
        removed = facts.removed_mailbox_seq or mailbox_seq
        return msgspec.structs.replace(
            facts,
            removed_mailbox_seq=removed,
            preview=preview,
            amended_mailbox_seq=mailbox_seq,
            reaction_counts={},  # 13.6.4: the aggregate goes with the message
        )
    if facts.removed_mailbox_seq:
        return facts
    return msgspec.structs.replace(facts, preview=preview, amended_mailbox_seq=mailbox_seq)


def encode_state(state: UserConversationState) -> bytes:
    return _ENC.encode(state)


def decode_state(data: bytes) -> UserConversationState:
    return _STATE.decode(data)


@dataclass(frozen=True, slots=True)
class ShardMessageSource:
    """``MessageSource`` over the shard's ``R`` rows for one user (12.5.2): log-consistent
    because a row is visible only when it arrived at or before ``as_of_mailbox_seq``.

    A message whose retention ended by ``log_now_ms`` (the fold's log time) still counts
    (12.5.1 counts the conversation's messages, not the mailbox's), read from the user's own
    entry instead: the retained one at the row's ``mailbox_seq`` while the sweep has not run,
    the carried one (``carry``) after it trimmed the entry and removed the row. Either way the
    answer is the same whether or not a sweep ran, so a fold never depends on when sweeps ran
    (18.3; the dedup row's ``expire_at`` works the same way), and it is what a rebuild from the
    retained and carried entries counts (issue 14)."""

    kv: KVReader
    tenant_id: str
    user_id: str
    log_now_ms: int = 0

    def read_range(
        self,
        conversation_id: str,
        after_seq: int,
        upto_seq: int,
        limit: int,
        as_of_mailbox_seq: int,
    ) -> Sequence[MessageFacts]:
        prefix = facts_prefix(self.tenant_id, conversation_id)
        at = len(prefix)
        found: dict[int, MessageFacts] = {}
        for key, value in self.kv.scan(prefix, prefix + u64(after_seq + 1), False):
            seq = int.from_bytes(key[at : at + 8], "big")
            if seq > upto_seq or len(found) >= limit:
                break
            facts = _FACTS.decode(value)
            if facts.mailbox_seq > as_of_mailbox_seq:
                continue
            removed = facts.removed_as_of(as_of_mailbox_seq)
            if not facts.expired_by(self.log_now_ms):
                found[seq] = MessageFacts(
                    conversation_seq=seq,
                    sender_id=facts.sender_id,
                    counts_unread=facts.counts_unread,
                    mention_type=facts.mention_type(self.user_id),
                    removed=removed,
                )
                continue
            entry = self._retained(facts.mailbox_seq, conversation_id, seq)
            if entry is not None:
                found[seq] = _entry_facts(entry, removed)
        for carried in self._carried(conversation_id, after_seq, upto_seq, as_of_mailbox_seq):
            found.setdefault(carried.conversation_seq, carried)
        return [found[seq] for seq in sorted(found)[:limit]]

    def _retained(self, mailbox_seq: int, conversation_id: str, seq: int) -> StoredEntry | None:
        """The user's own entry for the message at ``mailbox_seq``, if the mailbox still has it."""
        at = user_entry_prefix(self.tenant_id, self.user_id) + u64(mailbox_seq)
        for _, value in self.kv.scan(at, at, False):
            entry = decode_value(value, StoredEntry)
            if (
                entry.conversation_id == conversation_id
                and entry.conversation_seq == seq
                and not _bare_mention(entry)
            ):
                return entry
        return None

    def _carried(
        self, conversation_id: str, after_seq: int, upto_seq: int, as_of: int
    ) -> list[MessageFacts]:
        """The user's carried messages of the conversation in ``(after, upto]``; removed when
        a carried recall / delete of them is at or before ``as_of``."""
        rows = carried_entries(self.kv, self.tenant_id, self.user_id, conversation_id)
        removed = {
            e.target_conversation_seq
            for key, e in rows
            if e.amend_action in REMOVING and key.mailbox_seq <= as_of
        }
        return [
            _entry_facts(e, e.conversation_seq in removed)
            for key, e in rows
            if after_seq < e.conversation_seq <= upto_seq
            and key.mailbox_seq <= as_of
            and e.event_type != EventType.CONTROL
            and not _bare_mention(e)
        ]


def _bare_mention(entry: StoredEntry) -> bool:
    """A MENTION entry beside its primary (no flags); a flagged one is a silent member's only
    entry in the ``mention_only`` tier and stands for the message (10.2.3)."""
    return entry.event_type == EventType.MENTION and not entry.flags


def _entry_facts(entry: StoredEntry, removed: bool) -> MessageFacts:
    """A message as the user's own entry shows it (its ``mention_type`` is the user's)."""
    return MessageFacts(
        conversation_seq=entry.conversation_seq,
        sender_id=entry.sender_id,
        counts_unread=bool(entry.flags & EntryFlags.COUNTS_UNREAD),
        mention_type=entry.mention_type,
        removed=removed,
    )


def preview_of(kv: KVReader, tenant_id: str, conversation_id: str, seq: int) -> bytes:
    """The payload copy of the message at ``seq`` (empty once it expired)."""
    if not seq:
        return b""
    at = facts_prefix(tenant_id, conversation_id) + u64(seq)
    for _, value in kv.scan(at, at, False):
        return _FACTS.decode(value).preview
    return b""


def is_e2ee_message(kv: KVReader, tenant_id: str, conversation_id: str, seq: int) -> bool:
    """The message at ``seq`` is end-to-end encrypted (its facts' flag; False once expired)."""
    at = facts_prefix(tenant_id, conversation_id) + u64(seq)
    for _, value in kv.scan(at, at, False):
        return _FACTS.decode(value).e2ee
    return False


def shown_preview(
    kv: KVReader, tenant_id: str, conversation_id: str, latest: int, state: UserConversationState
) -> bytes:
    """The preview a list row shows: clear history (12.9, AT-42) hides everything up to
    ``hidden_before``, so a latest message at or below it shows the empty placeholder until
    the next message. SESSION_LIST_BATCH and SESSION_DELTA both read it (INV-22)."""
    if latest <= state.hidden_before_conversation_seq:
        return b""
    return preview_of(kv, tenant_id, conversation_id, latest)


def load_states(kv: KVReader, tenant_id: str, user_id: str) -> dict[str, UserConversationState]:
    prefix = state_prefix(tenant_id, user_id)
    out = {}
    for _, value in kv.scan(prefix, prefix, False):
        state = decode_state(value)
        out[state.conversation_id] = state
    return out


def load_header(kv: KVReader, tenant_id: str, user_id: str) -> ProjectionHeader:
    raw = kv.get(projection_key(tenant_id, user_id))
    return ProjectionHeader() if raw is None else _HEADER.decode(raw)


def load_row(kv: KVReader, tenant_id: str, user_id: str, conversation_id: str) -> SessionRow | None:
    raw = kv.get(row_key(tenant_id, user_id, conversation_id))
    return None if raw is None else _ROW.decode(raw)


def load_state(
    kv: KVReader, tenant_id: str, user_id: str, conversation_id: str
) -> UserConversationState:
    raw = kv.get(state_key(tenant_id, user_id, conversation_id))
    return (
        UserConversationState(conversation_id=conversation_id)
        if raw is None
        else (decode_state(raw))
    )


def load_projection(kv: KVReader, tenant_id: str, user_id: str) -> UserProjection:
    """The whole stored projection (every row, the 7.5 states, badge and position); empty
    rows over the states when it was dropped."""
    header = load_header(kv, tenant_id, user_id)
    prefix = row_prefix(tenant_id, user_id)
    rows = {}
    for _, value in kv.scan(prefix, prefix, False):
        row = _ROW.decode(value)
        rows[row.conversation_id] = row
    return UserProjection(
        user_id=user_id,
        rows=rows,
        states=load_states(kv, tenant_id, user_id),
        badge=header.badge,
        applied_through=header.applied_through,
    )


def store_projection(
    kv: Overlay, tenant_id: str, p: UserProjection, before: UserProjection | None = None
) -> None:
    """Write ``p``'s header and every row that differs from ``before``, and delete the rows
    ``p`` no longer has (the states are ``U``, written where they change)."""
    header = ProjectionHeader(badge=p.badge, applied_through=p.applied_through)
    if before is None or (before.badge, before.applied_through) != (
        p.badge,
        p.applied_through,
    ):
        kv.put(projection_key(tenant_id, p.user_id), _ENC.encode(header))
    for conv in sorted(p.rows):
        row = p.rows[conv]
        if before is None or before.rows.get(conv) != row:
            kv.put(row_key(tenant_id, p.user_id, conv), _ROW_ENC.encode(row))
    if before is not None:
        for conv in sorted(set(before.rows) - set(p.rows)):  # a delete removed the row
            kv.delete(row_key(tenant_id, p.user_id, conv))
