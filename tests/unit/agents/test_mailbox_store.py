"""The RocksDB MailboxStore keeps the core's KVReader contract and commits one WriteBatch.

Invariants: ``scan`` yields exactly what the core's in-memory reference store yields for any
keys, prefix, start key and direction; folding the same dispatch log into either store gives
byte-identical contents (direction.md 4.2); a secondary view reads a live store and cannot
write it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qim.agents.mailbox.shard import ShardStore
from qim.core.mailbox import MemoryMailboxStore, materialize, store_digest
from qim.schemas.records.dispatch import DispatchLogRecord
from qim.tables.mailbox_store import MailboxStore
from tests.unit.mailbox.support import (
    CONFIG,
    Log,
    dispatch,
    group_slice,
    local_users,
    numbered,
)

keys = st.lists(st.sampled_from(b"EMab\x00\xff"), max_size=4).map(bytes)


@settings(max_examples=60, deadline=None)
@given(
    stored=st.lists(keys, max_size=30, unique=True),
    prefix=keys.map(lambda k: k[:2]),
    start=keys,
    reverse=st.booleans(),
)
def test_scan_matches_the_core_reference_store(
    tmp_path_factory: pytest.TempPathFactory,
    stored: list[bytes],
    prefix: bytes,
    start: bytes,
    reverse: bool,
) -> None:
    rocks = MailboxStore(tmp_path_factory.mktemp("scan") / "db")
    try:
        reference = MemoryMailboxStore()
        ops = [(k, b"v" + k) for k in stored]
        rocks.apply(ops)
        reference.apply(ops)
        expected = list(reference.scan(prefix, start, reverse))
        assert list(rocks.scan(prefix, start, reverse)) == expected
    finally:
        rocks.close()


def _log() -> Log:
    users = local_users(30)
    members = [(u, 0) for u in users]
    records: list[DispatchLogRecord] = [*group_slice("g:1", 1, members, chunk=7)]
    records.append(dispatch(1, conversation="g:1", kind="group", version=1, sender=users[0]))
    for n in range(2, 40):
        pair = sorted((users[n % 30], users[(n * 7 + 3) % 30]))
        records.append(dispatch(n, conversation=f"d:{n}", sender=pair[0], participants=pair))
    return numbered(records)


def test_same_log_gives_byte_identical_rocksdb_and_memory_stores(tmp_path: Path) -> None:
    log = _log()
    rocks = MailboxStore(tmp_path / "db")
    memory = MemoryMailboxStore()
    stores: tuple[ShardStore, ...] = (rocks, memory)
    try:
        for cut in range(0, len(log), 9):  # batches of 9: one WriteBatch per materialize call
            batch = log[cut : cut + 9]
            for store in stores:
                result = materialize(store, batch, shard_epoch=1, config=CONFIG)
                store.apply(result.ops)
        assert rocks.writes == len(range(0, len(log), 9))
        assert store_digest(rocks.items()) == store_digest(memory.items())
        assert len(list(rocks.items())) == len(memory)
    finally:
        rocks.close()


def test_apply_deletes_and_an_empty_batch_writes_nothing(tmp_path: Path) -> None:
    store = MailboxStore(tmp_path / "db")
    try:
        assert store.apply([(b"a", b"1"), (b"b", b"2")]) == 2
        assert store.apply([(b"a", None)]) == 1
        assert store.apply([]) == 0
        assert store.writes == 2
        assert list(store.items()) == [(b"b", b"2")]
    finally:
        store.close()


def test_secondary_reads_the_live_store_and_refuses_writes(tmp_path: Path) -> None:
    live = MailboxStore(tmp_path / "db")
    try:
        live.apply([(b"k", b"v")])
        view = MailboxStore.secondary(tmp_path / "db", tmp_path / "secondary")
        try:
            assert view.get(b"k") == b"v"
            with pytest.raises(PermissionError):
                view.apply([(b"x", b"y")])
        finally:
            view.close()
    finally:
        live.close()
    with pytest.raises(FileNotFoundError):
        MailboxStore.secondary(tmp_path / "missing", tmp_path / "secondary2")
