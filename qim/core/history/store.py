"""The ordered key-value seam the history core reads and writes through.

Why a Protocol and not rocksdict: the core stays pure (style item 1); the conversation app
adapts a RocksDB handle (``rocksdict.Rdict`` iterators seek and walk both ways), tests use
:class:`MemoryOrderedStore`. The contract is the one RocksDB gives:

``scan(prefix, start_key, reverse)`` yields ``(key, value)`` pairs whose key starts with
``prefix``, in ascending key order from the first key ``>= start_key``, or -- with
``reverse`` -- in descending order from the last key ``<= start_key``. It stops at the end of
the prefix. Iteration is lazy, so a page reads only what it returns plus one look-ahead.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from typing import Protocol

__all__ = ["MemoryOrderedStore", "OrderedReader", "OrderedWriter"]


class OrderedReader(Protocol):
    """Range reads over byte-ordered keys (see the module docstring for the bounds)."""

    def scan(self, prefix: bytes, start_key: bytes, reverse: bool) -> Iterator[tuple[bytes, bytes]]:
        """Pairs under ``prefix`` from ``start_key`` (inclusive) in the given direction."""
        ...


class OrderedWriter(Protocol):
    """Blind puts and deletes, the only writes the HistoryArchiver needs (spec 7.4: no LWT on
    the path; a delete is a recalled message's reactions, 13.6.4)."""

    def put(self, key: bytes, value: bytes) -> None:
        """Insert or overwrite ``key``."""
        ...

    def delete(self, key: bytes) -> None:
        """Remove ``key`` if present."""
        ...


class MemoryOrderedStore:
    """A sorted in-memory store with the RocksDB scan contract, for tests and tools."""

    def __init__(self, items: Iterable[tuple[bytes, bytes]] = ()) -> None:
        self._keys: list[bytes] = []
        self._values: dict[bytes, bytes] = {}
        for key, value in items:
            self.put(key, value)

    def put(self, key: bytes, value: bytes) -> None:
        if key not in self._values:
            bisect.insort(self._keys, key)
        self._values[key] = value

    def get(self, key: bytes) -> bytes | None:
        return self._values.get(key)

    def delete(self, key: bytes) -> None:
        if self._values.pop(key, None) is not None:
            del self._keys[bisect.bisect_left(self._keys, key)]

    def __len__(self) -> int:
        return len(self._keys)

    def scan(self, prefix: bytes, start_key: bytes, reverse: bool) -> Iterator[tuple[bytes, bytes]]:
        if reverse:
            index = bisect.bisect_right(self._keys, start_key) - 1
            while index >= 0 and self._keys[index].startswith(prefix):
                key = self._keys[index]
                yield key, self._values[key]
                index -= 1
            return
        index = bisect.bisect_left(self._keys, max(start_key, prefix))
        while index < len(self._keys) and self._keys[index].startswith(prefix):
            key = self._keys[index]
            yield key, self._values[key]
            index += 1
