"""UserConversationState's compacted changelog: the ``U`` rows that outlive the dispatch log.

Why (issue 18, direction.md 4.2, spec 7.5 / 12.2 / 18): a MailboxShard's store is a function of
its dispatch partition, but that log is kept 8 days; read positions, pins, mutes, archive and the
visibility bounds of every user of the shard would die with the disk once the log is shorter
than their history. So every WriteBatch that changes ``U`` rows also publishes them, after the
batch, to ``qim-mailbox-UserConversationState-changelog`` (compacted, one partition per
MailboxShard, explicit partition = the user's shard): latest value per key wins, so the topic
holds every row ever written, however old.

Layout = a Faust table changelog (``{app_id}-{table}-changelog`` with ``raw`` key and value
serializers, as ``qim.apps.keys`` and ``qim.apps.notify`` use): a Faust ``Table`` declared over
it (:func:`declare_table`) recovers exactly these bytes into its RocksDB store and reads them
back by key.

* key: ``tenant 00 user 00 conversation_id`` (the store's ``U`` key without its tag);
* value: :class:`ChangelogValue` (msgpack array): the shard, its epoch, the dispatch offset
  the row was folded from, and the stored row byte for byte (``encode_state``).

The store and the changelog are two writes, not one: how they stay consistent after a crash
between them is ``topology.md`` decision 41 (markers below, re-publish at takeover, restore with
a replay that skips what a row already reflects).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition

from qim.core.mailbox.ports import KVReader, Op
from qim.core.mailbox.session_store import CONV_STATE, decode_state
from qim.core.session_list import UserConversationState
from qim.schemas.seqs import compose_mailbox_seq, split_mailbox_seq

__all__ = [
    "APP_ID",
    "CHANGED_KEY",
    "PUBLISHED_KEY",
    "TABLE_NAME",
    "ChangelogValue",
    "changed_rows",
    "changelog_key",
    "changelog_records",
    "declare_table",
    "decode_changelog_value",
    "encode_changelog_value",
    "marker",
    "marker_op",
    "read_changelog",
    "restore_ops",
    "row_seq",
    "store_key",
    "unpublished_rows",
]

APP_ID: Final = "qim-mailbox"
TABLE_NAME: Final = "UserConversationState"

CHANGED_KEY: Final = b"\x00ucs-changed"
"""mailbox_seq of the last WriteBatch that changed ``U`` rows; written IN that WriteBatch."""
PUBLISHED_KEY: Final = b"\x00ucs-published"
"""mailbox_seq through which every ``U`` change is acknowledged in the changelog; written after
the acknowledgements. ``CHANGED > PUBLISHED`` after a crash = rows to re-publish."""

_U64: Final = struct.Struct(">Q")


class ChangelogValue(msgspec.Struct, array_like=True, frozen=True, kw_only=True):
    """One changelog value: the row and the dispatch record it was folded from."""

    mailbox_shard: int
    shard_epoch: int
    offset: int
    """Offset in the shard's dispatch partition of the record whose fold wrote ``row``."""
    row: bytes
    """The ``U`` value as stored (``encode_state``), byte for byte."""

    @property
    def mailbox_seq(self) -> int:
        return compose_mailbox_seq(self.shard_epoch, self.offset)

    def state(self) -> UserConversationState:
        return decode_state(self.row)


_ENC: Final = msgspec.msgpack.Encoder()
_DEC: Final = msgspec.msgpack.Decoder(ChangelogValue)


def encode_changelog_value(value: ChangelogValue) -> bytes:
    return _ENC.encode(value)


def decode_changelog_value(data: bytes) -> ChangelogValue:
    return _DEC.decode(data)


def changelog_key(key: bytes) -> bytes:
    """``U tenant 00 user 00 conv`` -> ``tenant 00 user 00 conv``."""
    if key[:1] != CONV_STATE:
        raise ValueError("not a UserConversationState key")
    return key[1:]


def store_key(key: bytes) -> bytes:
    return CONV_STATE + key


def row_seq(row: bytes) -> int:
    """The mailbox_seq of the last change of a stored row (``apply_change`` stamps
    ``updated_activity_id`` with the log position of the change)."""
    return decode_state(row).updated_activity_id


def changed_rows(ops: Iterable[Op]) -> list[tuple[bytes, bytes | None]]:
    """The ``U`` ops of one WriteBatch, last write per key, in key order."""
    rows: dict[bytes, bytes | None] = {}
    for key, value in ops:
        if key[:1] == CONV_STATE:
            rows[key] = value
    return sorted(rows.items())


def changelog_records(
    rows: Sequence[tuple[bytes, bytes | None]], *, mailbox_shard: int, mailbox_seq: int
) -> list[tuple[bytes, bytes | None]]:
    """``(key, value)`` records for ``rows`` folded at ``mailbox_seq`` (None = tombstone).

    A row's offset is that of its own last change (``updated_activity_id``) when it has one,
    else the batch's: the same record whether published live or re-published at takeover."""
    out: list[tuple[bytes, bytes | None]] = []
    for key, value in rows:
        if value is None:
            out.append((changelog_key(key), None))
            continue
        seq = row_seq(value) or mailbox_seq
        epoch, offset = split_mailbox_seq(seq)
        cv = ChangelogValue(
            mailbox_shard=mailbox_shard, shard_epoch=epoch, offset=offset, row=value
        )
        out.append((changelog_key(key), encode_changelog_value(cv)))
    return out


def marker(store: KVReader, key: bytes) -> int:
    raw = store.get(key)
    return 0 if raw is None else int(_U64.unpack(raw)[0])


def marker_op(key: bytes, mailbox_seq: int) -> Op:
    return key, _U64.pack(mailbox_seq)


def unpublished_rows(store: KVReader, published: int) -> Iterator[tuple[bytes, bytes]]:
    """Every ``U`` row changed after ``published`` (a scan of the ``U`` keyspace only)."""
    for key, value in store.scan(CONV_STATE, CONV_STATE, False):
        if row_seq(value) > published:
            yield key, value


def restore_ops(store: KVReader, changelog: dict[bytes, bytes]) -> tuple[list[Op], int]:
    """The ops that bring the store's ``U`` rows up to the changelog, and the newest
    mailbox_seq restored (0: nothing). A row the store already holds at the same or a later
    change (a checkpoint ahead of the changelog) is kept."""
    ops: list[Op] = []
    newest = 0
    for key, raw in sorted(changelog.items()):
        value = decode_changelog_value(raw)
        skey = store_key(key)
        have = store.get(skey)
        if have is not None and row_seq(have) >= row_seq(value.row):
            continue
        ops.append((skey, value.row))
        newest = max(newest, value.mailbox_seq)
    return ops, newest


async def read_changelog(
    bootstrap: str, topic: str, partition: int, *, client_id: str = "qim-ucs-restore"
) -> dict[bytes, bytes]:
    """The latest value per key of one changelog partition (tombstones drop the key), read
    from its start to its end with a group-less consumer."""
    tp = TopicPartition(topic, partition)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        client_id=client_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
    )
    await consumer.start()
    rows: dict[bytes, bytes] = {}
    try:
        consumer.assign([tp])
        end = int((await consumer.end_offsets([tp]))[tp])
        start = int((await consumer.beginning_offsets([tp]))[tp])
        if end <= start:
            return rows
        consumer.seek(tp, start)
        position = start
        while position < end:
            fetched = await consumer.getmany(tp, timeout_ms=1000, max_records=5000)
            for record in fetched.get(tp, []):
                position = record.offset + 1
                if record.key is None:
                    continue
                if record.value is None:
                    rows.pop(record.key, None)
                else:
                    rows[record.key] = record.value
            if not fetched:
                position = max(position, await consumer.position(tp))
    finally:
        await consumer.stop()
    return rows


def declare_table(app: Any, partitions: int) -> Any:
    """A Faust ``Table`` over the changelog (``app`` must have id ``qim-mailbox``): RocksDB
    store, raw bytes as written by the MailboxNode. For tools and audits that want the rows
    as a Faust table; the MailboxNode itself restores through :func:`read_changelog` inside
    its own takeover (its group is not Faust's)."""
    table = app.Table(
        TABLE_NAME,
        partitions=partitions,
        key_type=bytes,
        value_type=bytes,
        help="UserConversationState rows keyed (tenant, user, conversation), 7.5",
    )
    # As qim.apps.keys: Collection takes no serializer argument; the store and the changelog
    # topic are made lazily from these attributes.
    table.key_serializer = "raw"
    table.value_serializer = "raw"
    return table
