"""What every rocksdict-backed store of qim does the same way."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def prefix_scan(
    db: Any, prefix: bytes, start_key: bytes, reverse: bool
) -> Iterator[tuple[bytes, bytes]]:
    """Pairs under ``prefix`` from ``start_key`` (inclusive) in key order, lazily.

    The iterator is dropped when the scan ends: an open rocksdict iterator pins the database,
    so ``close()`` could not release its lock.
    """
    it = db.iter()
    try:
        if reverse:
            it.seek_for_prev(start_key)
        else:
            it.seek(max(start_key, prefix))
        while it.valid():
            key: bytes = it.key()
            if not key.startswith(prefix):
                return
            yield key, it.value()
            if reverse:
                it.prev()
            else:
                it.next()
    finally:
        del it
