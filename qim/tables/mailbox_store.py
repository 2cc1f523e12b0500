"""MailboxStore: one RocksDB per MailboxShard, the MailboxNode's whole local state.

Why one rocksdict database per shard rather than a Faust table (direction.md 4.2,
faust-kafka-notes C4/C5): the store is a pure function of the shard's dispatch partition, so the
dispatch log *is* its changelog and a second changelog topic would only double the writes; and
entries, DispatchProgress, ``W[]``, ``W_floor[]`` and the dedup set of one materialize call must
commit together, which a single ``WriteBatch`` on a single database gives for free.

The key layout and the values are the core's (``qim.core.mailbox.keys`` / ``values``); this
module only adapts RocksDB to the core's :class:`~qim.core.mailbox.KVReader` seam (``get`` and
a lazy prefix scan) and commits a result's ops as one ``WriteBatch`` (:meth:`apply`). The block
cache is capped: RocksDB's default is 2 GiB *per database*, and a worker may own 64 shards.

A live store can be read by another process through :meth:`MailboxStore.secondary` (RocksDB's
secondary instance: a consistent view of the primary at open time, no lock taken); the replay
audit compares a rebuilt store with the running worker's that way.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import rocksdict

from qim.core.mailbox import Op
from qim.tables.rocks import prefix_scan

__all__ = ["DEFAULT_CAPS", "MailboxStore"]

_ITER_SKIP: Final = "rocksdb.number.iter.skip "

DEFAULT_CAPS: Final[Mapping[str, int]] = {
    "block_cache_size": 8 * 1024 * 1024,
    "write_buffer_size": 4 * 1024 * 1024,
    "max_write_buffer_number": 2,
    "max_open_files": 256,
}


def _options(caps: Mapping[str, Any], *, create: bool) -> rocksdict.Options:
    merged = {**DEFAULT_CAPS, **caps}
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(create)
    options.set_max_open_files(int(merged["max_open_files"]))
    options.set_write_buffer_size(int(merged["write_buffer_size"]))
    options.set_max_write_buffer_number(int(merged["max_write_buffer_number"]))
    table = rocksdict.BlockBasedOptions()
    table.set_block_cache(rocksdict.Cache(int(merged["block_cache_size"])))
    table.set_bloom_filter(10, True)
    options.set_block_based_table_factory(table)
    options.enable_statistics()
    return options


class MailboxStore:
    """A shard's RocksDB as the core's ``KVReader``, written only through :meth:`apply`."""

    def __init__(
        self,
        path: Path,
        caps: Mapping[str, Any] | None = None,
        *,
        secondary_path: Path | None = None,
    ) -> None:
        self.path = path
        self.read_only = secondary_path is not None
        if secondary_path is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._options = _options(caps or {}, create=True)
            self._db: Any = rocksdict.Rdict(str(path), options=self._options)
        else:
            secondary_path.mkdir(parents=True, exist_ok=True)
            self._options = _options(caps or {}, create=False)
            self._db = rocksdict.Rdict(
                str(path),
                options=self._options,
                access_type=rocksdict.AccessType.secondary(str(secondary_path)),
            )
        self.writes = 0
        """WriteBatches committed through this handle (the metrics read it)."""

    @classmethod
    def secondary(cls, path: Path, secondary_path: Path) -> MailboxStore:
        """A read-only view of a store another process has open (see the module docstring)."""
        if not path.is_dir():
            raise FileNotFoundError(f"no mailbox store at {path}")
        return cls(path, secondary_path=secondary_path)

    # -- KVReader ------------------------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        value: bytes | None = self._db.get(key)
        return value

    def scan(self, prefix: bytes, start_key: bytes, reverse: bool) -> Iterator[tuple[bytes, bytes]]:
        """Pairs under ``prefix`` from ``start_key`` (inclusive), lazily (``ports.KVReader``)."""
        yield from prefix_scan(self._db, prefix, start_key, reverse)

    def internal_keys_skipped(self) -> int:
        """RocksDB's ``rocksdb.number.iter.skip`` ticker: internal keys iterators stepped over
        (tombstones and the versions they shadow). The read path takes its delta around one
        request as ``tombstones_scanned`` (spec 26.0 observation points). Iterators report on
        destruction, which ``prefix_scan`` does as soon as a scan ends."""
        text: str = self._options.get_statistics() or ""
        at = text.find(_ITER_SKIP)
        if at < 0:
            return 0
        line = text[at + len(_ITER_SKIP) :].split("\n", 1)[0]
        return int(line.rsplit(":", 1)[-1])

    # -- writes --------------------------------------------------------------------------------

    def apply(self, ops: Iterable[Op]) -> int:
        """Commit ``ops`` atomically as ONE WriteBatch; returns how many ops it held.

        A crash leaves the store either before or after the whole batch, which is what lets
        ``resume_offset`` re-read exactly what is missing (direction.md 4.2, I-12).
        """
        if self.read_only:
            raise PermissionError("a secondary MailboxStore is read-only")
        batch = rocksdict.WriteBatch(raw_mode=True)
        count = 0
        for key, value in ops:
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
            count += 1
        if count:
            self._db.write(batch)
            self.writes += 1
        return count

    # -- whole-store reads (audit, digest) -------------------------------------------------------

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every pair in key order (for ``store_digest``), lazily."""
        return self.scan(b"", b"", False)

    def close(self) -> None:
        self._db.close()
