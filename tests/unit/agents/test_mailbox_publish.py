"""What one commit publishes, and the replies of one fetched run of user-requests.

Invariants: only shards with news are committed, each dispatch offset carries the shard's floor
(max of the adopted floor and W) in its metadata, partitions no longer assigned are never
committed; undecodable requests and PRESENCE_STALE produce no reply, every other request
exactly one, in order, counted by kind and outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from qim.agents.mailbox.metrics import MailboxMetrics
from qim.agents.mailbox.publish import plan_commit, replies_for
from qim.agents.mailbox.reads import ReadContext
from qim.agents.mailbox.shard import OwnedShard, decode_floor
from qim.core.mailbox import MemoryMailboxStore
from qim.core.sync import CursorKey, CursorKeyRing, PullLimits
from qim.schemas.frames import PullMailbox
from qim.schemas.records.push import PresenceStale, encode_push_record
from qim.schemas.records.user_requests import (
    PullMailboxRequest,
    SyncAuthRequest,
    encode_user_record,
)
from tests.unit.mailbox.support import CONFIG, EPOCH, T, dispatch, local_users, numbered, seq

A, B = local_users(2)
CTX = ReadContext(
    keys=CursorKeyRing([CursorKey("k1", b"unit-test-cursor-key-0123456789")]),
    limits=PullLimits(),
    retry_after_ms=500,
    now_ms=lambda: 0,
)


@dataclass
class Record:
    offset: int
    value: bytes


def shard_with_news() -> OwnedShard:
    shard = OwnedShard(0, MemoryMailboxStore(), CONFIG, EPOCH)
    shard.take_over(None, None)
    shard.write(shard.materialize(numbered([dispatch(1, sender=A, participants=(A, B))])))
    shard.consumed(0)
    return shard


def test_commit_carries_each_dirty_shards_floor_and_only_assigned_partitions() -> None:
    news, quiet = shard_with_news(), shard_with_news()
    quiet.dirty = False
    assigned = [TopicPartition("d", 0), TopicPartition("d", 1), TopicPartition("r", 0)]
    plan = plan_commit(
        {0: news, 1: quiet, 2: shard_with_news()},
        {0: 12, 5: 3},
        assigned=assigned,
        shard_epoch=EPOCH,
        dispatch_topic="d",
        requests_topic="r",
    )
    assert set(plan.offsets) == {TopicPartition("d", 0), TopicPartition("r", 0)}
    dispatch_offset = plan.offsets[TopicPartition("d", 0)]
    assert dispatch_offset.offset == 1
    floor = decode_floor(dispatch_offset.metadata, EPOCH, CONFIG.lane_count)
    assert floor == plan.floors[0] and min(floor) == seq(0)
    assert plan.offsets[TopicPartition("r", 0)].offset == 12


def test_replies_in_order_one_per_request_none_for_junk_or_presence_stale() -> None:
    metrics = MailboxMetrics(CollectorRegistry(), dict)
    session: dict[str, Any] = {
        "tenant_id": T,
        "device_id": "p",
        "session_epoch": 1,
        "connection_shard": 2,
    }
    stale = PresenceStale(
        tenant_id=T, user_id=A, device_id="p", connection_id="c", observed_epoch=1,
        reason="unknown_connection", mailbox_shard=0,
    )  # fmt: skip
    records = [
        Record(0, encode_user_record(SyncAuthRequest(user_id=B, correlation_id="1", **session))),
        Record(1, b"\x00junk"),
        Record(2, encode_push_record(stale)),
        Record(3, encode_user_record(
            PullMailboxRequest(user_id=B, correlation_id="2", message=PullMailbox(), **session)
        )),
    ]  # fmt: skip
    replies = replies_for(shard_with_news(), 0, records, CTX, metrics)
    assert [r.correlation_id for r in replies] == ["1", "2"]
    assert replies[0].auth_sync is not None and replies[1].mailbox_batch is not None
    totals = metrics.totals
    assert totals["login_total"] == 1 and totals["replies:pull_mailbox:ok"] == 1
    assert totals["records:user-requests:malformed"] == 1
    assert totals["records:user-requests:presence_stale"] == 1
