"""Mailbox checkpoints (spec 19.3, 26.6.3): a physical RocksDB checkpoint of one MailboxStore.

Why a checkpoint is bound to its log position and identity for free: the store keeps
DispatchProgress (``W[]``, ``W_floor[]``) and the bound log identity in the same database,
committed in the same WriteBatch as the entries, so a checkpoint taken between two batches is a
consistent (entries, position, identity) triple. Restoring it on an empty disk and resuming
from its ``W[]`` replays only the log's tail. Wiring into takeover is not done yet (issue 18).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import rocksdict

from qim.tables.mailbox_store import MailboxStore

__all__ = ["create_checkpoint"]


def create_checkpoint(store: MailboxStore, dest: Path) -> Path:
    """Write a physical checkpoint of ``store`` into ``dest`` (which must not exist yet)."""
    if store.read_only:
        raise ValueError("a secondary store cannot be checkpointed")
    db: Any = store._db
    dest.parent.mkdir(parents=True, exist_ok=True)
    rocksdict.Checkpoint(db).create_checkpoint(str(dest))
    return dest
