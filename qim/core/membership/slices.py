"""Per-shard member slices: the version snapshot, the dispatch-log records, their reassembly.

Producer side (conversation app): after ``GroupMembership.apply`` publishes a version,
:func:`member_slices` cuts one :class:`MemberSliceRecord` chunk list per MailboxShard, to be
produced to dispatch partition ``mailbox_shard`` BEFORE any GroupDispatch pinned to that
version (direction 4.3). Every shard that has members gets its full slice -- a slice is
self-contained, so a MailboxNode that rebuilds from a retention-trimmed log never needs an
older version -- and a touched shard left without members gets an empty slice, so it learns
the group is gone there. Each slice also lists the shard's former members with their closed
``(joined_at, left_at)`` interval: a dispatch pinned to an OLDER version (recovery, a retried
append) must still not reach someone who left before its seq (10.1 step 9, seed 003 M-5),
and only a later version can know that leave.

Consumer side (MailboxNode): :class:`SliceAssembler` collects chunks of
``(tenant, group, version, shard)`` in any order, ignores duplicates (ADR-0017 allows both),
and yields a :class:`ShardSlice` when ``chunk_count`` distinct chunks are in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from qim.core.membership.bitmaps import bitmap_bytes, bitmap_from_bytes
from qim.core.membership.errors import MembershipLogError
from qim.core.membership.group import GroupState
from qim.core.membership.operations import DEFAULT_CHUNK_MAX_MEMBERS
from qim.core.membership.state import VersionPublished
from qim.schemas.records.membership import GroupMembershipVersion, MemberSliceRecord, ShardBitmap

__all__ = [
    "Departures",
    "Interval",
    "ShardSlice",
    "SliceAssembler",
    "audit_slices",
    "member_slices",
    "version_snapshot",
]

Interval = tuple[str, int, int]
"""``(user_id, joined_at, left_at)``: one closed membership interval (spec 7.5)."""

Departures = Mapping[tuple[str, int], int]
"""``(user_id, joined_at) -> left_at`` of closed intervals, as a MailboxNode has seen them in
its shard's slices. Immutable facts: a rejoin opens a new interval with a new ``joined_at``."""


def version_snapshot(group: GroupState) -> GroupMembershipVersion:
    """GroupMembershipVersion of the group's current version: one bitmap per populated shard."""
    return GroupMembershipVersion(
        tenant_id=group.tenant_id,
        group_id=group.group_id,
        membership_version=group.version,
        member_count=group.member_count,
        created_at=group.updated_at,
        shards=tuple(
            ShardBitmap(
                mailbox_shard=shard,
                member_count=len(group.shard_slots(shard)),
                member_bitmap=bitmap_bytes(group.shard_slots(shard)),
            )
            for shard in group.shards()
        ),
    )


def member_slices(
    group: GroupState,
    published: VersionPublished,
    *,
    chunk_max_members: int = DEFAULT_CHUNK_MAX_MEMBERS,
) -> tuple[MemberSliceRecord, ...]:
    """The slice records of ``published``; ``group`` must still be at that version."""
    if group.version != published.membership_version:
        raise ValueError(f"group is at {group.version}, not {published.membership_version}")
    if chunk_max_members < 1:
        raise ValueError("chunk_max_members must be >= 1")
    out: list[MemberSliceRecord] = []
    step = chunk_max_members
    for shard in sorted(set(group.shards()) | set(published.touched_shards)):
        slots = list(group.shard_slots(shard))
        cuts = [slots[i : i + step] for i in range(0, len(slots), step)]
        former = _former_members(group, shard)
        left_cuts = [former[i : i + step] for i in range(0, len(former), step)]
        count = max(len(cuts), len(left_cuts), 1)
        for index in range(count):
            chunk = cuts[index] if index < len(cuts) else []
            left = left_cuts[index] if index < len(left_cuts) else []
            rows = [group.user_at(slot) for slot in chunk]
            out.append(
                MemberSliceRecord(
                    tenant_id=group.tenant_id,
                    group_id=group.group_id,
                    membership_version=group.version,
                    mailbox_shard=shard,
                    chunk_index=index,
                    chunk_count=count,
                    slot_bitmap=bitmap_bytes(chunk),
                    user_ids=tuple(r.user_id for r in rows),
                    joined_at=tuple(r.joined_at for r in rows),
                    shard_member_count=len(slots),
                    member_count=group.member_count,
                    left_user_ids=tuple(user for user, _, _ in left),
                    left_joined_at=tuple(joined for _, joined, _ in left),
                    left_at=tuple(left_at for _, _, left_at in left),
                )
            )
    return tuple(out)


def _former_members(group: GroupState, shard: int) -> list[Interval]:
    """``(user, joined_at, left_at)`` of the shard's former members, ascending by user."""
    return sorted(
        (row.user_id, row.joined_at, row.left_at)
        for row in group.rows.values()
        if not row.active and row.left_at is not None and row.shard == shard
    )


def audit_slices(group: GroupState, slices: Iterable[MemberSliceRecord]) -> list[str]:
    """Invariant of direction 4.3: the slices of the group's current version hold every active
    member exactly once, each on its own MailboxShard, with its slot and joined_at, and list
    only real former members with their closed interval. Returns the violations (empty =
    sound); used by tests and by a runtime audit alike."""
    problems: list[str] = []
    seen: dict[str, int] = {}
    for record in slices:
        if record.membership_version != group.version:
            problems.append(f"slice of version {record.membership_version} != {group.version}")
        slots = list(bitmap_from_bytes(record.slot_bitmap))
        for slot, user, joined in zip(slots, record.user_ids, record.joined_at, strict=False):
            row = group.rows.get(user)
            if row is None or not row.active or row.slot_id != slot or row.joined_at != joined:
                problems.append(f"{user!r} at slot {slot} is not that member")
            elif row.shard != record.mailbox_shard:
                problems.append(f"{user!r} of shard {row.shard} in slice {record.mailbox_shard}")
            seen[user] = seen.get(user, 0) + 1
        if not len(slots) == len(record.user_ids) == len(record.joined_at):
            problems.append(f"slice chunk of shard {record.mailbox_shard} is not parallel")
        former = zip(record.left_user_ids, record.left_joined_at, record.left_at, strict=False)
        for user, joined, left in former:
            row = group.rows.get(user)
            if row is None or row.active or (row.joined_at, row.left_at) != (joined, left):
                problems.append(f"{user!r} did not leave at {left} after joining at {joined}")
            elif row.shard != record.mailbox_shard:
                problems.append(f"former {user!r} of shard {row.shard} in {record.mailbox_shard}")
    for user in sorted(u for u, r in group.rows.items() if r.active):
        if seen.get(user, 0) != 1:
            problems.append(f"{user!r} appears {seen.get(user, 0)} times")
    return problems


@dataclass(frozen=True, slots=True)
class ShardSlice:
    """One version's members on one MailboxShard, as the MailboxNode keeps it.

    ``slots``, ``user_ids`` and ``joined_at`` are parallel and ascending by slot id;
    ``slot_bitmap`` is their canonical portable bitmap (same bytes as the producer's
    GroupMembershipVersion row for this shard). ``left`` lists the shard's former members as
    ``(user_id, joined_at, left_at)``: the MailboxNode records them as :data:`Departures`.
    """

    tenant_id: str
    group_id: str
    membership_version: int
    mailbox_shard: int
    member_count: int
    slot_bitmap: bytes
    slots: tuple[int, ...]
    user_ids: tuple[str, ...]
    joined_at: tuple[int, ...]
    left: tuple[Interval, ...] = ()  # former members' closed intervals, ascending by user


SliceKey = tuple[str, str, int, int]


class SliceAssembler:
    """Reassembles slice chunks on the MailboxNode; complete slices are handed back once."""

    def __init__(self) -> None:
        self._pending: dict[SliceKey, dict[int, MemberSliceRecord]] = {}
        self._done: set[SliceKey] = set()

    def apply(self, record: MemberSliceRecord) -> ShardSlice | None:
        """Add one chunk; returns the slice when this chunk completes it, else None."""
        key = (record.tenant_id, record.group_id, record.membership_version, record.mailbox_shard)
        if key in self._done:
            return None
        if not 0 <= record.chunk_index < record.chunk_count:
            raise MembershipLogError(f"slice chunk index out of range: {key}")
        chunks = self._pending.setdefault(key, {})
        chunks.setdefault(record.chunk_index, record)
        if len(chunks) < record.chunk_count:
            return None
        del self._pending[key]
        self._done.add(key)
        return _assemble(key, [chunks[i] for i in range(record.chunk_count)])

    def pending(self) -> list[SliceKey]:
        """Slices with some but not all chunks, sorted (for audits and metrics)."""
        return sorted(self._pending)

    def forget(self, key: SliceKey) -> None:
        """Drop the dedup memory of a slice the node has retired (version GC)."""
        self._done.discard(key)


def _assemble(key: SliceKey, chunks: list[MemberSliceRecord]) -> ShardSlice:
    slots: list[int] = []
    users: list[str] = []
    joined: list[int] = []
    left: list[Interval] = []
    for chunk in chunks:
        chunk_slots = list(bitmap_from_bytes(chunk.slot_bitmap))
        if not len(chunk_slots) == len(chunk.user_ids) == len(chunk.joined_at):
            raise MembershipLogError(f"slice chunk of {key} is not parallel")
        if not len(chunk.left_user_ids) == len(chunk.left_joined_at) == len(chunk.left_at):
            raise MembershipLogError(f"former members of {key} are not parallel")
        left += zip(chunk.left_user_ids, chunk.left_joined_at, chunk.left_at, strict=True)
        if slots and chunk_slots and chunk_slots[0] <= slots[-1]:
            raise MembershipLogError(f"slice chunks of {key} overlap or are out of order")
        slots += chunk_slots
        users += chunk.user_ids
        joined += chunk.joined_at
    if len(slots) != chunks[0].shard_member_count:
        raise MembershipLogError(f"slice {key} has {len(slots)} members, header says otherwise")
    return ShardSlice(
        tenant_id=key[0],
        group_id=key[1],
        membership_version=key[2],
        mailbox_shard=key[3],
        member_count=chunks[0].member_count,
        slot_bitmap=bitmap_bytes(slots),
        slots=tuple(slots),
        user_ids=tuple(users),
        joined_at=tuple(joined),
        left=tuple(sorted(left)),
    )
