"""Event-group caps (spec 6.7): the worst case per recipient, the split, and the named checker.

An event group is every entry of one ``(user_id, mailbox_seq)``; one dispatch gets one
``mailbox_seq`` per shard, so a dispatch's event group per recipient is what it writes for that
user. Hard caps: <= ``mailbox_event_group_max_items`` (8) entries, <= ``..._max_bytes`` (8 KiB),
at most one entry per ``event_type``. They are what lets the MailboxNode cut batches only at
``mailbox_seq`` boundaries (9.3), so the FanoutCoordinator must never emit a dispatch over them:
it splits it into several dispatches, each with its own ``mailbox_seq`` (6.7, seed 003 M-14).

Worst case of a dispatch, per recipient (what :func:`planned_entries` lists):

* the primary entry: ``MESSAGE`` (a member's entry) or the dispatch's ``event_type`` (an explicit
  recipient's: ``MEMBERSHIP`` for a membership subject); one of them per recipient, equal size;
* a ``MENTION`` entry when ``mention_entries`` is on and the message mentions anyone (targets
  or a reply's sender). Spec 11.4.1: only the ``mention_only`` tier does that; by default the
  mention is the primary entry's ``mention_type``, so the group is 1 entry.

Each entry is measured as the stored entry the MailboxNode would write (the A.4.1
``SyncEntry`` reference fields at their widest: max ``mailbox_seq`` and ``event_id``, every
flag, ``REPLY_ME``, the sender's ``client_message_id`` and ``origin_device_id``), plus the inline
body, its type fields and a ``dek_id`` allowance when ``inline_body`` is set -- counted on every
entry, so the bound holds whichever entry the MailboxNode puts the body on.

Split rule: a group over the caps becomes one chunk per entry kind, in ``event_ordinal`` order
(chunk 0: the primary entries, with ``mention_type`` still set from the template; chunk 1: the
MENTION entries). ``chunk_count > 1`` tells the MailboxNode that each chunk writes only its own
``event_type``. A single entry over the byte cap can only be an inline body (ids and types are
bounded by frame limits): that chunk ships with ``inline_body = false`` -- the body still rides
along and is joined at read time (direction 4.4) -- a decision taken from the message alone,
so every shard takes the same one (26.3.7).

Identity of the chunks: spec 7.8 freezes ``dispatch_id = BLAKE3("qim.group-dispatch.v1" 0x00 ||
message_id_be16 || target_mailbox_shard_be4)[0:16]`` -- one id per (message, shard), the
MailboxNode's dedup key across replays (10.1.2) -- and says nothing of split chunks, which each
need their own id (each is its own dispatch, with its own ``mailbox_seq``). Our rule, immutable
like the base form (27.2.4): an unsplit dispatch and chunk 0 of a split use the frozen form
unchanged, so every unsplit dispatch keeps its spec id; chunk ``k >= 1`` uses
``BLAKE3("qim.group-dispatch-chunk.v1" 0x00 || message_id_be16 || shard_be4 ||
chunk_index_be4)[0:16]``, whose own domain tag keeps the two input spaces disjoint (42 vs 52
bytes, different first field) through the one canonical ``hash_input`` rule. ``event_id``
hashes the chunk's ``dispatch_id``, so entries of different chunks never share one either.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import msgspec

from qim.core.fanout.config import INLINE_DEK_ID_ALLOWANCE, FanoutConfig
from qim.schemas.events import DISPATCH_ID_SIZE, EventType, dispatch_id
from qim.schemas.frames.base import EntryFlags, MentionType
from qim.schemas.frames.mailbox import SyncEntry
from qim.schemas.hashing import blake3_digest, fixed_uint, hash_input
from qim.schemas.ids import message_id_from_bytes, message_id_to_bytes
from qim.schemas.records.dispatch import GroupDispatch
from qim.schemas.seqs import compose_mailbox_seq

__all__ = [
    "CHUNK_DISPATCH_ID_DOMAIN",
    "EventGroupOverflow",
    "PlannedEntry",
    "check_event_group_caps",
    "chunk_dispatch_id",
    "chunk_dispatch_id_input",
    "planned_entries",
    "split_event_groups",
]

_ENCODER = msgspec.msgpack.Encoder()
_WIDEST_MAILBOX_SEQ = compose_mailbox_seq(0x7FFF, (1 << 48) - 1)
_WIDEST_EVENT_ID = (1 << 64) - 1
_ALL_FLAGS = int(EntryFlags.COUNTS_UNREAD | EntryFlags.AFFECTS_SESSION_ORDER)
_ALL_FLAGS |= int(EntryFlags.TIMELINE_VISIBLE)


CHUNK_DISPATCH_ID_DOMAIN: Final = "qim.group-dispatch-chunk.v1"
_SHARD_SIZE: Final = 4
_CHUNK_SIZE: Final = 4


def chunk_dispatch_id_input(message_id: int, target_mailbox_shard: int, chunk_index: int) -> bytes:
    """``"qim.group-dispatch-chunk.v1" 0x00 || message_id_be16 || shard_be4 || chunk_be4``."""
    if chunk_index < 1:
        raise ValueError("chunk 0 uses the frozen spec 7.8 input (qim.schemas.dispatch_id_input)")
    return hash_input(
        CHUNK_DISPATCH_ID_DOMAIN,
        message_id_to_bytes(message_id),
        fixed_uint(target_mailbox_shard, _SHARD_SIZE),
        fixed_uint(chunk_index, _CHUNK_SIZE),
    )


def chunk_dispatch_id(message_id: int, target_mailbox_shard: int, chunk_index: int = 0) -> bytes:
    """The ``dispatch_id`` of chunk ``chunk_index`` of (message, shard); chunk 0 = spec 7.8."""
    if chunk_index == 0:
        return dispatch_id(message_id, target_mailbox_shard)
    data = chunk_dispatch_id_input(message_id, target_mailbox_shard, chunk_index)
    return blake3_digest(data)[:DISPATCH_ID_SIZE]


class EventGroupOverflow(ValueError):
    """One entry alone exceeds the byte cap even without an inline body: a bug of ours or a
    misconfiguration (caps below the frame limits), never the sender's fault."""


@dataclass(frozen=True, slots=True)
class PlannedEntry:
    """One entry of the worst-case per-recipient event group: its kind and stored size."""

    event_type: EventType
    size: int


def _entry_size(dispatch: GroupDispatch, event_type: EventType) -> int:
    inline = dispatch.inline_body
    entry = SyncEntry(
        mailbox_seq=_WIDEST_MAILBOX_SEQ,
        event_ordinal=int(event_type),
        event_id=_WIDEST_EVENT_ID,
        event_type=int(event_type),
        message_id=dispatch.message_id,
        conversation_id=dispatch.conversation_id,
        conversation_seq=dispatch.conversation_seq,
        last_activity_id=dispatch.last_activity_id,
        sender_id=dispatch.sender_id,
        visibility_floor_conversation_seq=dispatch.conversation_seq,
        flags=_ALL_FLAGS,
        mention_type=MentionType.REPLY_ME,
        created_at=dispatch.committed_at,
        client_message_id=dispatch.client_message_id or None,
        origin_device_id=dispatch.origin_device_id or None,
        body_included=inline,
        message_type=dispatch.message_type if inline else None,
        custom_type=dispatch.custom_type if inline else None,
        schema_version=dispatch.schema_version if inline else None,
        payload_or_ciphertext=dispatch.payload if inline else None,
    )
    return len(_ENCODER.encode(entry)) + (INLINE_DEK_ID_ALLOWANCE if inline else 0)


def _kinds(dispatch: GroupDispatch, config: FanoutConfig) -> list[EventType]:
    """Entry kinds of an unsplit dispatch, in ``event_ordinal`` order."""
    kinds = [EventType(dispatch.event_type)]
    template = dispatch.event_template
    mention_entries = config.mention_entries or dispatch.write_policy == "mention_only"
    if mention_entries and (template.mention_targets or template.reply_to_sender_id):
        kinds.append(EventType.MENTION)
    return sorted(kinds)


def planned_entries(dispatch: GroupDispatch, config: FanoutConfig) -> tuple[PlannedEntry, ...]:
    """The worst-case event group one recipient gets from ``dispatch`` (chunk-aware)."""
    if dispatch.chunk_count > 1:
        kinds = [EventType(dispatch.event_type)]
    else:
        kinds = _kinds(dispatch, config)
    return tuple(PlannedEntry(kind, _entry_size(dispatch, kind)) for kind in kinds)


def _fits(entries: tuple[PlannedEntry, ...], config: FanoutConfig) -> bool:
    return (
        len(entries) <= config.event_group_max_items
        and sum(e.size for e in entries) <= config.event_group_max_bytes
    )


def split_event_groups(dispatch: GroupDispatch, config: FanoutConfig) -> tuple[GroupDispatch, ...]:
    """``dispatch`` itself if its event group fits the caps, else its chunks (module docstring)."""
    if _fits(planned_entries(dispatch, config), config):
        return (dispatch,)
    kinds = _kinds(dispatch, config)
    message_id = message_id_from_bytes(dispatch.message_id)
    chunks = []
    for index, kind in enumerate(kinds):
        chunk = msgspec.structs.replace(
            dispatch,
            dispatch_id=chunk_dispatch_id(message_id, dispatch.target_mailbox_shard, index),
            event_type=int(kind),  # a plain int: an IntEnum 0 would defeat omit_defaults
            chunk_index=index,
            chunk_count=len(kinds),
        )
        if not _fits(planned_entries(chunk, config), config):
            chunk = msgspec.structs.replace(chunk, inline_body=False)
        if not _fits(planned_entries(chunk, config), config):
            raise EventGroupOverflow(f"one {kind.name} entry exceeds the event-group byte cap")
        chunks.append(chunk)
    return tuple(chunks)


def check_event_group_caps(dispatches: Iterable[GroupDispatch], config: FanoutConfig) -> list[str]:
    """Invariant of spec 6.7 over a set of dispatches; returns the violations (empty = sound).

    Per dispatch: the worst-case event group is within both caps with at most one entry per
    ``event_type``, and ``dispatch_id`` is the one its (message, shard, chunk) derives. Per
    (message, shard): the chunks are exactly ``0..chunk_count-1`` with one ``chunk_count`` and
    distinct event types. Duplicates (at-least-once) are fine. Used by tests and the audit.
    """
    problems: list[str] = []
    chunks: dict[tuple[str, bytes, int], dict[int, GroupDispatch]] = {}
    for d in dispatches:
        where = f"{d.message_id.hex()}@{d.target_mailbox_shard}#{d.chunk_index}"
        entries = planned_entries(d, config)
        if not _fits(entries, config):
            size = sum(e.size for e in entries)
            problems.append(f"{where}: event group of {len(entries)} entries, {size} bytes")
        if len({e.event_type for e in entries}) != len(entries):
            problems.append(f"{where}: two entries of one event_type")
        if not 0 <= d.chunk_index < d.chunk_count:
            problems.append(f"{where}: chunk index out of range of {d.chunk_count}")
            continue
        mid = message_id_from_bytes(d.message_id)
        if d.dispatch_id != chunk_dispatch_id(mid, d.target_mailbox_shard, d.chunk_index):
            problems.append(f"{where}: dispatch_id is not the one of its chunk")
        key = (d.tenant_id, d.message_id, d.target_mailbox_shard)
        chunks.setdefault(key, {}).setdefault(d.chunk_index, d)
    for (_, message_id, shard), found in sorted(chunks.items()):
        counts = {c.chunk_count for c in found.values()}
        types = [found[i].event_type for i in sorted(found)]
        if len(counts) != 1 or sorted(found) != list(range(max(counts))):
            problems.append(f"{message_id.hex()}@{shard}: chunks {sorted(found)} of {counts}")
        if len(set(types)) != len(types):
            problems.append(f"{message_id.hex()}@{shard}: two chunks of one event_type")
    return problems
