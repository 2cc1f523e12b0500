"""prefix_scan: complete under garbage-collector churn, and blind to the next prefix's tombstones.

Why these two: the scan bounds the RocksDB iterator at the prefix's end so a pull never walks a
trimmed neighbour's deletions (spec 26.1.1 ``tombstones_scanned == 0``), and rocksdict keeps only
a pointer to that bound -- a bound collected too early made scans stop at random.
"""

from __future__ import annotations

import gc
from pathlib import Path

from qim.tables.mailbox_store import MailboxStore


def _store(tmp_path: Path) -> MailboxStore:
    store = MailboxStore(tmp_path / "s")
    store.apply([(b"Ea\x00" + bytes([i]), b"v") for i in range(3)])
    store.apply([(b"Eb\x00" + bytes([i]), b"v") for i in range(50)])
    store.apply([(b"Eb\x00" + bytes([i]), None) for i in range(49)])  # a trimmed neighbour
    store.apply([(b"E\xff\xff", b"edge"), (b"F", b"next")])
    return store


def test_every_forward_scan_is_complete_under_gc_churn(tmp_path: Path) -> None:
    store = _store(tmp_path)
    try:
        for _ in range(60):  # a dropped bound cut 299 of 300 such scans short
            keys: list[bytes] = []
            for key, _value in store.scan(b"Ea\x00", b"Ea\x00", False):
                if not keys:
                    gc.collect(0)  # the young generation: where a dropped ReadOptions would be
                keys.append(key)
                _ = [bytes(64) for _ in range(64)]
            assert keys == [b"Ea\x00\x00", b"Ea\x00\x01", b"Ea\x00\x02"]
    finally:
        store.close()


def test_the_end_of_a_prefix_does_not_walk_the_next_prefixs_tombstones(tmp_path: Path) -> None:
    store = _store(tmp_path)
    try:
        before = store.internal_keys_skipped()
        assert len(list(store.scan(b"Ea\x00", b"Ea\x00", False))) == 3
        assert store.internal_keys_skipped() - before == 0
    finally:
        store.close()


def test_prefix_edges_and_reverse_scans(tmp_path: Path) -> None:
    store = _store(tmp_path)
    try:
        assert list(store.scan(b"E\xff", b"E\xff", False)) == [(b"E\xff\xff", b"edge")]
        reverse = [k for k, _ in store.scan(b"Ea\x00", b"Ea\x00\xff", True)]
        assert reverse == [b"Ea\x00\x02", b"Ea\x00\x01", b"Ea\x00\x00"]
        assert [k for k, _ in store.scan(b"", b"", False)][-1] == b"F"  # no bound, no prefix
    finally:
        store.close()
