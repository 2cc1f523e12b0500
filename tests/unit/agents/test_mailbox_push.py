"""The MailboxNode's push glue: committed WriteBatch + presence cache -> PushBatches (issue 6).

Spec 11.1.2 (push only what is durable, fire-and-forget), I-19 (one PushBatch per
ConnectionShard per message), 5.4.2/5.4.3 (cache fed by the shard's own presence partition,
rebuilt before any push decision, PRESENCE_STALE invalidates).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from qim.agents.mailbox.presence import NodePresence, snapshot_of, stale_reports
from qim.agents.mailbox.push import PushOutcome, plan_batch_pushes, send_pushes
from qim.agents.mailbox.shard import OwnedShard
from qim.core.mailbox import MemoryMailboxStore
from qim.core.push import ShardPresenceCache
from qim.schemas.records.dispatch import DispatchLogRecord
from qim.schemas.records.presence import PresenceEntry, encode_presence
from qim.schemas.records.push import (
    PresenceStale,
    PushBatch,
    decode_push_body,
    decode_to_gateway,
    encode_push_record,
)
from tests.unit.mailbox.support import CONFIG, EPOCH, SHARD, T, dispatch, group_slice, local_users

NOW = 1_800_000_000_000
USERS = local_users(300)


@dataclass(frozen=True)
class Rec:
    """The three fields of an aiokafka ConsumerRecord the glue reads."""

    offset: int
    key: bytes
    value: bytes | None


def device(user: str, conn_shard: int, *, dev: str = "d1", epoch: int = 1) -> PresenceEntry:
    return PresenceEntry(
        tenant_id=T,
        user_id=user,
        device_id=dev,
        connection_id=f"c-{user}-{dev}",
        node_id="gw1",
        connection_shard=conn_shard,
        session_epoch=epoch,
        lease_expire_at=NOW + 60_000,
    )


def cache_with(entries: Sequence[PresenceEntry]) -> ShardPresenceCache:
    cache = ShardPresenceCache(SHARD)
    for entry in entries:
        cache.apply(entry.key, entry, NOW)
    return cache


def committed(log: Sequence[tuple[int, DispatchLogRecord]]) -> tuple[OwnedShard, Any]:
    shard = OwnedShard(SHARD, MemoryMailboxStore(), CONFIG, EPOCH)
    result = shard.materialize(log)
    shard.write(result)
    return shard, result


def plan(
    shard: OwnedShard,
    result: Any,
    log: Sequence[tuple[int, DispatchLogRecord]],
    presence: ShardPresenceCache | None,
    push_from_offset: int = 0,
) -> PushOutcome:
    return plan_batch_pushes(
        result.written,
        log,
        reader=shard.reader,
        mailbox_shard=SHARD,
        shard_epoch=EPOCH,
        push_from_offset=push_from_offset,
        presence=presence,
        now_ms=NOW,
    )


def test_direct_message_is_one_batch_with_the_peer_and_the_senders_other_device() -> None:
    a, b = USERS[0], USERS[1]
    log = [(5, dispatch(1, conversation=f"d:{a}:{b}", sender=a, participants=(a, b)))]
    shard, result = committed(log)
    presence = cache_with([device(b, 7), device(a, 7, dev="phone")])
    outcome = plan(shard, result, log, presence)
    assert len(outcome.plans) == 1
    (batch,) = outcome.plans[0].batches
    assert batch.connection_shard == 7 and batch.mailbox_shard == SHARD
    assert batch.priority == "direct"
    assert {(r.user_id, r.device_id) for r in batch.recipients} == {(a, "phone"), (b, "d1")}
    assert decode_push_body(batch.common_encoded_body).payload_or_ciphertext == b"body"


def test_offline_recipient_gets_no_batch_and_is_reported() -> None:
    a, b = USERS[0], USERS[1]
    log = [(0, dispatch(1, conversation=f"d:{a}:{b}", sender=a, participants=(a, b)))]
    shard, result = committed(log)
    outcome = plan(shard, result, log, cache_with([]))
    assert outcome.plans[0].batches == ()
    assert set(outcome.plans[0].offline_users) == {a, b}


def test_replayed_records_and_rebuilding_caches_push_nothing_11_1_2() -> None:
    a, b = USERS[0], USERS[1]
    log = [(3, dispatch(1, conversation=f"d:{a}:{b}", sender=a, participants=(a, b)))]
    shard, result = committed(log)
    replay = plan(shard, result, log, cache_with([device(b, 1)]), push_from_offset=4)
    assert replay.plans == () and replay.skipped_replay == 2
    rebuilding = plan(shard, result, log, None)
    assert rebuilding.plans == () and rebuilding.skipped_rebuilding == 2


def test_group_message_is_one_batch_per_connection_shard_with_every_online_member_i19() -> None:
    members = USERS[:250]
    log: list[tuple[int, DispatchLogRecord]] = [
        (i, r) for i, r in enumerate(group_slice("g:big", 1, [(u, 0) for u in members]))
    ]
    log.append((len(log), dispatch(1, conversation="g:big", kind="group", version=1)))
    shard, result = committed(log)
    online = members[::2]
    presence = cache_with([device(u, i % 5) for i, u in enumerate(online)])
    outcome = plan(shard, result, log, presence)
    (one,) = outcome.plans
    assert [b.connection_shard for b in one.batches] == [0, 1, 2, 3, 4]
    assert sorted(r.user_id for b in one.batches for r in b.recipients) == sorted(online)
    assert len({id(b.common_encoded_body) for b in one.batches}) == 1  # encoded once
    assert all(b.priority == "small_group" for b in one.batches)


def test_presence_cache_is_rebuilding_until_the_takeover_end_then_follows_the_partition() -> None:
    node = NodePresence()
    node.assign({SHARD: (0, 2), 9: (4, 4)})
    assert node.cache(SHARD) is None and node.cache(9) is not None  # empty compacted = ready
    b = device(USERS[1], 3)
    node.apply(SHARD, [Rec(0, b.key.encode(), encode_presence(b))], NOW)
    assert node.cache(SHARD) is None
    assert node.apply(SHARD, [Rec(1, b"garbage", b"x")], NOW) == 1
    cache = node.cache(SHARD)
    assert cache is not None and cache.devices(T, USERS[1], NOW) == (b,)
    node.apply(SHARD, [Rec(2, b.key.encode(), None)], NOW)  # tombstone
    assert cache.devices(T, USERS[1], NOW) == ()


def test_presence_stale_from_user_requests_invalidates_the_device_5_4_3() -> None:
    node = NodePresence()
    node.assign({SHARD: (0, 0)})
    b = device(USERS[1], 3, epoch=4)
    node.apply(SHARD, [Rec(0, b.key.encode(), encode_presence(b))], NOW)
    stale = PresenceStale(
        tenant_id=T,
        user_id=USERS[1],
        device_id="d1",
        connection_id=b.connection_id,
        observed_epoch=4,
        reason="unknown_connection",
        mailbox_shard=SHARD,
    )
    (found,) = stale_reports([Rec(7, b"k", encode_push_record(stale)), Rec(8, b"k", b"\x80")])
    assert node.invalidate(found, NOW)
    cache = node.cache(SHARD)
    assert cache is not None and cache.devices(T, USERS[1], NOW) == ()


def test_reconcile_snapshot_restores_a_missing_device() -> None:
    node = NodePresence()
    node.assign({SHARD: (0, 0)})
    b = device(USERS[1], 3)
    report = node.reconcile(SHARD, snapshot_of([Rec(0, b.key.encode(), encode_presence(b))]), NOW)
    assert report is not None and report.presence_reconcile_diff == 1
    cache = node.cache(SHARD)
    assert cache is not None and cache.devices(T, USERS[1], NOW) == (b,)


class _Producer:
    def __init__(self, fail_partitions: set[int]) -> None:
        self.sent: list[tuple[str, bytes, int]] = []
        self._fail = fail_partitions

    async def send(self, topic: str, value: bytes, *, key: bytes, partition: int) -> Any:
        self.sent.append((topic, value, partition))
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        if partition in self._fail:
            future.set_exception(RuntimeError("broker down"))
        else:
            future.set_result(None)
        return future


async def test_send_is_fire_and_forget_at_the_connection_shard_partition() -> None:
    members = USERS[:40]
    log: list[tuple[int, DispatchLogRecord]] = [
        (i, r) for i, r in enumerate(group_slice("g:x", 1, [(u, 0) for u in members]))
    ]
    log.append((len(log), dispatch(2, conversation="g:x", kind="group", version=1)))
    shard, result = committed(log)
    outcome = plan(
        shard, result, log, cache_with([device(u, i % 3) for i, u in enumerate(members)])
    )
    producer = _Producer({1})
    done: list[tuple[int, int]] = []
    tasks: set[asyncio.Task[None]] = set()
    sent = await send_pushes(
        producer,
        "to-gw",
        outcome.plans,
        on_done=lambda ok, failed: done.append((ok, failed)),
        tasks=tasks,
    )
    await asyncio.gather(*tasks)
    assert sent == 3 and done == [(2, 1)]
    for _, value, partition in producer.sent:
        batch = decode_to_gateway(value)
        assert isinstance(batch, PushBatch) and batch.connection_shard == partition
