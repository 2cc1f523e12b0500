"""Member slices: one logical version per chunked create, shard-local slices (7.9, dir. 4.3)."""

from __future__ import annotations

import random

import msgspec
import pytest

from qim.core.membership import (
    MembershipLogError,
    SliceAssembler,
    audit_slices,
    bitmap_from_bytes,
    member_slices,
    version_snapshot,
)
from qim.schemas.records.membership import (
    MemberSliceRecord,
    decode_member_slice,
    encode_membership_record,
)
from tests.unit.membership.support import Harness

T = "t1"
G = "g:big"
INVITEES = [f"user-{i:05d}" for i in range(10_000)]


@pytest.fixture(scope="module")
def big() -> Harness:
    h = Harness()
    h.create(T, G, "owner", reversed(INVITEES))
    return h


def test_7_9_create_of_10000_members_is_chunked_into_one_logical_version(big: Harness) -> None:
    chunks = big.log
    assert len(chunks) == 3  # 10,001 members, 4096 per record
    assert {c.membership_version for c in chunks} == {1}
    assert [(c.chunk_index, c.chunk_count) for c in chunks] == [(0, 3), (1, 3), (2, 3)]
    assert sum(len(c.targets) for c in chunks) == 10_000
    assert all(len(c.targets) + (c.chunk_index == 0) <= 4096 for c in chunks)
    assert [p.membership_version for p in big.published] == [1]  # published once, at the end
    assert big.state.member_count(T, G) == 10_001


def test_7_9_group_does_not_exist_until_the_last_chunk_in_any_order() -> None:
    h = Harness(chunk_max_members=100)
    h.create(T, G, "owner", INVITEES[:450])
    chunks = list(h.log)
    fresh = Harness(chunk_max_members=100)
    order = list(reversed(chunks))
    for chunk in order[:-1]:
        assert fresh.state.apply(chunk) is None
        assert fresh.state.apply(chunk) is None  # a redelivered chunk changes nothing
        assert fresh.state.group(T, G) is None and fresh.state.has_pending_create(T, G)
        assert not fresh.state.is_member(T, G, "owner")
    published = fresh.state.apply(order[-1])
    assert published is not None and published.membership_version == 1
    assert fresh.state.encode() == h.state.encode()


def test_direction_4_3_slices_cover_every_member_once_each_on_its_own_shard(big: Harness) -> None:
    group = big.state.group(T, G)
    assert group is not None
    (published,) = big.published
    slices = member_slices(group, published, chunk_max_members=50)
    assert audit_slices(group, slices) == []
    assert len({s.mailbox_shard for s in slices}) == 64
    assert any(s.chunk_count > 1 for s in slices)  # ~156 members per shard, 50 per chunk
    assert sum(len(s.user_ids) for s in slices) == 10_001
    shard_of = big.state.shard_of(T)
    for record in slices:
        assert all(shard_of(u) == record.mailbox_shard for u in record.user_ids)
        assert record.partition == record.mailbox_shard
        assert record.member_count == 10_001


def test_7_9_slice_bitmaps_are_portable_and_match_the_version_snapshot(big: Harness) -> None:
    group = big.state.group(T, G)
    assert group is not None
    (published,) = big.published
    slices = member_slices(group, published, chunk_max_members=50)
    snapshot = version_snapshot(group)
    assert snapshot.member_count == 10_001 and snapshot.membership_version == 1
    rnd = random.Random(7)
    wire = [decode_member_slice(encode_membership_record(s)) for s in slices]
    wire += rnd.sample(wire, 40)  # ADR-0017: duplicates ...
    rnd.shuffle(wire)  # ... and reordering inside a partition
    assembler = SliceAssembler()
    done = [s for s in (assembler.apply(r) for r in wire) if s is not None]
    assert assembler.pending() == []
    assembled = sorted((s.mailbox_shard, s.slot_bitmap) for s in done)
    assert assembled == [(row.mailbox_shard, row.member_bitmap) for row in snapshot.shards]
    for shard_slice in done:
        assert list(bitmap_from_bytes(shard_slice.slot_bitmap)) == list(shard_slice.slots)
        assert list(shard_slice.slots) == sorted(shard_slice.slots)
        assert all(j == 0 for j in shard_slice.joined_at)


def test_direction_4_3_a_touched_shard_left_empty_gets_an_empty_slice() -> None:
    h = Harness()
    h.create(T, "g:small", "alice", ["bob"])
    shard_of = h.state.shard_of(T)
    assert shard_of("alice") != shard_of("bob")
    h.leave(T, "g:small", "bob")
    group = h.state.group(T, "g:small")
    assert group is not None
    slices = member_slices(group, h.published[-1])
    by_shard = {s.mailbox_shard: s for s in slices}
    assert by_shard[shard_of("bob")].user_ids == ()
    assert by_shard[shard_of("bob")].shard_member_count == 0
    assert list(bitmap_from_bytes(by_shard[shard_of("bob")].slot_bitmap)) == []
    assert by_shard[shard_of("alice")].user_ids == ("alice",)
    assert audit_slices(group, slices) == []


def test_slices_only_for_the_current_version_and_broken_chunks_are_refused() -> None:
    h = Harness()
    h.create(T, "g:s", "alice", ["bob", "carol"])
    first = h.published[0]
    h.add(T, "g:s", ["dave"])
    group = h.state.group(T, "g:s")
    assert group is not None
    with pytest.raises(ValueError, match="not 1"):
        member_slices(group, first)
    (record, *_) = member_slices(group, h.published[-1])
    broken = msgspec.structs.replace(record, user_ids=(*record.user_ids, "extra"))
    with pytest.raises(MembershipLogError, match="not parallel"):
        SliceAssembler().apply(broken)
    bad_index = msgspec.structs.replace(record, chunk_index=5)
    with pytest.raises(MembershipLogError):
        SliceAssembler().apply(bad_index)


def test_audit_slices_names_a_missing_and_a_misplaced_member() -> None:
    h = Harness()
    h.create(T, "g:a", "alice", ["bob", "carol"])
    group = h.state.group(T, "g:a")
    assert group is not None
    slices = list(member_slices(group, h.published[-1]))
    dropped = slices.pop()
    assert any("appears 0 times" in p for p in audit_slices(group, slices))
    moved = MemberSliceRecord(**{**msgspec.structs.asdict(dropped), "mailbox_shard": 999})
    assert any("in slice 999" in p for p in audit_slices(group, [*slices, moved]))


def test_m5_slices_list_the_shards_former_members_with_their_closed_interval() -> None:
    """Seed 003 M-5: every later slice of a shard lists its former members as (user,
    joined_at, left_at), chunked like the members; the audit refuses a forged one."""
    h = Harness()
    others = [f"m{i:02d}" for i in range(12)]
    h.create(T, "g:f", "alice", ["bob", *others])
    shard_of = h.state.shard_of(T)
    leave = h.leave(T, "g:f", "bob")
    removed = h.remove(T, "g:f", others[:8])
    assert removed is not None
    group = h.state.group(T, "g:f")
    assert group is not None
    slices = member_slices(group, h.published[-1], chunk_max_members=2)
    assert audit_slices(group, slices) == []
    former = sorted(
        (user, joined, left)
        for s in slices
        for user, joined, left in zip(s.left_user_ids, s.left_joined_at, s.left_at, strict=True)
    )
    expected = sorted(
        [("bob", 0, leave.conversation_seq)]
        + [(u, 0, removed.conversation_seq) for u in others[:8]]
    )
    assert former == expected
    for s in slices:
        assert len(s.left_user_ids) <= 2
        assert all(shard_of(u) == s.mailbox_shard for u in s.left_user_ids)
    bobs = next(s for s in slices if "bob" in s.left_user_ids)
    forged = msgspec.structs.replace(bobs, left_at=tuple(x + 1 for x in bobs.left_at))
    assert any("did not leave" in p for p in audit_slices(group, [*slices, forged]))
    assembled = [d for d in map(SliceAssembler().apply, slices) if d is not None]
    assert sorted(x for d in assembled for x in d.left) == expected
