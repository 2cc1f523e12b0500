"""Mailbox checkpoints: taken, shipped (SSTs shared with the previous one), pruned, restored."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qim.agents.mailbox.options import MailboxOptions
from qim.agents.mailbox.takeover import restore_shard
from qim.bench.scenarios.checkpoint import CheckpointParams, run_checkpoint
from qim.core.sync import CursorKey, CursorKeyRing
from qim.params import Settings
from qim.tables.mailbox_checkpoint import (
    MANIFEST,
    create_checkpoint,
    latest_checkpoint,
    restore_checkpoint,
    ship_checkpoint,
)
from qim.tables.mailbox_store import MailboxStore


def test_checkpoint_reopens_with_the_rows_written_before_it_and_none_after(tmp_path: Path) -> None:
    store = MailboxStore(tmp_path / "live")
    store.apply([(b"a", b"1"), (b"b", b"2")])
    create_checkpoint(store, tmp_path / "ckpt")
    store.apply([(b"c", b"3")])
    store.close()
    restored = MailboxStore(tmp_path / "ckpt")
    try:
        assert list(restored.items()) == [(b"a", b"1"), (b"b", b"2")]
    finally:
        restored.close()


def _ship(store: MailboxStore, tmp: Path, root: Path, cid: int, keep: int = 2) -> Path:
    staged = create_checkpoint(store, tmp / f"staged-{cid}")
    shipped = ship_checkpoint(staged, root, shard=3, checkpoint_id=cid, shard_epoch=1, keep=keep)
    assert not staged.exists()
    assert shipped.checkpoint_id == cid and shipped.shard == 3 and shipped.files > 0
    return shipped.path


def test_the_newest_shipped_checkpoint_restores_the_state_it_was_taken_at(tmp_path: Path) -> None:
    root = tmp_path / "remote"
    assert latest_checkpoint(root, 3) is None
    store = MailboxStore(tmp_path / "live")
    store.apply([(b"k%04d" % i, b"v" * 100) for i in range(500)])
    _ship(store, tmp_path, root, 10)
    store.apply([(b"later", b"x")])
    _ship(store, tmp_path, root, 20)
    store.apply([(b"after-the-last", b"y")])
    expected = [kv for kv in store.items() if kv[0] != b"after-the-last"]
    store.close()

    newest = latest_checkpoint(root, 3)
    assert newest is not None and newest.checkpoint_id == 20
    dest = restore_checkpoint(newest, tmp_path / "fresh" / "shard-3")
    assert not (dest / MANIFEST).exists()
    restored = MailboxStore(dest)
    try:
        assert list(restored.items()) == expected
    finally:
        restored.close()
    assert latest_checkpoint(root, 4) is None  # another shard has none


def test_unchanged_sst_files_are_linked_from_the_previous_checkpoint_not_copied(
    tmp_path: Path,
) -> None:
    root = tmp_path / "remote"
    store = MailboxStore(tmp_path / "live")
    store.apply([(b"k%04d" % i, b"v" * 100) for i in range(500)])
    first = _ship(store, tmp_path, root, 1)
    store.apply([(b"more", b"z")])
    second = _ship(store, tmp_path, root, 2)
    store.close()
    shared = [
        f.name
        for f in first.iterdir()
        if f.suffix == ".sst" and (second / f.name).exists()
        and os.stat(f).st_ino == os.stat(second / f.name).st_ino
    ]  # fmt: skip
    assert shared, "the first checkpoint's SST should be shared by the second"
    newest = latest_checkpoint(root, 3)
    assert newest is not None and newest.linked == len(shared)


def test_only_the_newest_keep_checkpoints_stay(tmp_path: Path) -> None:
    root = tmp_path / "remote"
    store = MailboxStore(tmp_path / "live")
    for cid in (1, 2, 3, 4):
        store.apply([(b"k%d" % cid, b"v")])
        _ship(store, tmp_path, root, cid, keep=2)
    store.close()
    names = sorted(p.name for p in (root / "shard-3").iterdir())
    assert names == [f"{3:020d}", f"{4:020d}"]


def test_a_checkpoint_never_restores_over_an_existing_store(tmp_path: Path) -> None:
    root = tmp_path / "remote"
    store = MailboxStore(tmp_path / "live")
    store.apply([(b"a", b"1")])
    _ship(store, tmp_path, root, 5)
    store.close()
    newest = latest_checkpoint(root, 3)
    assert newest is not None
    with pytest.raises(FileExistsError):
        restore_checkpoint(newest, tmp_path / "live")


def test_a_half_shipped_checkpoint_is_not_a_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "remote"
    (root / "shard-3" / f".tmp-{9:020d}-1").mkdir(parents=True)
    (root / "shard-3" / f"{9:020d}").mkdir()  # renamed without a manifest: never ours
    assert latest_checkpoint(root, 3) is None


def test_restore_shard_fills_only_an_empty_store_path_from_the_newest_checkpoint(
    tmp_path: Path,
) -> None:

    root = tmp_path / "remote"
    options = MailboxOptions(
        bootstrap="127.0.0.1:1",
        datadir=tmp_path / "data",
        settings=Settings.load(env={}),
        cursor_keys=CursorKeyRing([CursorKey("k", b"0" * 32)]),
        checkpoint_dir=root,
    )
    assert restore_shard(options, 3) is None  # nothing shipped yet
    store = MailboxStore(tmp_path / "live")
    store.apply([(b"a", b"1")])
    _ship(store, tmp_path, root, 7)
    store.close()
    assert restore_shard(options, 3) is not None
    restored = MailboxStore(options.store_path(3))
    try:
        assert list(restored.items()) == [(b"a", b"1")]
    finally:
        restored.close()
    assert restore_shard(options, 3) is None  # a local store exists: it wins
    other_epoch = MailboxOptions(**{**options.__dict__, "shard_epoch": 2})
    (tmp_path / "data2").mkdir()
    assert (
        restore_shard(MailboxOptions(**{**other_epoch.__dict__, "datadir": tmp_path / "data2"}), 3)
        is None
    )


def test_the_checkpoint_bench_restores_a_store_it_built(tmp_path: Path) -> None:

    out = run_checkpoint(CheckpointParams(entries=2000, members=200, tail=2), tmp_path)
    row = out["row"]
    assert row["entries"] == 2000 and row["tail_entries"] == 400
    assert row["checkpoint_mib"] > 0 and row["restore_s"] > 0 and row["tail_s"] > 0
    assert list(tmp_path.iterdir()) == []  # its folders are removed
