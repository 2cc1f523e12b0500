"""MessageStore: the HistoryArchiver's RocksDB, one database per ConversationWriter partition.

Why one rocksdict database per outbox partition, owned by the writer of that partition: the
history of a conversation is a pure function of its outbox records (``qim.core.history``), and
the outbox partition is the unit of ownership, so the store moves with the partition and a new
owner rebuilds it by replaying that partition. The store therefore records, in the same
WriteBatch as the rows it writes, the last outbox offset it has applied: a crash between the
outbox commit and the store write leaves the store behind the log, never ahead of it, and the
restore path replays from ``applied_offset + 1``.

Keyspaces (one byte tag each, so they never interleave in a scan):

* ``b"m"`` -- MessageRecords, layout of :mod:`qim.core.history.keys`;
* ``b"d" tenant 0x00 conversation 0x00`` -- the participants of a direct conversation (msgpack
  list), remembered from its MessageCommitted records: PULL_HISTORY of a one-to-one conversation
  has no peer to recompute the id from, so membership is checked against this list;
* ``b"s"`` / ``b"x"`` -- reaction summaries and detail rows (:mod:`qim.core.reactions.store`);
* ``b"\\x00outbox-offset"`` -- the applied offset, 8 bytes big-endian of ``offset + 1``.

Implements ``OrderedReader`` / ``OrderedWriter`` of the history core. The block cache is capped
(the RocksDB default is 2 GiB per database); the caller passes the same caps as Faust tables.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import msgspec
import rocksdict

from qim.core.history import ArchiveWrite
from qim.schemas.hashing import validate_identifier
from qim.tables.rocks import prefix_scan

__all__ = ["NO_OFFSET", "MessageStore", "participants_key"]

NO_OFFSET: Final = -1
"""``applied_offset`` of an empty store: nothing of the outbox applied yet."""

_OFFSET_KEY: Final = b"\x00outbox-offset"
_PARTICIPANTS: Final = b"d"
_DEFAULTS: Final[Mapping[str, int]] = {
    "block_cache_size": 8 * 1024 * 1024,
    "write_buffer_size": 4 * 1024 * 1024,
    "max_write_buffer_number": 2,
    "max_open_files": 256,
}
_ENCODER = msgspec.msgpack.Encoder()
_PARTICIPANTS_DECODER = msgspec.msgpack.Decoder(tuple[str, ...])


def participants_key(tenant_id: str, conversation_id: str) -> bytes:
    """Key of a direct conversation's participant list (NUL-terminated like message keys)."""
    validate_identifier(tenant_id, "tenant_id")
    validate_identifier(conversation_id, "conversation_id")
    return (
        _PARTICIPANTS
        + tenant_id.encode("utf-8")
        + b"\x00"
        + conversation_id.encode("utf-8")
        + b"\x00"
    )


def _options(caps: Mapping[str, Any]) -> rocksdict.Options:
    merged = {**_DEFAULTS, **caps}
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_max_open_files(int(merged["max_open_files"]))
    options.set_write_buffer_size(int(merged["write_buffer_size"]))
    options.set_max_write_buffer_number(int(merged["max_write_buffer_number"]))
    table = rocksdict.BlockBasedOptions()
    table.set_block_cache(rocksdict.Cache(int(merged["block_cache_size"])))
    table.set_bloom_filter(10, True)
    options.set_block_based_table_factory(table)
    return options


class MessageStore:
    """History rows, direct participants and the applied outbox offset of one partition."""

    def __init__(
        self,
        path: Path,
        caps: Mapping[str, Any] | None = None,
        *,
        secondary_path: Path | None = None,
    ) -> None:
        self.path = path
        if secondary_path is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db: Any = rocksdict.Rdict(str(path), options=_options(caps or {}))
        else:  # a read-only view of a store the writer holds open (``qim replay history``)
            if not path.is_dir():
                raise FileNotFoundError(f"no message store at {path}")
            secondary_path.mkdir(parents=True, exist_ok=True)
            self._db = rocksdict.Rdict(
                str(path),
                options=_options(caps or {}),
                access_type=rocksdict.AccessType.secondary(str(secondary_path)),
            )
        raw = self._db.get(_OFFSET_KEY)
        self._applied = NO_OFFSET if raw is None else int.from_bytes(raw, "big") - 1

    @property
    def applied_offset(self) -> int:
        """The last outbox offset whose records are in the store; ``NO_OFFSET`` if none."""
        return self._applied

    # -- OrderedReader / OrderedWriter ----------------------------------------------------------

    def scan(
        self, prefix: bytes, start_key: bytes, reverse: bool
    ) -> Generator[tuple[bytes, bytes], None, None]:
        """The history core's scan contract (``qim.core.history.store``), lazily."""
        yield from prefix_scan(self._db, prefix, start_key, reverse)

    def put(self, key: bytes, value: bytes) -> None:
        self._db[key] = value

    def delete(self, key: bytes) -> None:
        del self._db[key]

    def get(self, key: bytes) -> bytes | None:
        value: bytes | None = self._db.get(key)
        return value

    def keys_under(self, prefix: bytes) -> list[bytes]:
        """Every key under ``prefix`` (a message's reaction rows), ascending."""
        return [key for key, _ in prefix_scan(self._db, prefix, prefix, False)]

    # -- the writer's API ------------------------------------------------------------------------

    def participants(self, tenant_id: str, conversation_id: str) -> tuple[str, ...] | None:
        """The users of a direct conversation, or None if it has no committed message yet."""
        raw = self.get(participants_key(tenant_id, conversation_id))
        return None if raw is None else _PARTICIPANTS_DECODER.decode(raw)

    def commit(
        self,
        writes: Iterable[ArchiveWrite],
        participants: Iterable[tuple[str, str, tuple[str, ...]]],
        outbox_offset: int,
    ) -> None:
        """Apply one committed outbox stretch in one WriteBatch, with its last offset.

        ``participants`` rows are ``(tenant_id, conversation_id, users)``. An offset not above
        the applied one is a programming error: the store only moves forward with the log.
        """
        if outbox_offset <= self._applied:
            raise ValueError(f"outbox offset {outbox_offset} <= applied {self._applied}")
        batch = rocksdict.WriteBatch(raw_mode=True)
        for write in writes:
            if write.value is None:
                batch.delete(write.key)
            else:
                batch.put(write.key, write.value)
        for tenant_id, conversation_id, users in participants:
            batch.put(participants_key(tenant_id, conversation_id), _ENCODER.encode(users))
        batch.put(_OFFSET_KEY, (outbox_offset + 1).to_bytes(8, "big"))
        self._db.write(batch)
        self._applied = outbox_offset

    def items(self) -> Generator[tuple[bytes, bytes], None, None]:
        """Every pair in key order (replay comparison)."""
        yield from prefix_scan(self._db, b"", b"", False)

    def close(self) -> None:
        self._db.close()
