"""Member slices on the MailboxNode: stored chunk by chunk as they arrive, read back whole.

Why store chunks rather than keep a ``SliceAssembler`` in memory: the store must be a pure
function of the dispatch log (direction.md 3), so a restart or a standby rebuilds the same
slices from the same records. A version's slice is complete when ``chunk_count`` distinct
chunks are in -- in any order, duplicates ignored (ADR-0017 reorders and re-appends) -- and the
completing chunk writes the :class:`SliceHeader`. Versions are immutable (7.9), so the first
copy of a chunk wins and a complete slice never changes; :class:`SliceCache` may therefore keep
assembled slices across batches without any invalidation (the header key still decides whether
a slice is complete).

Departures: a completed slice's former members are written as ``V`` keys, ``(user,
joined_at) -> left_at``, and every group dispatch reads its group's keys to apply ``left_at``
to the pinned version's members (``qim.core.fanout.recipients``, seed 003 M-5). They are facts
of the dispatch log folded so far, so a replay of the same log sees the same ones at the same
place.
"""

from __future__ import annotations

from qim.core.mailbox.keys import (
    departure_group_prefix,
    departure_key,
    parse_departure_key,
    slice_chunk_key,
    slice_version_prefix,
)
from qim.core.mailbox.kvstore import Overlay
from qim.core.mailbox.ports import KVReader
from qim.core.mailbox.values import (
    SliceHeader,
    decode_u64,
    decode_value,
    encode_u64,
    encode_value,
)
from qim.core.membership.errors import MembershipLogError
from qim.core.membership.slices import Departures, ShardSlice, SliceAssembler
from qim.schemas.records.membership import (
    MemberSliceRecord,
    decode_member_slice,
    encode_membership_record,
)

__all__ = [
    "SliceCache",
    "SliceKey",
    "load_departures",
    "load_slice",
    "record_departures",
    "store_chunk",
]

SliceKey = tuple[str, str, int]
"""``(tenant_id, group_id, membership_version)``; the shard is the store's own."""


class SliceCache:
    """Assembled slices by key. Safe to share across batches: complete slices are immutable."""

    def __init__(self, max_entries: int = 256) -> None:
        self._max = max_entries
        self._slices: dict[SliceKey, ShardSlice] = {}

    def get(self, key: SliceKey) -> ShardSlice | None:
        found = self._slices.pop(key, None)
        if found is not None:
            self._slices[key] = found  # most recently used last
        return found

    def put(self, key: SliceKey, value: ShardSlice) -> None:
        self._slices[key] = value
        while len(self._slices) > self._max:
            del self._slices[next(iter(self._slices))]


def store_chunk(kv: Overlay, record: MemberSliceRecord, log_now_ms: int) -> ShardSlice | None:
    """Keep one chunk; returns the slice if this chunk completed it, else None.

    Raises :class:`MembershipLogError` if the chunks of a version cannot form a slice (not
    parallel, overlapping, wrong member count): nothing pinned to that version can then be
    materialized, and the caller must fail closed rather than skip recipients.
    """
    prefix = slice_version_prefix(record.tenant_id, record.group_id, record.membership_version)
    if kv.get(prefix) is not None:
        return None  # complete already; a re-appended chunk changes nothing
    key = slice_chunk_key(
        record.tenant_id, record.group_id, record.membership_version, record.chunk_index
    )
    if kv.get(key) is None:
        kv.put(key, encode_membership_record(record))
    chunks = _chunks(kv, prefix)
    if len(chunks) < record.chunk_count:
        return None
    assembled = _assemble(chunks)
    if assembled is None:
        return None
    record_departures(kv, assembled)
    kv.put(
        prefix,
        encode_value(
            SliceHeader(
                chunk_count=record.chunk_count,
                shard_member_count=len(assembled.user_ids),
                member_count=assembled.member_count,
                completed_at=log_now_ms,
            )
        ),
    )
    return assembled


def record_departures(kv: Overlay, shard_slice: ShardSlice) -> None:
    """Keep the closed intervals a completed slice lists (first copy wins: they are facts)."""
    for user, joined_at, left_at in shard_slice.left:
        key = departure_key(shard_slice.tenant_id, shard_slice.group_id, user, joined_at)
        if kv.get(key) is None:
            kv.put(key, encode_u64(left_at))


def load_departures(kv: KVReader, tenant_id: str, group_id: str) -> Departures:
    """Every closed interval of the group known on this shard (from the slices folded so far)."""
    prefix = departure_group_prefix(tenant_id, group_id)
    return {
        parse_departure_key(key, prefix): decode_u64(value)
        for key, value in kv.scan(prefix, prefix, False)
    }


def load_slice(kv: KVReader, key: SliceKey, cache: SliceCache | None = None) -> ShardSlice | None:
    """The complete slice of ``key``, or None while any chunk is missing.

    Completeness is always read from the store (the header key), the cache only saves the
    assembly: a slice cached by a batch that was never committed must not make a later fold
    see it early, or the result would depend on the process's history, not on the store.
    """
    prefix = slice_version_prefix(*key)
    header = kv.get(prefix)
    if header is None:
        return None
    if cache is not None and (found := cache.get(key)) is not None:
        return found
    decode_value(header, SliceHeader)  # a corrupt header fails here, loudly
    assembled = _assemble(_chunks(kv, prefix))
    if assembled is None:
        raise MembershipLogError(f"slice {key} has a header but not its chunks")
    if cache is not None:
        cache.put(key, assembled)
    return assembled


def _chunks(kv: KVReader, prefix: bytes) -> list[MemberSliceRecord]:
    size = len(prefix) + 4
    return [
        decode_member_slice(value)
        for key, value in kv.scan(prefix, prefix, False)
        if len(key) == size
    ]


def _assemble(chunks: list[MemberSliceRecord]) -> ShardSlice | None:
    assembler = SliceAssembler()
    for chunk in sorted(chunks, key=lambda c: c.chunk_index):
        done = assembler.apply(chunk)
        if done is not None:
            return done
    return None
