"""The RocksDB MessageStore keeps the history core's scan contract and its applied offset.

Invariant: for any keys, prefix, start key and direction, ``MessageStore.scan`` yields exactly
what ``MemoryOrderedStore.scan`` (the reference of ``qim.core.history.store``) yields.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qim.core.history import ArchiveWrite, MemoryOrderedStore
from qim.tables.message_store import MessageStore

keys = st.lists(st.sampled_from(b"mab\x00\xff"), max_size=4).map(bytes)


@settings(max_examples=60, deadline=None)
@given(
    stored=st.lists(keys.map(lambda k: b"m" + k), max_size=30, unique=True),
    prefix=keys.map(lambda k: b"m" + k[:2]),
    start=keys.map(lambda k: b"m" + k),
    reverse=st.booleans(),
)
def test_scan_matches_the_reference_store(
    tmp_path_factory: pytest.TempPathFactory,
    stored: list[bytes],
    prefix: bytes,
    start: bytes,
    reverse: bool,
) -> None:
    reference = MemoryOrderedStore((k, k[::-1]) for k in stored)
    store = MessageStore(tmp_path_factory.mktemp("scan") / "db")
    try:
        for key in stored:
            store.put(key, key[::-1])
        assert list(store.scan(prefix, start, reverse)) == list(
            reference.scan(prefix, start, reverse)
        )
    finally:
        store.close()


def test_commit_writes_rows_participants_and_the_offset_together(tmp_path: Path) -> None:
    store = MessageStore(tmp_path / "db")
    assert store.applied_offset == -1
    store.commit([ArchiveWrite(b"m1", b"v1")], [("acme", "d:x", ("alice", "bob"))], 4)
    with pytest.raises(ValueError, match="applied"):
        store.commit([], [], 4)
    store.close()

    reopened = MessageStore(tmp_path / "db")
    assert reopened.applied_offset == 4
    assert reopened.get(b"m1") == b"v1"
    assert reopened.participants("acme", "d:x") == ("alice", "bob")
    assert reopened.participants("other", "d:x") is None
    assert list(reopened.scan(b"m", b"m", False)) == [(b"m1", b"v1")]
    reopened.close()


def test_a_half_read_scan_does_not_keep_the_database_locked(tmp_path: Path) -> None:
    store = MessageStore(tmp_path / "db")
    for i in range(3):
        store.put(b"m" + bytes([i]), b"v")
    scan = store.scan(b"m", b"m", False)
    next(scan)
    scan.close()
    store.close()
    MessageStore(tmp_path / "db").close()
