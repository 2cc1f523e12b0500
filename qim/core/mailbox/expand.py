"""The entries a dispatch writes on this shard: who (the shared rule) and what (this module).

Who receives what kind of entry is ONE pure function shared with the producer,
:func:`qim.core.fanout.recipients.expand_dispatch` -- explicit recipients (a direct
conversation's participants, a membership message's subjects) routed to this shard, plus, for a
group dispatch pinning a version, that version's slice members with ``joined_at <
conversation_seq`` and ``conversation_seq < left_at`` of that interval when a later slice told
this shard it closed (10.1 step 9; the leave event at ``left_at`` reaches the leaver only as its
own MEMBERSHIP notice); mentions per 11.4.1. The MailboxNode calls it here and the
fanout side sizes and tests its dispatches against it, so the two cannot drift.

What each entry holds is decided here, deterministically (spec 6.7, 7.3, I-5):

* ``event_ordinal`` = ``event_type``; ``event_id`` = the frozen BLAKE3 derivation over the
  dispatch's ``dispatch_id``; ``created_at`` = ``committed_at``;
* flags from the template; the sender's own entry never counts unread (6.9.1, 12.5.1) and is
  the only one with ``client_message_id``; a CONTROL event carries ``origin_device_id`` there
  so the originating device can skip its own echo (9.7);
* ``visibility_floor_conversation_seq`` = the member's ``joined_at`` (0 without a slice row);
* an ``anchor_target`` custom message (spec 13.3) carries the dispatch's
  ``target_conversation_seq`` on its MESSAGE entries, the row a client updates in place;
* a MENTION entry (only with ``mention_entries``) carries no flags and no body: unread, order
  and the body stay with the primary entry of the same event group; in the ``mention_only``
  tier a silent member's MENTION entry is its only one, so it carries the primary's unread and
  order flags (not TIMELINE_VISIBLE: the row comes from PULL_HISTORY, 10.2.3) and the session
  fold counts it in the primary's place;
* the body is inline only when the dispatch says so (ADR-0005: the writer decides);
* a recall / edit / delete (``amend_action``, 13.4.1 step 5) is a CONTROL entry for every
  recipient: ``expand_dispatch`` gives a group's slice members MESSAGE (its rule for ordinary
  messages), so the kind is the dispatch's CONTROL here, and no MENTION entry is written. Its
  ``target_*`` are the dispatch's, ``target_mention_type`` per recipient by the same 11.4.1
  function as a message's ``mention_type`` (``mention_type_of`` over the target's mentions),
  and the target sender's own copy drops COUNTS_UNREAD from ``target_flags`` (as on the
  target's own entry).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import msgspec

from qim.core.fanout.recipients import expand_dispatch, mention_type_of
from qim.core.mailbox.values import StoredEntry
from qim.core.membership.slices import Departures, ShardSlice
from qim.schemas.events import EventType, event_id
from qim.schemas.frames.base import EntryFlags
from qim.schemas.records.dispatch import EventTemplate, GroupDispatch

__all__ = ["EntryRow", "entries_by_user"]


@dataclass(frozen=True, slots=True)
class EntryRow:
    """One entry to write: its clustering fields and stored value."""

    event_ordinal: int
    event_id: int
    entry: StoredEntry


def entries_by_user(
    dispatch: GroupDispatch,
    shard_slice: ShardSlice | None,
    shard_of: Callable[[str], int],
    *,
    mention_entries: bool,
    departures: Departures | None = None,
    is_active: Callable[[str], bool] | None = None,
) -> dict[str, list[EntryRow]]:
    """Each recipient's event group, users ascending, rows in ``(ordinal, event_id)`` order.

    ``departures``: the group's closed intervals on this shard (``load_departures``)."""
    joined: Mapping[str, int] = (
        {}
        if shard_slice is None
        else dict(zip(shard_slice.user_ids, shard_slice.joined_at, strict=True))
    )
    out: dict[str, list[EntryRow]] = {}
    target = _target_view(dispatch)
    deliveries = expand_dispatch(
        dispatch,
        shard_slice,
        shard_of,
        mention_entries=mention_entries,
        departures=departures,
        is_active=is_active,
    )
    primaries = {d.user_id for d in deliveries if d.event_type != EventType.MENTION}
    for delivery in deliveries:
        kind = EventType(delivery.event_type)
        if target is not None:
            if kind == EventType.MENTION:
                continue
            kind = EventType.CONTROL
        lone = delivery.user_id not in primaries
        entry = _entry(dispatch, delivery.user_id, kind, delivery.mention_type, joined, lone)
        if target is not None:
            entry = _amend(entry, dispatch, target, delivery.user_id)
        row = EntryRow(
            event_ordinal=int(kind),
            event_id=event_id(dispatch.tenant_id, dispatch.dispatch_id, delivery.user_id, kind),
            entry=entry,
        )
        out.setdefault(delivery.user_id, []).append(row)
    for rows in out.values():
        rows.sort(key=lambda row: (row.event_ordinal, row.event_id))
    return out


def _entry(
    dispatch: GroupDispatch,
    user_id: str,
    kind: EventType,
    mention_type: int,
    joined: Mapping[str, int],
    lone: bool = False,
) -> StoredEntry:
    own = user_id == dispatch.sender_id
    mention = kind == EventType.MENTION
    inline = dispatch.inline_body and not mention
    flags = 0
    if not mention:
        flags = _flags(dispatch, own)
    elif lone:  # a silent member's only entry (10.2.3): it stands in for the absent primary
        flags = _flags(dispatch, own) & ~int(EntryFlags.TIMELINE_VISIBLE)
    return StoredEntry(
        event_type=int(kind),
        message_id=dispatch.message_id,
        conversation_id=dispatch.conversation_id,
        conversation_seq=dispatch.conversation_seq,
        last_activity_id=dispatch.last_activity_id,
        sender_id=dispatch.sender_id,
        visibility_floor_conversation_seq=joined.get(user_id, 0),
        flags=flags,
        mention_type=mention_type,
        created_at=dispatch.committed_at,
        # an anchor_target custom message names its row (13.3); an amend's is set by ``_amend``
        target_conversation_seq=None if mention else dispatch.target_conversation_seq,
        client_message_id=(dispatch.client_message_id or None) if own and not mention else None,
        origin_device_id=(
            (dispatch.origin_device_id or None) if own and kind == EventType.CONTROL else None
        ),
        inline=inline,
        inline_message_type=dispatch.message_type if inline else 0,
        inline_custom_type=dispatch.custom_type if inline else "",
        inline_schema_version=dispatch.schema_version if inline else 0,
        inline_payload=dispatch.payload if inline else b"",
    )


def _flags(dispatch: GroupDispatch, own: bool) -> int:
    template = dispatch.event_template
    flags = 0
    if template.counts_unread and not own:
        flags |= EntryFlags.COUNTS_UNREAD
    if template.affects_session_order:
        flags |= EntryFlags.AFFECTS_SESSION_ORDER
    if template.timeline_visible:
        flags |= EntryFlags.TIMELINE_VISIBLE
    return int(flags)


def _target_view(dispatch: GroupDispatch) -> GroupDispatch | None:
    """The dispatch as the target message's: its template carries the target's mentions, so
    ``mention_type_of`` yields ``target_mention_type`` (None for a non-amend dispatch)."""
    if dispatch.amend_action is None:
        return None
    template = EventTemplate(
        mention_targets=dispatch.target_mention_targets,
        reply_to_sender_id=dispatch.target_reply_to_sender_id,
    )
    return msgspec.structs.replace(dispatch, event_template=template)


def _amend(
    entry: StoredEntry, dispatch: GroupDispatch, target: GroupDispatch, user_id: str
) -> StoredEntry:
    flags = dispatch.target_flags
    if user_id == dispatch.target_sender_id:
        flags &= ~int(EntryFlags.COUNTS_UNREAD)
    return msgspec.structs.replace(
        entry,
        target_message_id=dispatch.target_message_id,
        target_conversation_seq=dispatch.target_conversation_seq,
        target_sender_id=dispatch.target_sender_id,
        target_flags=flags,
        target_mention_type=int(mention_type_of(target, user_id)),
        mention_type=0,
        amend_action=dispatch.amend_action or "",
    )
