"""The MailboxNode's online push: written event groups -> PushBatches on ``qim.to-gateway``.

Fixed order (11.1.2, I-18): the service calls :func:`plan_batch_pushes` only after the
WriteBatch of a materialize call is durable and ``W[]`` advanced, so every pushed entry is one
a PULL_MAILBOX would also return. The entries are read back from the committed store (one
prefix seek per written group), not rebuilt from the dispatch: the store is the one source of
what was materialized, and a dispatch resolved later from its pending slot has no record in
the batch at hand.

Fire-and-forget (11.2): :func:`send_pushes` only enqueues the records and hands the broker
acknowledgements to a background gather that logs and counts failures. Nothing here raises
into the fold, blocks it on an acknowledgement, or writes the mailbox.

What is deliberately not pushed (counted, never an error):

* records below the dispatch partition's end at takeover (``OwnedShard.high_water``): that is
  replay -- the previous owner pushed them, or the client pulls them; pushing days of a
  rebuilt log to online devices would be a storm, not a delivery;
* groups of a shard whose presence cache is still rebuilding (``qim.agents.mailbox.presence``).

Priority: ``direct`` for one-to-one, ``small_group`` otherwise -- the dispatch does not carry
the member count, and ``large_group`` needs it (11.3.2): a known gap until it does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec
from aiokafka import AIOKafkaProducer

from qim.agents.keyring import BodyKeys, opened_entry
from qim.core.mailbox import MailboxReader, WrittenGroup
from qim.core.push import MaterializedEntry, PushPlan, ShardPresenceCache, plan_push
from qim.schemas.frames.mailbox import SyncEntry
from qim.schemas.records.dispatch import GroupDispatch, ShardLogRecord
from qim.schemas.records.push import FramePriority, PushBody, encode_push_record
from qim.schemas.seqs import compose_mailbox_seq, split_mailbox_seq

__all__ = ["PushOutcome", "plan_batch_pushes", "push_body_from", "send_pushes"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PushOutcome:
    """What one fold's push step decided, for the metrics."""

    plans: tuple[PushPlan, ...]
    skipped_replay: int  # written groups below the takeover end offset
    skipped_rebuilding: int  # written groups of a shard whose presence cache is rebuilding
    failed_plans: int  # messages whose entries the planner refused (a bug of ours)


def push_body_from(
    reader: MailboxReader, tenant_id: str, entry: SyncEntry, bodies: BodyKeys | None = None
) -> PushBody | None:
    """The message's body: inline on the entry, else the shard's stored copy; None if gone.
    A sealed body is opened here (the PUSH_EVENTS decrypt point, 21.3.4)."""
    if entry.body_included:
        entry = opened_entry(bodies, tenant_id, entry)
        return PushBody(
            message_type=entry.message_type,
            custom_type=entry.custom_type,
            schema_version=entry.schema_version,
            payload_or_ciphertext=entry.payload_or_ciphertext,
        )
    stored = reader.body(tenant_id, entry.message_id)
    if stored is None:
        return None
    joined = opened_entry(
        bodies,
        tenant_id,
        msgspec.structs.replace(entry, payload_or_ciphertext=stored.payload),
    )
    return PushBody(
        message_type=stored.message_type,
        custom_type=stored.custom_type or None,
        schema_version=stored.schema_version or None,
        payload_or_ciphertext=joined.payload_or_ciphertext,
    )


def _priority(dispatch: ShardLogRecord | None) -> FramePriority:
    if isinstance(dispatch, GroupDispatch) and dispatch.conversation_kind == "direct":
        return "direct"
    return "small_group"


def plan_batch_pushes(
    written: Sequence[WrittenGroup],
    batch: Sequence[tuple[int, ShardLogRecord]],
    *,
    reader: MailboxReader,
    mailbox_shard: int,
    shard_epoch: int,
    push_from_offset: int,
    presence: ShardPresenceCache | None,
    now_ms: int,
    bodies: BodyKeys | None = None,
) -> PushOutcome:
    """The PushPlans of one committed WriteBatch: one per message (module doc)."""
    by_offset = dict(batch)
    fresh = [g for g in written if split_mailbox_seq(g.mailbox_seq).log_offset >= push_from_offset]
    replay = len(written) - len(fresh)
    if presence is None:
        return PushOutcome((), replay, len(fresh), 0)
    messages: dict[tuple[str, int, bytes], list[MaterializedEntry]] = {}
    for group in sorted(fresh, key=lambda g: (g.mailbox_seq, g.tenant_id, g.user_id)):
        for _, rows in reader.read_user_range(
            group.tenant_id, group.user_id, group.mailbox_seq - 1, group.mailbox_seq
        ):
            for entry in rows:
                key = (group.tenant_id, group.mailbox_seq, entry.message_id)
                messages.setdefault(key, []).append(MaterializedEntry(group.user_id, entry))
    plans: list[PushPlan] = []
    failed = 0
    for (tenant, seq, _), entries in messages.items():
        offset = split_mailbox_seq(seq).log_offset
        try:
            plans.append(
                plan_push(
                    entries,
                    tenant_id=tenant,
                    mailbox_shard=mailbox_shard,
                    presence=presence,
                    now_ms=now_ms,
                    body=push_body_from(reader, tenant, entries[0].entry, bodies),
                    priority=_priority(by_offset.get(offset)),
                )
            )
        except ValueError:
            log.exception(
                "shard %d: push of %s not planned", mailbox_shard,
                compose_mailbox_seq(shard_epoch, offset),
            )  # fmt: skip
            failed += 1
    return PushOutcome(tuple(plans), replay, 0, failed)


async def send_pushes(
    producer: AIOKafkaProducer,
    topic: str,
    plans: Sequence[PushPlan],
    *,
    on_done: Callable[[int, int], None],
    tasks: set[asyncio.Task[None]],
) -> int:
    """Enqueue every PushBatch at its ConnectionShard partition; returns how many.

    The acknowledgements are gathered by a background task (kept in ``tasks`` so it is not
    collected early) that calls ``on_done(acknowledged, failed)``. A send that cannot even be
    enqueued counts as failed at once.
    """
    futures = []
    failed = 0
    for plan in plans:
        for batch in plan.batches:
            try:
                futures.append(
                    await producer.send(
                        topic, encode_push_record(batch), key=batch.key, partition=batch.partition
                    )
                )
            except Exception:
                log.exception("PushBatch to connection shard %d not sent", batch.partition)
                failed += 1
    if failed:
        on_done(0, failed)
    if futures:
        task = asyncio.ensure_future(_gather(futures, on_done))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    return len(futures)


async def _gather(
    futures: Sequence[asyncio.Future[object]], on_done: Callable[[int, int], None]
) -> None:
    outcomes = await asyncio.gather(*futures, return_exceptions=True)
    failed = sum(isinstance(o, BaseException) for o in outcomes)
    if failed:
        log.warning("%d PushBatch(es) not acknowledged", failed)
    on_done(len(outcomes) - failed, failed)
