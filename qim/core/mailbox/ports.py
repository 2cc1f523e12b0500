"""The seams of the mailbox core: the ordered key-value view it reads, the ops it returns, and
the read interface the login sync (``qim.core.sync``) pages through.

Why Protocols and plain op lists (style.md item 1, 3): the core imports no rocksdict. The
mailbox app adapts one RocksDB per MailboxShard to :class:`KVReader` (``get`` and a bounded
prefix iterator), commits the returned :data:`Op` list as one ``WriteBatch``, and hands a
:class:`MailboxReader` over the same handle to the sync code. Tests and the replay reference
use the in-memory store of ``qim.core.mailbox.kvstore``.

``scan(prefix, start_key, reverse)`` has the contract of ``qim.core.history.OrderedReader``:
pairs whose key starts with ``prefix``, ascending from the first key ``>= start_key`` (or
descending from the last key ``<= start_key``), lazily, stopping at the end of the prefix.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, TypeAlias

from qim.core.mailbox.values import StoredBody
from qim.schemas.frames.mailbox import SyncEntry

if TYPE_CHECKING:  # session_store reads through KVReader: a runtime import would be a cycle
    from qim.core.mailbox.session_store import StoredFacts

__all__ = ["EventGroup", "KVReader", "MailboxReader", "Op"]

Op: TypeAlias = tuple[bytes, bytes | None]
"""One write of a WriteBatch: ``(key, value)`` puts, ``(key, None)`` deletes. A result's ops
name each key at most once and are sorted by key, so applying them in order is the same as
applying them atomically."""

EventGroup: TypeAlias = tuple[int, list[SyncEntry]]
"""``(mailbox_seq, entries)``: all of one user's entries at one mailbox_seq (spec 6.7), in
``(event_ordinal, event_id)`` order. Never split across batches (9.3.3 rule 2)."""


class KVReader(Protocol):
    """Point and range reads over byte-ordered keys."""

    def get(self, key: bytes) -> bytes | None:
        """The value under ``key``, or None."""
        ...

    def scan(self, prefix: bytes, start_key: bytes, reverse: bool) -> Iterator[tuple[bytes, bytes]]:
        """Pairs under ``prefix`` from ``start_key`` (inclusive) in the given direction."""
        ...


class MailboxReader(Protocol):
    """What PULL_MAILBOX, AUTH_OK and the read-time join need from one shard's store.

    Reads see only committed batches. Implemented by
    :class:`qim.core.mailbox.reader.StoreMailboxReader` over any :class:`KVReader`.
    """

    def read_user_range(
        self, tenant_id: str, user_id: str, after_seq: int, up_to_seq: int
    ) -> Iterator[EventGroup]:
        """The user's event groups with ``after_seq < mailbox_seq <= up_to_seq``, ascending.

        One prefix seek plus one key read per entry (plus the one key that ends the scan), and
        no key outside the user's prefix (spec 2.3 criterion 1). Entries carry the reference
        fields and, for inline entries only, the body (``body_included=True``); others are
        joined with :meth:`body`. Lazy: stop iterating and nothing more is read.
        """
        ...

    def lane_watermark(self, lane: int) -> int:
        """``W[lane]``: every entry of that lane with ``mailbox_seq <= W[lane]`` is durable."""
        ...

    def effective_trim(self, tenant_id: str, user_id: str) -> int:
        """``effective_trim(u)`` (6.5.2, 18.3.3): entries at or below it may have been trimmed;
        above it nothing was. Monotone; 0 when nothing was ever trimmed."""
        ...

    def body(self, tenant_id: str, message_id: bytes) -> StoredBody | None:
        """The shard's copy of a message body for the read-time join (7.3, 18.3.1), or None
        when it is past retention (the entry then goes out with ``body_included=false``)."""
        ...

    def facts(
        self, tenant_id: str, conversation_id: str, conversation_seq: int, message_id: bytes
    ) -> StoredFacts | None:
        """The shard's facts row of a message (one per message, inline or not), or None when
        this shard holds none. The join reads two things from it: whether the message was
        recalled or deleted (13.4: its body is never served again, the entry goes out with
        ``body_included=false``) and its reaction aggregate (13.6, 18.3.1)."""
        ...
