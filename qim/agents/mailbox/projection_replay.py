"""The topology replay of the session projections of one MailboxShard (issue 7, spec 7.6-7.7).

Why: ``UserSessionProjection`` and ``UserBadgeState`` are derived -- "droppable and rebuildable
from the mailbox plus UserConversationState" (7.5 is the authority). This proves it for a live
shard, or repairs a stopped one:

* check (default): open the live store as a RocksDB *secondary*, rebuild every user's
  projection from their retained entries and 7.5 states (``rebuild_user``, the same fold the
  node runs) and compare what a device sees -- every row's counts, order keys and exactness,
  the badge -- with what the node keeps (version stamps aside, :func:`_content`);
* ``apply``: on a store no worker holds, drop and rebuild every user's projection in one
  WriteBatch per user (``rebuild_ops``), then check again.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from qim.agents.mailbox.options import MailboxOptions
from qim.core.mailbox.ports import KVReader
from qim.core.mailbox.session_store import PROJECTION, load_projection
from qim.core.mailbox.sessions import rebuild_ops, rebuild_user
from qim.core.session_list.rows import SessionRow, UserProjection
from qim.tables.mailbox_store import MailboxStore

__all__ = ["ProjectionReport", "replay_projections"]

Progress = Callable[[int, int], None]
_MAX_DIFFS = 20


@dataclass(frozen=True)
class ProjectionReport:
    shard: int
    users: int
    applied: bool
    differences: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences

    def lines(self) -> list[str]:
        verdict = "identical" if self.ok else "DIFFERENT"
        action = "rebuilt and checked" if self.applied else "checked"
        return [f"shard {self.shard}: {self.users} users {action}: {verdict}", *self.differences]


def _users(kv: KVReader) -> Iterator[tuple[str, str]]:
    """Every (tenant, user) with a projection header (``J tenant 00 user``)."""
    for key, _ in kv.scan(PROJECTION, PROJECTION, False):
        tenant, _, user = key[len(PROJECTION) :].partition(b"\x00")
        yield tenant.decode("utf-8"), user.decode("utf-8")


def _content(p: UserProjection) -> tuple[dict[str, SessionRow], tuple[int, int, int]]:
    """What a device sees: rows and badge counts, without the version stamps (a rebuild
    re-stamps each row at the entry that last changed it, which may precede a state command
    the live fold stamped it with; deltas after the rebuild carry newer stamps anyway)."""
    rows = {c: msgspec.structs.replace(r, projection_mailbox_seq=0) for c, r in p.rows.items()}
    return rows, (p.badge.total_unread, p.badge.total_mention, p.badge.muted_unread)


def _compare(
    kv: KVReader, options: MailboxOptions, shard: int, progress: Progress | None
) -> tuple[int, list[str]]:
    config = options.config(shard)
    users = list(_users(kv))
    differences: list[str] = []
    for n, (tenant, user) in enumerate(users, 1):
        live = _content(load_projection(kv, tenant, user))
        rebuilt = _content(rebuild_user(kv, tenant, user, config.session_list, config.lane_count))
        if live != rebuilt:
            changed = sorted(
                c for c in live[0].keys() | rebuilt[0].keys() if live[0].get(c) != rebuilt[0].get(c)
            )
            badge = "" if live[1] == rebuilt[1] else f"; badge {live[1]} != {rebuilt[1]}"
            differences.append(f"{tenant}/{user}: rows differ {changed[:5]}{badge}")
        if progress is not None:
            progress(n, len(users))
    return len(users), differences[:_MAX_DIFFS]


def replay_projections(
    options: MailboxOptions, shard: int, *, apply: bool = False, progress: Progress | None = None
) -> ProjectionReport:
    """Check (or, with ``apply``, rebuild then check) every projection of ``shard``."""
    path = options.store_path(shard)
    if apply:
        store = MailboxStore(path, options.store_caps)  # fails while a worker holds the store
        try:
            config = options.config(shard)
            for tenant, user in list(_users(store)):
                store.apply(
                    rebuild_ops(store, tenant, user, config.session_list, config.lane_count)
                )
            users, differences = _compare(store, options, shard, progress)
        finally:
            store.close()
        return ProjectionReport(shard, users, True, differences)
    with tempfile.TemporaryDirectory(prefix="qim-projection-secondary-") as secondary:
        live = MailboxStore.secondary(path, Path(secondary))
        try:
            users, differences = _compare(live, options, shard, progress)
        finally:
            live.close()
    return ProjectionReport(shard, users, False, differences)
