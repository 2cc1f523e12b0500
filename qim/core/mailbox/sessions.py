"""The session list folded inside ``materialize`` (direction.md 4.2: "entries, ...,
projections and badges of one batch in one WriteBatch"): :class:`SessionFolds` runs the pure
session core (``qim.core.session_list``) over the same Overlay as the entries, record by
record in log order, loading only the rows of the conversations a batch touches and writing
back only what changed (keyspaces: ``session_store``).

Deviations, written down: (1) the fold runs inline at each record's mailbox_seq, not behind
``W[lane]`` (INV-19): a group dispatch that waited for its slice is folded when it resolves,
below the user's ``applied_through``, by lifting the skip for that one input. (2) The preview is
the shard's copy of the latest message's payload (first :data:`PREVIEW_BYTES`), not the
conversation's ``ConversationHead``, which lives on the conversation side; a recall / edit /
delete rewrites that copy (``amend``), so the preview follows it.

Two kinds of CONTROL entry reach a user's mailbox and they fold differently (:func:`entry_in`):
an amend (recall / edit / delete: ``target_conversation_seq`` set) is an :class:`EntryIn` --
``removes_target`` for a recall / delete, so the pure fold decrements unread once from
``target_*`` only (12.5.5, INV-17) and re-emits the row only when the target is the previewed
``latest`` (12.4.2; it never advances latest / last_activity_id, INV-05); a user-state CONTROL
entry (12.9) is folded as the :class:`StateIn` of its 7.5 row when its command is applied, so
the pure fold ignores it as an entry (and :func:`rebuild_user` folds the 7.5 rows first).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from qim.core.mailbox.carry import carried_entries
from qim.core.mailbox.expand import EntryRow
from qim.core.mailbox.keys import META, EntryKey, parse_entry_key, user_entry_prefix
from qim.core.mailbox.kvstore import Overlay
from qim.core.mailbox.ports import KVReader, Op
from qim.core.mailbox.reader import sync_entry
from qim.core.mailbox.session_store import (
    REMOVING,
    ShardMessageSource,
    decode_facts,
    decode_state,
    encode_facts,
    encode_state,
    facts_key,
    facts_of,
    load_header,
    load_projection,
    load_row,
    load_state,
    load_states,
    preview_of,
    projection_key,
    row_prefix,
    state_key,
    store_projection,
)
from qim.core.mailbox.values import ShardMeta, StoredEntry, decode_value
from qim.core.session_list import (
    EntryIn,
    SessionListConfig,
    StateIn,
    UserConversationState,
    UserProjection,
    fold,
    listed,
)
from qim.core.session_list.rows import InputKey
from qim.schemas.records.dispatch import GroupDispatch

__all__ = [
    "SessionChange",
    "SessionFolds",
    "decode_state",
    "drop_ops",
    "encode_state",
    "entry_in",
    "load_projection",
    "preview_of",
    "projection_key",
    "rebuild_ops",
    "rebuild_user",
    "state_key",
]

_NONE_KEY: Final[InputKey] = (0, 0, 0)


@dataclass(frozen=True, slots=True)
class SessionChange:
    """What one batch changed for one user: rows (and their driving keys), badge, structure.
    The shell builds SESSION_DELTA / BADGE_UPDATE / READ_SYNC from it after the WriteBatch."""

    tenant_id: str
    user_id: str
    touched: tuple[tuple[str, InputKey], ...]
    badge_changed: bool
    structural_change: bool
    read_advanced: tuple[tuple[str, int, str], ...] = ()
    """``(conversation_id, read_conversation_seq, origin_device_id)`` of MARK_READs."""
    listed_delta: int = 0
    """How many more rows the list shows after the batch than before (``quota``: the
    ``max_conversations_per_user`` count moves only when this is not zero)."""


class SessionFolds:
    """The per-batch working set: projections decoded once, written once at :meth:`finish`."""

    def __init__(self, kv: Overlay, config: SessionListConfig) -> None:
        self.kv, self.config = kv, config
        self.projections: dict[tuple[str, str], UserProjection] = {}
        """Partial: only the conversations this batch touched are loaded (rows and states)."""
        self.before: dict[tuple[str, str], UserProjection] = {}
        """The stored values of what was loaded (for writing only what changed)."""
        self.touched: dict[tuple[str, str], dict[str, InputKey]] = {}
        self.badge: set[tuple[str, str]] = set()
        self.structural: set[tuple[str, str]] = set()
        self.reads: dict[tuple[str, str], list[tuple[str, int, str]]] = {}
        self.log_now_ms = 0
        """The log time of the record being folded (set by ``materialize``): recounts skip
        facts whose retention ended by then (``StoredFacts.expired_by``)."""

    def projection(
        self, tenant_id: str, user_id: str, conversations: Iterable[str] = ()
    ) -> UserProjection:
        """The user's projection with (at least) ``conversations`` loaded."""
        key = (tenant_id, user_id)
        p = self.projections.get(key)
        if p is None:
            header = load_header(self.kv, tenant_id, user_id)
            p = UserProjection(
                user_id=user_id, badge=header.badge, applied_through=header.applied_through
            )
        if key not in self.projections:
            self.before[key] = p
        missing = sorted({c for c in conversations if c not in p.states})
        if missing:
            rows, states = dict(p.rows), dict(p.states)
            old_rows, old_states = dict(self.before[key].rows), dict(self.before[key].states)
            for conv in missing:
                states[conv] = old_states[conv] = load_state(self.kv, tenant_id, user_id, conv)
                row = load_row(self.kv, tenant_id, user_id, conv)
                if row is not None:
                    rows[conv] = old_rows[conv] = row
            p = msgspec.structs.replace(p, rows=rows, states=states)
            self.before[key] = msgspec.structs.replace(
                self.before[key], rows=old_rows, states=old_states
            )
        self.projections[key] = p
        return p

    def _fold(self, tenant_id: str, user_id: str, inputs: Sequence[EntryIn | StateIn]) -> None:
        key = (tenant_id, user_id)
        convs = [_conversation(i) for i in inputs]
        p = self.projection(tenant_id, user_id, convs)
        applied = p.applied_through
        late = bool(inputs) and inputs[0].key <= applied
        if late:  # a dispatch resolved below the position (see the module doc, deviation 1)
            p = msgspec.structs.replace(p, applied_through=_NONE_KEY)
        source = ShardMessageSource(self.kv, tenant_id, user_id, self.log_now_ms)
        result = fold(p, inputs, source, self.config)
        out = result.projection
        if late and out.applied_through < applied:
            out = msgspec.structs.replace(out, applied_through=applied)
        self.projections[key] = out
        if result.touched:
            self.touched.setdefault(key, {}).update(result.touched)
        if result.badge_changed:
            self.badge.add(key)
        if result.structural_change:
            self.structural.add(key)

    def facts(self, d: GroupDispatch, mailbox_seq: int, expire_at: int) -> bytes:
        """Keep the message's facts (once per shard, like the body: a re-applied dispatch
        writes them again, whether or not a sweep removed them meanwhile, so any sweep
        schedule gives the same store); returns the key for the expiry index. The reaction
        aggregate of a live row is kept: it came from the log after the first copy, and no
        redelivery makes it older (an expired row's is dropped, as a sweep would have)."""
        key = facts_key(d.tenant_id, d.conversation_id, d.conversation_seq, d.message_id)
        row = facts_of(d, mailbox_seq, expire_at)
        raw = self.kv.get(key)
        if raw is not None:
            kept = decode_facts(raw)
            if kept.summary_version and not kept.expired_by(self.log_now_ms):
                row = msgspec.structs.replace(
                    row, reaction_counts=kept.reaction_counts, summary_version=kept.summary_version
                )
        self.kv.put(key, encode_facts(row))
        return key

    def entries(
        self, tenant_id: str, user_id: str, mailbox_seq: int, rows: Sequence[EntryRow]
    ) -> None:
        inputs = [
            entry_in(EntryKey(mailbox_seq, r.event_ordinal, r.event_id), r.entry) for r in rows
        ]
        self._fold(tenant_id, user_id, inputs)

    def state(
        self,
        tenant_id: str,
        user_id: str,
        mailbox_seq: int,
        event_id: int,
        new: UserConversationState,
        *,
        read_origin: str | None = None,
    ) -> None:
        """Store the authoritative row and fold it at its log position (``StateIn``).

        The conversation is loaded *before* the new row is put: loaded after, the fold's "old"
        state would already be the new one, so a removal first touching the group in this
        batch would keep its badge share, and a replay cut differently would not (issue 14)."""
        self.projection(tenant_id, user_id, [new.conversation_id])
        self.kv.put(state_key(tenant_id, user_id, new.conversation_id), encode_state(new))
        self._fold(tenant_id, user_id, [StateIn(mailbox_seq, event_id, new)])
        if read_origin is not None:
            entry = (new.conversation_id, new.read_conversation_seq, read_origin)
            self.reads.setdefault((tenant_id, user_id), []).append(entry)

    def finish(self) -> tuple[SessionChange, ...]:
        """Put every changed projection into the overlay; the batch's changes, sorted."""
        out = []
        for key in sorted(self.projections):
            store_projection(self.kv, key[0], self.projections[key], self.before[key])
            touched = self.touched.get(key, {})
            delta = _listed(self.projections[key]) - _listed(self.before[key])
            if touched or delta or key in self.badge or key in self.structural or key in self.reads:
                out.append(
                    SessionChange(
                        tenant_id=key[0],
                        user_id=key[1],
                        touched=tuple(sorted(touched.items())),
                        badge_changed=key in self.badge,
                        structural_change=key in self.structural,
                        read_advanced=tuple(self.reads.get(key, ())),
                        listed_delta=delta,
                    )
                )
        return tuple(out)


def rebuild_user(
    kv: KVReader, tenant_id: str, user_id: str, config: SessionListConfig, lane_count: int
) -> UserProjection:
    """Drop-and-rebuild (INV-01): the user's 7.5 states first, then every retained entry and
    every entry trimming carried (``carry``: what the fold needs of the trimmed ones, 12.1) in
    mailbox order. Equal list to the incremental fold (same visibility, base and counts).
    The stored rows are read (not the A.4.1 shape), for the ``amend_action`` of an amend."""
    del lane_count  # kept for the callers; the entries are scanned directly
    p = UserProjection(user_id=user_id, states=load_states(kv, tenant_id, user_id))
    prefix = user_entry_prefix(tenant_id, user_id)
    rows = dict(carried_entries(kv, tenant_id, user_id))
    rows.update(
        (parse_entry_key(key), decode_value(value, StoredEntry))
        for key, value in kv.scan(prefix, prefix, False)
    )
    inputs = [entry_in(key, rows[key]) for key in sorted(rows)]
    meta = kv.get(META)
    log_now = 0 if meta is None else decode_value(meta, ShardMeta).log_now_ms
    source = ShardMessageSource(kv, tenant_id, user_id, log_now)
    return fold(p, inputs, source, config).projection


def entry_in(key: EntryKey, stored: StoredEntry) -> EntryIn:
    """The fold input of one stored entry; an amend removing its target says so (module doc).
    A user-state CONTROL entry has no ``target_*`` and the pure fold skips it as an entry."""
    removes = stored.target_conversation_seq is not None and stored.amend_action in REMOVING
    return EntryIn(sync_entry(key, stored), removes_target=removes)


def drop_ops(kv: KVReader, tenant_id: str, user_id: str) -> list[tuple[bytes, bytes | None]]:
    """The WriteBatch that drops the user's projection (header and rows; never ``U``)."""
    prefix = row_prefix(tenant_id, user_id)
    rows = [(key, None) for key, _ in kv.scan(prefix, prefix, False)]
    return [(projection_key(tenant_id, user_id), None), *rows]


def _listed(p: UserProjection) -> int:
    """The loaded rows the session list shows (a partial projection: only what was loaded)."""
    return sum(listed(row, p.state(conv)) for conv, row in p.rows.items())


def _conversation(item: EntryIn | StateIn) -> str:
    return item.entry.conversation_id if isinstance(item, EntryIn) else item.state.conversation_id


def rebuild_ops(
    kv: KVReader, tenant_id: str, user_id: str, config: SessionListConfig, lane_count: int
) -> tuple[Op, ...]:
    """One WriteBatch that drops the user's projection and writes :func:`rebuild_user`'s
    (the offline repair of a projection; ``U`` and the entries are only read)."""
    overlay = Overlay(kv)
    for key, _ in drop_ops(kv, tenant_id, user_id):
        overlay.delete(key)
    rebuilt = rebuild_user(overlay, tenant_id, user_id, config, lane_count)
    store_projection(overlay, tenant_id, rebuilt)
    return overlay.ops()
