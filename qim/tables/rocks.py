"""What every rocksdict-backed store of qim does the same way."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import rocksdict


def _successor(prefix: bytes) -> bytes | None:
    """The smallest key above every key that starts with ``prefix`` (None: there is none)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


def prefix_scan(
    db: Any, prefix: bytes, start_key: bytes, reverse: bool
) -> Iterator[tuple[bytes, bytes]]:
    """Pairs under ``prefix`` from ``start_key`` (inclusive) in key order, lazily.

    The iterator is dropped when the scan ends: an open rocksdict iterator pins the database,
    so ``close()`` could not release its lock.
    """
    # A forward scan is bounded at the prefix's end: unbounded, the step past the last key of
    # the prefix walks every deletion (tombstone) of the next prefix before it finds a live key,
    # so a trimmed neighbour would cost each pull of this user (spec 26.1.1 tombstones_scanned).
    # ``options`` must outlive the iterator: rocksdict keeps only a pointer to the bound (a
    # collected ReadOptions made scans stop early at random). Reverse scans stay unbounded:
    # rocksdict 0.3.29's iterate_lower_bound returned nothing with seek_for_prev.
    options = rocksdict.ReadOptions()
    upper = None if reverse else _successor(prefix)
    if upper is not None:
        options.set_iterate_upper_bound(upper)
    it = db.iter(options)
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
        del options  # only now: the iterator held a pointer into it
