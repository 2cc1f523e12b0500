"""Two implementations of the ordered key-value seam (``ports.KVReader``) the core uses.

:class:`Overlay` is a batch's view of the store: the committed state with the batch's own
writes laid over it. Materialization is a left fold over log records, and a later record of the
same batch must see what an earlier one wrote (a chunk completing a slice, a count raised twice)
while nothing reaches the store until the shell commits the whole batch as one WriteBatch
(direction.md 4.2). :meth:`Overlay.ops` is that WriteBatch: the net value of every key the
batch touched, sorted by key, so the op list is a function of (state, records) alone. Callers
finish a scan before writing through the overlay.

:class:`MemoryMailboxStore` is the in-memory store for tests, tools and the replay audit, with
storage access counters. Why count: spec 2.3 criterion 1 is stated at the storage layer ("one
PULL_MAILBOX reads <= 3 keys + 1 prefix seek; zero access to any other user_id prefix, asserted
via storage key access counters"); :class:`AccessLog` records every seek and every key a read
returned, so a test asserts the criterion on the real read path instead of trusting it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from qim.core.history.store import MemoryOrderedStore
from qim.core.mailbox.ports import KVReader, Op

__all__ = ["AccessLog", "MemoryMailboxStore", "Overlay"]


class Overlay:
    """:class:`KVReader` over ``base`` plus pending puts and deletes."""

    def __init__(self, base: KVReader) -> None:
        self._base = base
        self._writes: dict[bytes, bytes | None] = {}
        self._keys: list[bytes] = []

    def get(self, key: bytes) -> bytes | None:
        if key in self._writes:
            return self._writes[key]
        return self._base.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self._write(key, value)

    def delete(self, key: bytes) -> None:
        self._write(key, None)

    def _write(self, key: bytes, value: bytes | None) -> None:
        if key not in self._writes:
            bisect.insort(self._keys, key)
        self._writes[key] = value

    def ops(self) -> tuple[Op, ...]:
        """The batch as one ordered WriteBatch (each key once, ascending)."""
        return tuple((key, self._writes[key]) for key in self._keys)

    def scan(self, prefix: bytes, start_key: bytes, reverse: bool) -> Iterator[tuple[bytes, bytes]]:
        """Merge of the base scan and the pending writes; a pending delete hides a base key."""
        base = self._base.scan(prefix, start_key, reverse)
        mine = self._pending_keys(prefix, start_key, reverse)
        base_item = next(base, None)
        mine_key = next(mine, None)
        while base_item is not None or mine_key is not None:
            take_mine = base_item is None or (
                mine_key is not None
                and (mine_key >= base_item[0] if reverse else mine_key <= base_item[0])
            )
            if take_mine:
                assert mine_key is not None
                if base_item is not None and base_item[0] == mine_key:
                    base_item = next(base, None)
                value = self._writes[mine_key]
                if value is not None:
                    yield mine_key, value
                mine_key = next(mine, None)
            else:
                assert base_item is not None
                yield base_item
                base_item = next(base, None)

    def _pending_keys(self, prefix: bytes, start_key: bytes, reverse: bool) -> Iterator[bytes]:
        keys = self._keys
        if reverse:
            index = bisect.bisect_right(keys, start_key) - 1
            while index >= 0 and keys[index].startswith(prefix):
                yield keys[index]
                index -= 1
            return
        index = bisect.bisect_left(keys, max(start_key, prefix))
        while index < len(keys) and keys[index].startswith(prefix):
            yield keys[index]
            index += 1


@dataclass(slots=True)
class AccessLog:
    """Storage-level reads since the last :meth:`reset`."""

    seeks: int = 0
    gets: int = 0
    keys: list[bytes] = field(default_factory=list)
    """Every key a point read asked for or a scan returned, in order."""

    @property
    def key_reads(self) -> int:
        """Keys returned by scans plus point lookups (a seek that returns nothing reads none)."""
        return len(self.keys)

    def reset(self) -> None:
        self.seeks = 0
        self.gets = 0
        self.keys.clear()


class MemoryMailboxStore:
    """A sorted byte-keyed store implementing ``KVReader``; writes go through :meth:`apply`."""

    def __init__(self, items: Iterable[tuple[bytes, bytes]] = ()) -> None:
        self._store = MemoryOrderedStore(items)
        self.access = AccessLog()

    def get(self, key: bytes) -> bytes | None:
        self.access.gets += 1
        self.access.keys.append(key)
        return self._store.get(key)

    def scan(self, prefix: bytes, start_key: bytes, reverse: bool) -> Iterator[tuple[bytes, bytes]]:
        self.access.seeks += 1
        for key, value in self._store.scan(prefix, start_key, reverse):
            self.access.keys.append(key)
            yield key, value

    def apply(self, ops: Iterable[Op]) -> None:
        """Commit one WriteBatch (the shell does this atomically against RocksDB)."""
        for key, value in ops:
            if value is None:
                self._store.delete(key)
            else:
                self._store.put(key, value)

    def items(self) -> list[tuple[bytes, bytes]]:
        """Every pair in key order, without touching the access counters."""
        return list(self._store.scan(b"", b"", False))

    def __len__(self) -> int:
        return len(self._store)
