"""MailboxNode core: materialize the dispatch log into one shard's mailbox store (spec 6.5-6.8,
7.3, 7.8, 9.2, 10.1, 10.4, 18.3; seed 003).

Pure (no I/O, no clock, no randomness, no unordered iteration). The mailbox app's agent reads a
batch of its dispatch partition, calls :func:`materialize` against a :class:`KVReader` view of
the shard's RocksDB, commits the returned ops as ONE WriteBatch, then publishes the returned
``W[]``. A restart resumes at :func:`resume_offset`. :func:`retention_sweep` trims by log
time. Reads go through :class:`MailboxReader` (:class:`StoreMailboxReader`). :func:`replay`
and :func:`store_digest` are the byte-identical rebuild reference. Key layout: ``keys``.
"""

from qim.core.mailbox.config import DAY_MS, MailboxConfig
from qim.core.mailbox.expand import EntryRow, entries_by_user
from qim.core.mailbox.kvstore import AccessLog, MemoryMailboxStore
from qim.core.mailbox.lanes import (
    LaneHold,
    advance_watermarks,
    raise_floor,
    refused_lanes,
    resume_offset,
)
from qim.core.mailbox.materialize import materialize
from qim.core.mailbox.ports import EventGroup, KVReader, MailboxReader, Op
from qim.core.mailbox.reader import StoreMailboxReader, join_bodies, sync_entry
from qim.core.mailbox.replay import (
    commit,
    diff_stores,
    replay,
    resume_from,
    store_bytes,
    store_digest,
)
from qim.core.mailbox.result import (
    FIRST_SHARD_EPOCH,
    METRICS,
    MaterializeResult,
    PendingDispatch,
    WrittenGroup,
)
from qim.core.mailbox.retention import SweepResult, expiry_at, retention_sweep, trim_user
from qim.core.mailbox.slicestore import SliceCache
from qim.core.mailbox.values import StoredBody, StoredEntry, TrimState

__all__ = [
    "DAY_MS",
    "FIRST_SHARD_EPOCH",
    "METRICS",
    "AccessLog",
    "EntryRow",
    "EventGroup",
    "KVReader",
    "LaneHold",
    "MailboxConfig",
    "MailboxReader",
    "MaterializeResult",
    "MemoryMailboxStore",
    "Op",
    "PendingDispatch",
    "SliceCache",
    "StoreMailboxReader",
    "StoredBody",
    "StoredEntry",
    "SweepResult",
    "TrimState",
    "WrittenGroup",
    "advance_watermarks",
    "commit",
    "diff_stores",
    "entries_by_user",
    "expiry_at",
    "join_bodies",
    "materialize",
    "raise_floor",
    "refused_lanes",
    "replay",
    "resume_from",
    "resume_offset",
    "retention_sweep",
    "store_bytes",
    "store_digest",
    "sync_entry",
    "trim_user",
]
