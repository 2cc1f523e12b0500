"""History core: MessageRecord keys and values, PULL_HISTORY paging, the HistoryArchiver.

Pure (no I/O): storage is reached through :class:`OrderedReader` / :class:`OrderedWriter`; the
conversation app adapts RocksDB to them, tests use :class:`MemoryOrderedStore`.
"""

from qim.core.history.archiver import (
    AMEND_CUSTOM_TYPE,
    AmendControl,
    ArchiveWrite,
    amend_control_record,
    archive_batch,
    control_message_record,
    message_record,
    write_all,
)
from qim.core.history.keys import (
    MESSAGE_KEYSPACE,
    conversation_prefix,
    message_key,
    seq_bytes,
    seq_from_key,
)
from qim.core.history.paging import (
    FULL_INTERVAL,
    HistoryBounds,
    HistoryLimits,
    InvalidHistoryRequest,
    VisibleInterval,
    bounds_from_store,
    pull_history,
)
from qim.core.history.records import (
    DekId,
    MessageRecord,
    MessageState,
    decode_message_record,
    encode_message_record,
    mark_deleted,
    mark_edited,
    mark_recalled,
    to_history_message,
)
from qim.core.history.store import MemoryOrderedStore, OrderedReader, OrderedWriter

__all__ = [
    "AMEND_CUSTOM_TYPE",
    "FULL_INTERVAL",
    "MESSAGE_KEYSPACE",
    "AmendControl",
    "ArchiveWrite",
    "DekId",
    "HistoryBounds",
    "HistoryLimits",
    "InvalidHistoryRequest",
    "MemoryOrderedStore",
    "MessageRecord",
    "MessageState",
    "OrderedReader",
    "OrderedWriter",
    "VisibleInterval",
    "amend_control_record",
    "archive_batch",
    "bounds_from_store",
    "control_message_record",
    "conversation_prefix",
    "decode_message_record",
    "encode_message_record",
    "mark_deleted",
    "mark_edited",
    "mark_recalled",
    "message_key",
    "message_record",
    "pull_history",
    "seq_bytes",
    "seq_from_key",
    "to_history_message",
    "write_all",
]
