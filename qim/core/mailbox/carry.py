"""What a trimmed mailbox keeps for its session list (issue 14; spec 12.1 (3), 12.2, INV-01).

Why: the projection (``J`` / ``K``) is a fold of the user's entries, and trimming deletes
entries (the time window and the entry cap, ``retention``) while the list must stay correct
after the trim (12.1: "otherwise ordering, unread counts and membership all go wrong once
``mailbox_retention_days`` expires"). The live projection keeps what the trimmed entries
contributed; a rebuild (``sessions.rebuild_user``, ``qim replay projections``) that refolded
only the retained entries lost it -- a conversation whose messages had all expired vanished
from the rebuilt list with its unread (``badge (3, 0, 0) != (0, 0, 0)`` on the shared stack).

So trimming *carries* the trimmed entries the fold still needs, byte for byte, under
``Z tenant 00 user 00 conversation_id 00 <the entry key's 17-byte tail>``, in the trim's
WriteBatch; the rebuild folds carried and retained entries together, and the recount
(``session_store.ShardMessageSource``) reads a message whose retention ended from the user's
carried or retained entry, so a MARK_READ after the expiry counts what the rebuild counts.
Per conversation, of the entries the fold reads (MENTION entries without flags -- a flagged
one is a silent member's only entry in the ``mention_only`` tier and counts like a primary --
user-state CONTROL entries, and those at or below their own visibility floor, have no effect)
it keeps:

* the entry with the highest ``conversation_seq`` (latest position, ``last_message_id``) and
  the one with the highest ``last_activity_id`` among those that affect the order;
* the ``unread_precise_limit + 1`` highest entries that count unread for the user, and as many
  that mention the user: the fold caps unread there (``unread_exact=false``), so fewer above
  any base means all of them are kept;
* a recall / delete CONTROL entry whose target is kept (the decrement folds with its target).

Everything else cannot change a row and is dropped, so the carry stays bounded per
conversation. The selection is a function of the *set* of trimmed entries (maxima and top-k
over a union), so sweeping often or once leaves the same bytes (``qim replay mailbox``).

Known limits, written down: more than ``unread_precise_limit + 1`` trimmed mentions above the
base are counted as that many; a recount does not see a recall whose target's retention ended
unless the recall itself was carried (the decrement at the recall is exact either way); an
expired entry the sweep cannot trim yet (a later day's entry before it, or above ``W[lane]``)
whose shared row was already removed is not counted by a recount.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from qim.core.mailbox.keys import EntryKey, entry_tail, parse_entry_key
from qim.core.mailbox.kvstore import Overlay
from qim.core.mailbox.ports import KVReader
from qim.core.mailbox.values import StoredEntry, decode_value, encode_value
from qim.schemas.frames.base import EntryFlags, EventType, MentionType
from qim.schemas.hashing import validate_identifier

__all__ = ["CARRY", "carried_entries", "carry_prefix", "carry_trimmed", "select"]

CARRY: Final = b"Z"
_REMOVING: Final = frozenset({"recall", "delete"})


def carry_prefix(tenant_id: str, user_id: str) -> bytes:
    validate_identifier(tenant_id, "tenant_id")
    validate_identifier(user_id, "user_id")
    return CARRY + tenant_id.encode() + b"\x00" + user_id.encode() + b"\x00"


Row = tuple[EntryKey, StoredEntry]


def _read(entry: StoredEntry) -> bool:
    """Whether the session fold reads this entry at all (``projection._Fold.entry``)."""
    if entry.event_type == EventType.MENTION and not entry.flags:
        return False  # a flagged MENTION entry stands alone (mention_only tier, 10.2.3)
    if entry.conversation_seq <= entry.visibility_floor_conversation_seq:
        return False
    if entry.event_type == EventType.CONTROL:
        return entry.target_conversation_seq is not None
    return True


def select(rows: Iterable[Row], user_id: str, limit: int) -> list[Row]:
    """The rows the fold still needs (module doc), in key order."""
    by_conv: dict[str, list[Row]] = {}
    for row in rows:
        if _read(row[1]):
            by_conv.setdefault(row[1].conversation_id, []).append(row)
    kept: list[Row] = []
    for conv in sorted(by_conv):
        rows_of = by_conv[conv]
        own = [r for r in rows_of if r[1].event_type != EventType.CONTROL]
        keep: dict[EntryKey, StoredEntry] = {}
        if own:
            latest = max(own, key=lambda r: (r[1].conversation_seq, r[0]))
            keep[latest[0]] = latest[1]
            ordered = [r for r in own if r[1].flags & EntryFlags.AFFECTS_SESSION_ORDER]
            if ordered:
                top = max(ordered, key=lambda r: (r[1].last_activity_id, r[0]))
                keep[top[0]] = top[1]
        others = [r for r in own if r[1].sender_id != user_id]
        counting = [r for r in others if r[1].flags & EntryFlags.COUNTS_UNREAD]
        mentioning = [r for r in others if r[1].mention_type != MentionType.NONE]
        for group in (counting, mentioning):
            for key, entry in sorted(group, key=lambda r: (r[1].conversation_seq, r[0]))[
                -(limit + 1) :
            ]:
                keep[key] = entry
        targets = {e.conversation_seq for e in keep.values()}
        for key, entry in rows_of:
            if (
                entry.event_type == EventType.CONTROL
                and entry.amend_action in _REMOVING
                and entry.target_conversation_seq in targets
            ):
                keep[key] = entry
        kept += keep.items()
    return sorted(kept, key=lambda r: r[0])


def carried_entries(
    kv: KVReader, tenant_id: str, user_id: str, conversation_id: str | None = None
) -> list[Row]:
    """The user's carried entries (of one conversation, when given), in key order."""
    prefix = carry_prefix(tenant_id, user_id)
    if conversation_id is not None:
        prefix = _conversation_prefix(tenant_id, user_id, conversation_id)
    rows = [
        (parse_entry_key(key), decode_value(value, StoredEntry))
        for key, value in kv.scan(prefix, prefix, False)
    ]
    return sorted(rows, key=lambda r: r[0])


def carry_trimmed(
    kv: Overlay,
    tenant_id: str,
    user_id: str,
    trimmed: Sequence[tuple[bytes, StoredEntry]],
    limit: int,
) -> None:
    """Fold the just-trimmed entries (their ``E`` keys) into the user's carry, conversation by
    conversation (one batch); only the rows whose selection changed are written."""
    by_conv: dict[str, list[Row]] = {}
    for raw, trimmed_entry in trimmed:
        by_conv.setdefault(trimmed_entry.conversation_id, []).append(
            (parse_entry_key(raw), trimmed_entry)
        )
    for conv in sorted(by_conv):
        prefix = _conversation_prefix(tenant_id, user_id, conv)
        old = {parse_entry_key(raw): value for raw, value in kv.scan(prefix, prefix, False)}
        rows = [(k, decode_value(v, StoredEntry)) for k, v in old.items()] + by_conv[conv]
        kept = dict(select(rows, user_id, limit))
        for gone in sorted(old.keys() - kept.keys()):
            kv.delete(prefix + entry_tail(*gone))
        for key, entry in sorted(kept.items()):
            if key not in old:
                kv.put(prefix + entry_tail(*key), encode_value(entry))


def _conversation_prefix(tenant_id: str, user_id: str, conversation_id: str) -> bytes:
    validate_identifier(conversation_id, "conversation_id")
    return carry_prefix(tenant_id, user_id) + conversation_id.encode() + b"\x00"
