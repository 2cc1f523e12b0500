"""The live MailboxStores an audit reads: RocksDB secondaries of every worker's datadir.

Why secondaries (``qim.ops.audit`` step 5): a running MailboxNode holds the primary's lock; a
secondary instance takes none and sees a consistent view as of its open. Each shard is reopened
until the store that folded furthest (the current owner's; a worker that lost the shard keeps a
stale copy) has folded its dispatch partition up to the audit's target offset.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from qim.core.mailbox.keys import META
from qim.core.mailbox.values import ShardMeta, decode_value
from qim.schemas.seqs import split_mailbox_seq
from qim.tables.mailbox_store import MailboxStore

__all__ = ["LiveStores"]


def _applied(store: MailboxStore, epoch: int) -> int:
    raw = store.get(META)
    if raw is None:
        return -1
    seq = decode_value(raw, ShardMeta).applied_seq
    parts = split_mailbox_seq(seq)
    return parts.log_offset if seq and parts.shard_epoch == epoch else -1


class LiveStores:
    """Secondary views of the candidate stores, reopened until each shard has caught up."""

    def __init__(self, datadirs: Sequence[Path], shard_epoch: int, scratch: Path) -> None:
        self.datadirs = tuple(datadirs)
        self.shard_epoch = shard_epoch
        self.scratch = scratch
        self.open: dict[int, MailboxStore] = {}
        self._opened = 0

    def _best(self, shard: int) -> tuple[int, MailboxStore | None]:
        best: tuple[int, MailboxStore | None] = (-1, None)
        for datadir in self.datadirs:
            path = datadir / "mailbox" / f"shard-{shard}"
            if not path.is_dir():
                continue
            self._opened += 1
            store = MailboxStore.secondary(path, self.scratch / str(self._opened))
            applied = _applied(store, self.shard_epoch)
            if best[1] is None or applied > best[0]:
                if best[1] is not None:
                    best[1].close()
                best = (applied, store)
            else:
                store.close()
        return best

    def refresh(self, targets: dict[int, int]) -> dict[int, int]:
        """Reopen every shard not yet at its target; returns the lagging ``{shard: applied}``."""
        lagging: dict[int, int] = {}
        shards = set(targets) | {
            int(p.name.removeprefix("shard-"))
            for d in self.datadirs
            if (d / "mailbox").is_dir()
            for p in (d / "mailbox").iterdir()
            if p.name.startswith("shard-")
        }
        for shard in sorted(shards):
            target = targets.get(shard, -1)
            if shard in self.open:
                if _applied(self.open[shard], self.shard_epoch) >= target:
                    continue
                self.open.pop(shard).close()
            applied, store = self._best(shard)
            if store is not None:
                self.open[shard] = store
            if applied < target:
                lagging[shard] = applied
        return lagging

    def close(self) -> None:
        for store in self.open.values():
            store.close()
        self.open.clear()
