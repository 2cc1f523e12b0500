"""What a MailboxNode tells others: offset commits that carry the floor, and replies.

Kept out of the service so each step is a small function with its own test: which offsets and
floors one commit publishes (:func:`plan_commit`), the replies of one fetched run of
user-requests (:func:`replies_for`), and putting replies on ``qim.to-gateway``
(:func:`send_replies`: all sends in flight at once, then awaited together, per
faust-kafka-notes section 7).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from qim.agents.mailbox.metrics import MailboxMetrics
from qim.agents.mailbox.reads import ReadContext, ReadStats, answer
from qim.agents.mailbox.shard import OwnedShard, encode_floor
from qim.schemas.records.push import ConnClosed, PresenceStale, PushEvidence
from qim.schemas.records.user_requests import (
    MailboxReply,
    PullSessionListRequest,
    SyncAuthRequest,
    UserStateRequest,
    decode_user_request,
    encode_user_record,
)

__all__ = ["CommitPlan", "plan_commit", "replies_for", "send_replies"]

log = logging.getLogger(__name__)


@dataclass
class CommitPlan:
    """One offset commit: the offsets, and the floor each dispatch offset's metadata carries."""

    offsets: dict[TopicPartition, OffsetAndMetadata] = field(default_factory=dict)
    floors: dict[int, tuple[int, ...]] = field(default_factory=dict)


def plan_commit(
    owned: Mapping[int, OwnedShard],
    request_offsets: Mapping[int, int],
    *,
    assigned: Iterable[TopicPartition],
    shard_epoch: int,
    dispatch_topic: str,
    requests_topic: str,
) -> CommitPlan:
    """Dispatch offsets of shards with news (bookkeeping + floor), request offsets answered."""
    mine = set(assigned)
    plan = CommitPlan()
    for p, shard in sorted(owned.items()):
        tp = TopicPartition(dispatch_topic, p)
        if shard.dirty and tp in mine:
            plan.floors[p] = floor = shard.floor_to_publish()
            metadata = encode_floor(shard_epoch, floor)
            plan.offsets[tp] = OffsetAndMetadata(shard.next_offset, metadata)
    for p, offset in sorted(request_offsets.items()):
        tp = TopicPartition(requests_topic, p)
        if tp in mine:
            plan.offsets[tp] = OffsetAndMetadata(offset, "")
    return plan


def replies_for(
    shard: OwnedShard | None,
    partition: int,
    records: Sequence[Any],
    ctx: ReadContext,
    metrics: MailboxMetrics,
) -> list[MailboxReply]:
    """The replies to one fetched run of a user-requests partition, in request order.

    Undecodable records are counted and skipped (a newer kind included: deploy consumers
    first); PRESENCE_STALE belongs to the push path and is only counted here. A request whose
    answer raised (our bug) gets no reply: the gateway's timeout and the client's retry apply.
    """
    replies = []
    for record in records:
        try:
            request = decode_user_request(record.value)
        except (msgspec.DecodeError, msgspec.ValidationError, TypeError):
            metrics.on_record("user-requests", "malformed")
            continue
        if isinstance(request, PresenceStale):
            metrics.on_record("user-requests", "presence_stale")
            continue
        if isinstance(request, PushEvidence | ConnClosed):  # the second check's (16.1.2)
            kind = "push_evidence" if isinstance(request, PushEvidence) else "conn_closed"
            metrics.on_record("user-requests", kind)
            continue
        if isinstance(request, UserStateRequest):  # appended to the log by the node, no reply
            continue
        kind = (
            "sync_auth"
            if isinstance(request, SyncAuthRequest)
            else "pull_session_list"
            if isinstance(request, PullSessionListRequest)
            else "pull_mailbox"
        )
        stats = ReadStats()
        try:
            reply = answer(shard, partition, request, ctx, stats)
        except Exception:  # a bug of ours (SyncInvariantError...): never the client's fault
            log.exception("shard %d: %s request of %s failed", partition, kind, request.user_id)
            metrics.on_record("user-requests", "failed")
            continue
        metrics.on_reply(kind, None if reply.error is None else reply.error.code)
        metrics.on_read(kind, stats)
        replies.append(reply)
    return replies


async def send_replies(
    producer: AIOKafkaProducer, topic: str, replies: Sequence[MailboxReply]
) -> None:
    """Produce every reply at its ConnectionShard partition; failures are logged, not raised:
    a lost reply costs the gateway a timeout and the client a retry, never state."""
    sends = []
    for reply in replies:
        try:
            sends.append(
                await producer.send(
                    topic, encode_user_record(reply), key=reply.key, partition=reply.partition
                )
            )
        except Exception:
            log.exception("reply to connection shard %d not sent", reply.partition)
    for outcome in await asyncio.gather(*sends, return_exceptions=True):
        if isinstance(outcome, BaseException):
            log.warning("reply not acknowledged: %s", outcome)
