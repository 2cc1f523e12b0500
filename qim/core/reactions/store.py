"""Where a message's reactions live in the MessageStore, and how they are read and written.

Spec 7.15 puts ``MessageReactionSummary`` in the partition of ``MessageRecord`` so that the
read-time join (18.3.1, 13.6.4) fetches messages and aggregates in one range read. Our
MessageStore is one ordered RocksDB per writer partition, so "the same partition" is the same
database, and the summary keys sort like the message keys: a page of history is one range scan
of messages plus one range scan of their summaries over the same seq range. Layout::

    summary = b"s" tenant 0x00 conversation 0x00 seq(8 BE)
    detail  = b"x" tenant 0x00 conversation 0x00 seq(8 BE) reaction_key 0x00 user_id

``s`` and ``x`` are tags of their own (``m`` messages, ``d`` direct participants), so no scan
of one kind meets another. A detail row is the idempotency key of 13.6.2, ``(tenant,
conversation, seq, user, reaction_key)``, and its value the row's ``created_at``; the rows of
one key sort by user, which is the PULL_REACTIONS page order.

Both are written only from outbox records (``MessageReacted``; a recall or delete removes them,
13.6.4) by :func:`reaction_writes` / :func:`removal_writes`, called by the HistoryArchiver in log
order, so live, redelivered and replayed stores converge byte for byte (``qim replay history``).

**Detail, volume control and idempotency (our reading of 13.6.3 / 7.15, written down in
topology.md):** the rows are the only way to make a repeated add or a remove of nothing a no-op
and to fill ``self_reaction_keys``, and 13.6.2 makes no exception for big groups, so rows are
kept whatever the member count, up to ``reaction_detail_max_per_message`` rows per message.
What stops above ``reaction_detail_max_members`` members is the *detail served*: PULL_REACTIONS
answers ``total`` with an empty ``users[]``. Past the per-message cap a new reactor gets no row
(7.15: only the aggregate grows) and the message's ``detail_complete`` turns false for good:
its detail is no longer a true list (``users[]`` empty from then on), and an add of a user
without a row is counted again -- the one place an add is not idempotent, as 7.15 accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

import msgspec

from qim.schemas.frames.base import U32, U64
from qim.schemas.frames.reactions import MessageReactions, ReactionList
from qim.schemas.hashing import validate_identifier
from qim.schemas.records.outbox import MessageReacted

__all__ = [
    "DETAIL_KEYSPACE",
    "SUMMARY_KEYSPACE",
    "PointReader",
    "ReactionReader",
    "ReactionRow",
    "ReactionSummary",
    "StoreWrite",
    "decode_summary",
    "detail_key",
    "detail_prefix",
    "encode_summary",
    "has_reaction",
    "joined_reactions",
    "reaction_page",
    "reaction_writes",
    "read_summary",
    "removal_writes",
    "self_reaction_keys",
    "summary_key",
]

SUMMARY_KEYSPACE: Final = b"s"
DETAIL_KEYSPACE: Final = b"x"
_SEQ: Final = 8


class ReactionSummary(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """``MessageReactionSummary`` (7.15) as stored: counts by key (sorted, no zero entries).

    ``detail_rows`` counts the message's detail rows (the per-message cap);
    ``detail_complete`` is false once an add went uncounted in detail (module docstring).
    ``self_reaction_keys`` is never stored: it is the requester's, filled at read time.
    """

    counts: dict[str, U32] = msgspec.field(default_factory=dict)
    summary_version: U64 = 0
    updated_at: U64 = 0
    detail_rows: U32 = 0
    detail_complete: bool = True

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class ReactionRow(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """``MessageReaction`` (7.15): one user's one key on one message."""

    created_at: U64 = 0


_ENCODER = msgspec.msgpack.Encoder()
_SUMMARY = msgspec.msgpack.Decoder(ReactionSummary)
_ROW = msgspec.msgpack.Decoder(ReactionRow)


def encode_summary(summary: ReactionSummary) -> bytes:
    return _ENCODER.encode(summary)


def decode_summary(raw: bytes) -> ReactionSummary:
    return _SUMMARY.decode(raw)


def _conversation(tag: bytes, tenant_id: str, conversation_id: str) -> bytes:
    validate_identifier(tenant_id, "tenant_id")
    validate_identifier(conversation_id, "conversation_id")
    return tag + tenant_id.encode() + b"\x00" + conversation_id.encode() + b"\x00"


def summary_key(tenant_id: str, conversation_id: str, seq: int) -> bytes:
    return _conversation(SUMMARY_KEYSPACE, tenant_id, conversation_id) + seq.to_bytes(_SEQ, "big")


def detail_prefix(tenant_id: str, conversation_id: str, seq: int, reaction_key: str = "") -> bytes:
    """Every detail key of a message (or, with ``reaction_key``, of one key on it)."""
    prefix = _conversation(DETAIL_KEYSPACE, tenant_id, conversation_id) + seq.to_bytes(_SEQ, "big")
    if reaction_key:
        prefix += reaction_key.encode() + b"\x00"
    return prefix


def detail_key(
    tenant_id: str, conversation_id: str, seq: int, reaction_key: str, user_id: str
) -> bytes:
    validate_identifier(reaction_key, "reaction_key")
    validate_identifier(user_id, "user_id")
    return detail_prefix(tenant_id, conversation_id, seq, reaction_key) + user_id.encode()


class PointReader(Protocol):
    """Point reads: all a REACT decision needs (the writer's overlay of its open batch)."""

    def get(self, key: bytes) -> bytes | None: ...


class ReactionReader(PointReader, Protocol):
    """The MessageStore as this module reads it (point reads and the ordered scan contract)."""

    def scan(
        self, prefix: bytes, start_key: bytes, reverse: bool
    ) -> Iterator[tuple[bytes, bytes]]: ...


# -- writes (HistoryArchiver) -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoreWrite:
    """A put (``value`` bytes) or a delete (``value`` None) of the MessageStore."""

    key: bytes
    value: bytes | None


def reaction_writes(record: MessageReacted) -> list[StoreWrite]:
    """The summary (a blind put of the record's result) and the reactor's detail row."""
    t, c, seq = record.tenant_id, record.conversation_id, record.target_conversation_seq
    summary = ReactionSummary(  # no counts left: the version stays (it never goes back)
        counts=dict(sorted(record.counts.items())),
        summary_version=record.summary_version,
        updated_at=record.committed_at,
        detail_rows=record.detail_rows,
        detail_complete=record.detail_complete,
    )
    writes = [StoreWrite(summary_key(t, c, seq), encode_summary(summary))]
    if record.detail:
        key = detail_key(t, c, seq, record.reaction_key, record.user_id)
        if record.action == "add":
            row = _ENCODER.encode(ReactionRow(created_at=record.committed_at))
            writes.append(StoreWrite(key, row))
        else:
            writes.append(StoreWrite(key, None))
    return writes


def removal_writes(
    tenant_id: str, conversation_id: str, seq: int, keys_under: Callable[[bytes], Iterable[bytes]]
) -> list[StoreWrite]:
    """13.6.4: a recalled or deleted message loses its summary and every detail row.

    ``keys_under(prefix)`` lists the keys present under a prefix (the store and the batch).
    """
    writes = [StoreWrite(summary_key(tenant_id, conversation_id, seq), None)]
    prefix = detail_prefix(tenant_id, conversation_id, seq)
    writes.extend(StoreWrite(key, None) for key in sorted(keys_under(prefix)))
    return writes


# -- reads ---------------------------------------------------------------------------------------


def read_summary(
    reader: PointReader, tenant_id: str, conversation_id: str, seq: int
) -> ReactionSummary | None:
    raw = reader.get(summary_key(tenant_id, conversation_id, seq))
    return None if raw is None else decode_summary(raw)


def has_reaction(
    reader: PointReader,
    tenant_id: str,
    conversation_id: str,
    seq: int,
    reaction_key: str,
    user_id: str,
) -> bool:
    return (
        reader.get(detail_key(tenant_id, conversation_id, seq, reaction_key, user_id)) is not None
    )


def self_reaction_keys(
    reader: PointReader,
    tenant_id: str,
    conversation_id: str,
    seq: int,
    counts: Mapping[str, int],
    user_id: str,
) -> tuple[str, ...]:
    """The requester's keys on a message: one point read per key the message has (7.15)."""
    if not user_id:
        return ()
    return tuple(
        key
        for key in sorted(counts)
        if has_reaction(reader, tenant_id, conversation_id, seq, key, user_id)
    )


def joined_reactions(
    reader: ReactionReader,
    tenant_id: str,
    conversation_id: str,
    low: int,
    high: int,
    viewer: str,
) -> dict[int, MessageReactions]:
    """The aggregates of seqs ``low..high`` in ONE range scan (18.3.1), with the viewer's keys.

    A summary without counts (every reaction removed) is left out: the message shows none.
    """
    out: dict[int, MessageReactions] = {}
    if low > high:
        return out
    prefix = _conversation(SUMMARY_KEYSPACE, tenant_id, conversation_id)
    for key, raw in reader.scan(prefix, prefix + low.to_bytes(_SEQ, "big"), False):
        seq = int.from_bytes(key[-_SEQ:], "big")
        if seq > high:
            break
        summary = decode_summary(raw)
        if not summary.counts:
            continue
        mine = self_reaction_keys(reader, tenant_id, conversation_id, seq, summary.counts, viewer)
        out[seq] = MessageReactions(
            counts=summary.counts,
            summary_version=summary.summary_version,
            self_reaction_keys=mine,
        )
    return out


def reaction_page(
    reader: ReactionReader,
    tenant_id: str,
    conversation_id: str,
    seq: int,
    reaction_key: str,
    *,
    offset: int,
    limit: int,
    detail_served: bool,
) -> ReactionList:
    """REACTION_LIST: ``total`` always; ``users[offset:offset+limit]`` only when detail is
    served (``detail_served``: members <= ``reaction_detail_max_members``) and complete.

    ``reaction_key`` empty lists every key (``total`` = all reactions; a user appears once per
    key, in key order). ``has_more`` is exact (one look-ahead row).
    """
    summary = read_summary(reader, tenant_id, conversation_id, seq)
    if summary is None:
        return ReactionList()
    total = summary.counts.get(reaction_key, 0) if reaction_key else summary.total
    if not detail_served or not summary.detail_complete or limit <= 0:
        return ReactionList(total=total)
    prefix = detail_prefix(tenant_id, conversation_id, seq, reaction_key)
    users: list[str] = []
    has_more = False
    for index, (key, _) in enumerate(reader.scan(prefix, prefix, False)):
        if index < offset:
            continue
        if len(users) >= limit:
            has_more = True
            break
        users.append(key[len(prefix) :].split(b"\x00")[-1].decode())
    return ReactionList(users=tuple(users), total=total, has_more=has_more)
