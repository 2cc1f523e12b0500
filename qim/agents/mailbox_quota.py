"""Publish a user's ``max_conversations_per_user`` crossing on ``qim.user-quota`` (I-26).

Like the session pushes (``mailbox_session_push``): planned after the WriteBatch is durable,
from the committed store (``qim.core.mailbox.quota``), and never raising into the fold. Unlike
them it is state, not a frame: a crossing is rare, so its acks are awaited here (a failure is
logged; the next crossing of that user republishes the state), and a replayed fold below the
takeover point publishes too (the topic is compacted by user: the same value again is harmless).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer

from qim.core.mailbox.ports import KVReader
from qim.core.mailbox.quota import plan_quota_records
from qim.core.mailbox.sessions import SessionChange
from qim.schemas.records.user_quota import encode_user_quota

__all__ = ["publish_quota"]

log = logging.getLogger(__name__)


async def publish_quota(
    producer: AIOKafkaProducer,
    topic: str,
    store: KVReader,
    changes: Sequence[SessionChange],
    *,
    limit: int,
    mailbox_shard: int,
    as_of_mailbox_seq: int,
) -> int:
    """Send one record per user whose fold crossed ``limit``; returns how many were acked."""
    try:
        records = plan_quota_records(
            store,
            changes,
            limit=limit,
            mailbox_shard=mailbox_shard,
            as_of_mailbox_seq=as_of_mailbox_seq,
        )
        futures = [
            await producer.send(topic, encode_user_quota(r), key=r.key, partition=r.partition)
            for r in records
        ]
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
    except Exception:
        log.exception("shard %d: user-quota publish failed", mailbox_shard)
        return 0
    failed = sum(isinstance(o, BaseException) for o in outcomes)
    if failed:
        log.warning("shard %d: %d user-quota record(s) not acknowledged", mailbox_shard, failed)
    for r in records:
        log.info(
            "user-quota: %s/%s conversations=%d exhausted=%s",
            r.tenant_id,
            r.user_id,
            r.conversations,
            r.exhausted,
        )
    return len(records) - failed
