"""An owned shard serves a lane only at or above its floor, and never shows an unpublished W.

Spec 10.4.2 (2)/(3), I-15, direction.md 4.1: a new owner adopts the floor the previous owner
published (offset-commit metadata) and answers SHARD_MOVED{retry_after_ms} on every lane whose
recomputed ``W`` is still below it; reads never show a ``W`` above what this node has published,
so the next owner's floor covers every watermark a client has seen.
"""

from __future__ import annotations

import pytest

from qim.agents.mailbox.reads import ReadContext, answer
from qim.agents.mailbox.shard import OwnedShard, decode_floor, decode_run, encode_floor
from qim.core.mailbox import MailboxConfig, MemoryMailboxStore
from qim.core.sync import CursorKey, CursorKeyRing, PullLimits
from qim.schemas import lane_id
from qim.schemas.frames import ErrorCode, PullMailbox
from qim.schemas.records.dispatch import encode_dispatch_record
from qim.schemas.records.user_requests import PullMailboxRequest
from tests.unit.mailbox.support import CONFIG, EPOCH, T, dispatch, local_users, numbered, seq

CTX = ReadContext(
    keys=CursorKeyRing([CursorKey("k1", b"unit-test-cursor-key-0123456789")]),
    limits=PullLimits(),
    retry_after_ms=750,
    now_ms=lambda: 1_800_000_000_000,
)
USERS = local_users(8)
LOG = numbered(
    [
        dispatch(
            n,
            conversation=f"d:{n}",
            sender=USERS[n % 8],
            participants=(USERS[n % 8], USERS[(n + 1) % 8]),
        )
        for n in range(1, 11)
    ]
)


def owned(config: MailboxConfig = CONFIG) -> OwnedShard:
    return OwnedShard(config.mailbox_shard, MemoryMailboxStore(), config, EPOCH)


def pull(user: str) -> PullMailboxRequest:
    return PullMailboxRequest(
        tenant_id=T,
        user_id=user,
        device_id="d",
        session_epoch=1,
        connection_shard=3,
        request_id=42,
        message=PullMailbox(),
    )


def test_floor_metadata_round_trips_and_ignores_other_epochs_and_garbage() -> None:
    floor = tuple(range(CONFIG.lane_count))
    text = encode_floor(EPOCH, floor)
    assert len(text) < 4096  # Kafka's default offset.metadata.max.bytes
    assert decode_floor(text, EPOCH, CONFIG.lane_count) == floor
    assert decode_floor(text, EPOCH + 1, CONFIG.lane_count) is None
    assert decode_floor("", EPOCH, CONFIG.lane_count) is None
    assert decode_floor("qim-floor/1 1 !!!", EPOCH, CONFIG.lane_count) is None
    assert decode_floor(encode_floor(EPOCH, floor[:8]), EPOCH, CONFIG.lane_count) is None


def test_10_4_2_new_owner_refuses_lanes_below_the_published_floor_until_caught_up() -> None:
    previous = owned()
    previous.take_over(None, None)
    previous.write(previous.materialize(LOG))
    metadata = encode_floor(EPOCH, previous.floor_to_publish())

    new = owned()  # an empty store: replays the partition from the start
    assert new.take_over(metadata, committed=len(LOG)) == 0
    assert new.committed_at_takeover == len(LOG)
    assert len(new.refused()) == CONFIG.lane_count
    assert all(new.served_watermark(lane) is None for lane in range(CONFIG.lane_count))
    reply = answer(new, CONFIG.mailbox_shard, pull(USERS[1]), CTX)
    assert reply.error is not None and reply.error.code == ErrorCode.SHARD_MOVED
    assert reply.error.retry_after_ms == 750 and reply.error.request_id == 42

    new.write(new.materialize(LOG[:5]))
    assert len(new.refused()) == CONFIG.lane_count  # W = seq(4) < floor = seq(9)
    new.write(new.materialize(LOG[5:]))
    assert new.refused() == []
    lane = lane_id(T, USERS[1], CONFIG.lane_count)
    assert new.served_watermark(lane) == seq(len(LOG) - 1)
    reply = answer(new, CONFIG.mailbox_shard, pull(USERS[1]), CTX)
    assert reply.mailbox_batch is not None and reply.mailbox_batch.entries


def test_reads_never_show_a_watermark_this_node_has_not_published() -> None:
    shard = owned()
    shard.take_over(None, None)
    shard.write(shard.materialize(LOG[:3]))
    lane = lane_id(T, USERS[1], CONFIG.lane_count)
    assert shard.served_watermark(lane) == 0  # nothing committed to Kafka yet
    shard.mark_published(shard.floor_to_publish())
    assert shard.served_watermark(lane) == seq(2)
    shard.write(shard.materialize(LOG[3:]))
    assert shard.served_watermark(lane) == seq(2)
    assert shard.dirty
    shard.mark_published(shard.floor_to_publish())
    assert shard.served_watermark(lane) == seq(len(LOG) - 1)


def test_m2_resume_point_comes_from_w_not_from_consumed_offsets() -> None:
    shard = owned()
    shard.take_over(None, None)
    shard.write(shard.materialize(LOG[:4]))
    shard.materialize(LOG[4:])  # folded, never written: a crash before the WriteBatch
    shard.consumed(LOG[-1][0])
    assert shard.next_offset == len(LOG)  # the bookkeeping offset a commit would carry
    assert shard.resume_at() == 4  # where a restart reads from


def test_a_store_of_a_higher_epoch_is_refused_and_not_serving_before_takeover() -> None:
    shard = owned()
    shard.take_over(None, None)
    shard.write(shard.materialize(LOG[:1]))
    with pytest.raises(ValueError, match="shard_epoch"):
        OwnedShard(0, shard.store, CONFIG, EPOCH - 1 if EPOCH > 1 else 0)
    fresh = owned()
    assert fresh.served_watermark(0) is None
    with pytest.raises(ValueError, match="another shard"):
        OwnedShard(1, MemoryMailboxStore(), CONFIG, EPOCH)


def test_decode_run_skips_undecodable_records_by_offset() -> None:
    class Rec:
        def __init__(self, offset: int, value: bytes) -> None:
            self.offset, self.value = offset, value

    good = encode_dispatch_record(LOG[0][1])
    batch, malformed = decode_run([Rec(0, good), Rec(1, b"\xc1junk"), Rec(2, good)])
    assert [o for o, _ in batch] == [0, 2] and malformed == [1]
