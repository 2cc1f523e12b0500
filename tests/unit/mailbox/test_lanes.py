"""Lane watermarks: isolation, holds, monotonicity, takeover (spec 6.5.1, 9.2, 10.4.2; seed 003
M-1, M-2, M-3)."""

from __future__ import annotations

import pytest

from qim.core.mailbox import (
    LaneHold,
    MemoryMailboxStore,
    advance_watermarks,
    commit,
    materialize,
    refused_lanes,
    replay,
    resume_from,
    resume_offset,
    store_digest,
)
from qim.schemas import lane_id
from tests.unit.mailbox.support import (
    CONFIG,
    EPOCH,
    T,
    dispatch,
    group_slice,
    local_users,
    numbered,
    run,
    seq,
    users_on_other_lanes,
)

G = "g:big"
LANES = CONFIG.lane_count


def _lane(user: str) -> int:
    return lane_id(T, user, LANES)


def test_M1_a_10000_member_dispatch_does_not_hold_back_an_unrelated_one_to_one_lane() -> None:
    u, peer = local_users(2, prefix="solo")
    lane_u = _lane(u)
    members = [(m, 0) for m in users_on_other_lanes(lane_u, 10_000)]
    big = dispatch(1, conversation=G, kind="group", sender=members[0][0], version=1)
    one_to_one = dispatch(2, sender=peer, participants=(u, peer))
    store = MemoryMailboxStore()
    result = run(store, numbered([*group_slice(G, 1, members), big, one_to_one]))
    big_seq, u_seq = seq(3), seq(4)
    assert result.metrics["mailbox_entries_written_total"] == 10_000 + 2
    assert len({_lane(m) for m, _ in members}) == LANES - 1  # every lane but U's
    assert result.watermarks[lane_u] == u_seq
    assert min(result.watermarks) > big_seq  # nothing of the big dispatch is outstanding


def test_10_1_3_a_dispatch_to_explicit_recipients_never_waits_for_a_slice() -> None:
    u, peer = local_users(2, prefix="solo")
    notice = dispatch(1, conversation=G, kind="group", sender=peer, version=0, participants=(u,))
    result = run(MemoryMailboxStore(), [(0, notice)])
    assert result.pending == () and set(result.watermarks) == {seq(0)}


def test_9_2_2_a_dispatch_with_unknown_recipients_holds_every_lane_until_its_slice_arrives() -> (
    None
):
    u, peer = local_users(2, prefix="solo")
    members = [(m, 0) for m in local_users(50)]
    chunks = group_slice(G, 1, members, chunk=20)
    big = dispatch(1, conversation=G, kind="group", sender=members[0][0], version=1)
    store = MemoryMailboxStore()
    waiting = run(
        store, [(0, chunks[0]), (1, big), (2, dispatch(2, sender=peer, participants=(u, peer)))]
    )
    assert set(waiting.watermarks) == {seq(0)}  # nobody is told it has seen past seq 1
    done = run(store, [(3, chunks[1]), (4, chunks[2])])
    assert set(done.watermarks) == {seq(4)}
    assert set(done.watermark_floor) == {seq(4)}


def test_9_2_2_a_hold_keeps_back_exactly_its_lanes_and_w_never_moves_back() -> None:
    current = (10, 20, 30, 40)
    moved, regressions = advance_watermarks(current, 50, [LaneHold(35, frozenset({3}))])
    assert moved == (50, 50, 50, 40) and regressions == 1
    moved, regressions = advance_watermarks(current, 50, [LaneHold(45, frozenset({0, 3}))])
    assert moved == (44, 50, 50, 44) and regressions == 0
    assert advance_watermarks(current, 50, [LaneHold(45)])[0] == (44, 44, 44, 44)


def test_10_4_2_resume_offset_is_min_w_plus_one_and_restarts_at_an_epoch_change() -> None:
    assert resume_offset((0, 0), EPOCH) == 0
    assert resume_offset((seq(41), seq(17)), EPOCH) == 18
    assert resume_offset((seq(41), seq(17)), EPOCH + 1) == 0
    with pytest.raises(ValueError, match="ahead"):
        resume_offset((seq(41, epoch=3),), 2)


def test_M3_a_lane_below_its_published_floor_is_refused() -> None:
    assert refused_lanes((5, 9, 7), (5, 8, 8)) == [2]
    assert refused_lanes((5, 9, 9), (5, 8, 8)) == []


def test_M2_crash_after_materialize_before_commit_replays_to_identical_bytes() -> None:
    a, b, c = local_users(3)
    log = numbered(
        [
            dispatch(n, sender=(a, b, c)[n % 3], participants=(a, b, c)[: 2 + n % 2])
            for n in range(1, 40)
        ]
    )
    reference = replay(log, shard_epoch=EPOCH, config=CONFIG)
    store = replay(log[:15], shard_epoch=EPOCH, config=CONFIG)
    lost = materialize(store, log[15:30], shard_epoch=EPOCH, config=CONFIG)
    assert lost.ops  # ... and the process dies before committing it
    start = resume_from(store, CONFIG)
    assert start == 15  # offset(min W) + 1, not a consumer-group offset
    replay(log[start:], shard_epoch=EPOCH, config=CONFIG, store=store)
    assert store_digest(store.items()) == store_digest(reference.items())


def test_M2_records_read_again_after_a_commit_change_nothing() -> None:
    a, b = local_users(2)
    log = numbered([dispatch(n, sender=b, participants=(a, b)) for n in range(1, 10)])
    store = replay(log, shard_epoch=EPOCH, config=CONFIG)
    before = store_digest(store.items())
    again = materialize(store, log[3:], shard_epoch=EPOCH, config=CONFIG)
    commit(store, again)
    assert again.metrics["dispatch_record_replayed_total"] == 6
    assert store_digest(store.items()) == before
