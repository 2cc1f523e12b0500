"""Mailbox checkpoints (spec 19.3, 26.6.3): physical RocksDB checkpoints of one MailboxStore,
shipped to a checkpoint directory and restored on a node that takes the shard over on an empty
disk.

Why a checkpoint is bound to its log position and identity for free: the store keeps
DispatchProgress (``W[]``, ``W_floor[]``) and the bound log identity in the same database,
committed in the same WriteBatch as the entries, so a checkpoint is a consistent (entries,
position, identity) triple. Restoring it and resuming from its ``W[]`` replays only the log's
tail; a checkpoint of another dispatch log is refused by the takeover's identity check (17.2).

Why a directory: 19.3.1 stores checkpoints in object storage, keyed ``(mailbox_shard_id,
shard_epoch, checkpoint_id)`` and immutable. Here that is ``<root>/shard-<s>/<checkpoint_id>``
on a filesystem every MailboxNode mounts (``QIM_MAILBOX_CHECKPOINT_DIR``); the local stack uses
a folder under ``.run``. ``checkpoint_id`` is the shard's ``applied_seq`` (epoch and offset in
one sortable u64), so the newest checkpoint is the largest name. A checkpoint appears only
complete (written under a temporary name, then renamed). SST files are immutable, so one that
the previous shipped checkpoint already holds is hard-linked from it instead of copied: the
"full baseline + incrementals" of 19.3.1 with the filesystem keeping the shared files once.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import rocksdict

from qim.tables.mailbox_store import MailboxStore

__all__ = [
    "MANIFEST",
    "ShippedCheckpoint",
    "create_checkpoint",
    "latest_checkpoint",
    "restore_checkpoint",
    "ship_checkpoint",
]

MANIFEST: Final = "qim-checkpoint.json"
_TMP: Final = ".tmp-"


def create_checkpoint(store: MailboxStore, dest: Path) -> Path:
    """Write a physical checkpoint of ``store`` into ``dest`` (which must not exist yet).

    On the store's own filesystem RocksDB hard-links the SST files, so this is fast and may run
    between two WriteBatches on the event loop.
    """
    if store.read_only:
        raise ValueError("a secondary store cannot be checkpointed")
    db: Any = store._db
    dest.parent.mkdir(parents=True, exist_ok=True)
    rocksdict.Checkpoint(db).create_checkpoint(str(dest))
    return dest


@dataclass(frozen=True, slots=True)
class ShippedCheckpoint:
    """One complete checkpoint in the checkpoint directory."""

    path: Path
    shard: int
    checkpoint_id: int
    shard_epoch: int
    files: int
    bytes: int
    linked: int
    """Files hard-linked from the previous checkpoint (not copied again)."""


def _shard_dir(root: Path, shard: int) -> Path:
    return root / f"shard-{shard}"


def _complete(root: Path, shard: int) -> list[tuple[int, Path]]:
    base = _shard_dir(root, shard)
    if not base.is_dir():
        return []
    out = []
    for child in base.iterdir():
        if child.name.isdigit() and (child / MANIFEST).is_file():
            out.append((int(child.name), child))
    return sorted(out)


def latest_checkpoint(root: Path, shard: int) -> ShippedCheckpoint | None:
    """The newest complete checkpoint of ``shard`` under ``root``, or None."""
    found = _complete(root, shard)
    if not found:
        return None
    return _read_manifest(found[-1][1])


def _read_manifest(path: Path) -> ShippedCheckpoint:
    data = json.loads((path / MANIFEST).read_text())
    return ShippedCheckpoint(
        path=path,
        shard=int(data["shard"]),
        checkpoint_id=int(data["checkpoint_id"]),
        shard_epoch=int(data["shard_epoch"]),
        files=int(data["files"]),
        bytes=int(data["bytes"]),
        linked=int(data.get("linked", 0)),
    )


def ship_checkpoint(
    staged: Path, root: Path, *, shard: int, checkpoint_id: int, shard_epoch: int, keep: int = 2
) -> ShippedCheckpoint:
    """Move the local checkpoint ``staged`` into ``root`` as ``shard``'s ``checkpoint_id``.

    Blocking file I/O: run it in a thread. ``staged`` is removed. Keeps the ``keep`` newest
    checkpoints of the shard. An id already shipped is left as it is (the same id is the same
    state: the fold is deterministic).
    """
    base = _shard_dir(root, shard)
    base.mkdir(parents=True, exist_ok=True)
    final = base / f"{checkpoint_id:020d}"
    if (final / MANIFEST).is_file():
        shutil.rmtree(staged, ignore_errors=True)
        return _read_manifest(final)
    previous = _complete(root, shard)
    prev_dir = previous[-1][1] if previous else None
    tmp = base / f"{_TMP}{checkpoint_id:020d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    files = linked = size = 0
    for src in sorted(staged.iterdir()):
        dst = tmp / src.name
        old = None if prev_dir is None else prev_dir / src.name
        if (
            src.suffix == ".sst"
            and old is not None
            and old.is_file()
            and old.stat().st_size == src.stat().st_size
        ):
            os.link(old, dst)
            linked += 1
        else:
            shutil.copyfile(src, dst)
        files += 1
        size += dst.stat().st_size
    manifest = {
        "shard": shard,
        "checkpoint_id": checkpoint_id,
        "shard_epoch": shard_epoch,
        "files": files,
        "bytes": size,
        "linked": linked,
    }
    with open(tmp / MANIFEST, "w") as fh:
        json.dump(manifest, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.rename(tmp, final)
    shutil.rmtree(staged, ignore_errors=True)
    for _, old_dir in _complete(root, shard)[:-keep] if keep > 0 else []:
        shutil.rmtree(old_dir, ignore_errors=True)
    for stale in base.glob(f"{_TMP}*"):
        if stale != tmp:
            shutil.rmtree(stale, ignore_errors=True)
    return _read_manifest(final)


def restore_checkpoint(checkpoint: ShippedCheckpoint, dest: Path) -> Path:
    """Copy ``checkpoint`` into ``dest`` (absent or empty) as a store to open; blocking."""
    if dest.exists():
        if any(dest.iterdir()):
            raise FileExistsError(f"{dest} is not empty: a checkpoint restores only onto nothing")
        dest.rmdir()
    tmp = dest.with_name(f"{_TMP}{dest.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(checkpoint.path, tmp, ignore=shutil.ignore_patterns(MANIFEST))
    os.rename(tmp, dest)
    return dest
