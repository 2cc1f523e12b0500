"""The per-message trace lines of spec 24.2, one helper per stage, for the services to call.

Kept out of the services so each adds one call: the writer at commit (``committed``), the
FanoutCoordinator per acknowledged GroupDispatch (``dispatched``: one line per target
MailboxShard, the "child span" of 24.2, never one per recipient), the MailboxNode per
GroupDispatch of a written WriteBatch (``mailboxed``). The gateway logs ``acked`` itself. All
lines share ``trace_id`` (derived from ``message_id``, see :mod:`qim.observability.logging`)
and are sampled by it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from qim.observability.logging import trace
from qim.schemas.records import GroupDispatch, MessageCommitted, OutboxRecord
from qim.schemas.records.dispatch import ShardLogRecord
from qim.schemas.seqs import compose_mailbox_seq

__all__ = ["committed", "dispatched", "mailboxed"]


def committed(log: logging.Logger, appended: Iterable[tuple[OutboxRecord, int]]) -> None:
    """The writer's transaction with these outbox records committed (SEND_ACK may go out)."""
    for record, offset in appended:
        if isinstance(record, MessageCommitted):
            trace(
                log, f"committed at outbox offset {offset}", stage="committed",
                message_id=record.message_id, tenant_id=record.tenant_id,
                conversation_id=record.conversation_id,
                conversation_seq=record.conversation_seq,
                client_message_id=record.client_message_id,
                membership_version=record.membership_version,
                device_id=record.origin_device_id,
            )  # fmt: skip


def dispatched(log: logging.Logger, dispatches: Sequence[ShardLogRecord]) -> None:
    """GroupDispatches acknowledged by the dispatch log."""
    for d in dispatches:
        if isinstance(d, GroupDispatch):
            trace(
                log, "dispatched", stage="dispatched", message_id=d.message_id,
                tenant_id=d.tenant_id, conversation_id=d.conversation_id,
                dispatch_id=d.dispatch_id, mailbox_shard=d.partition,
            )  # fmt: skip


def mailboxed(
    log: logging.Logger,
    shard: int,
    shard_epoch: int,
    batch: Sequence[tuple[int, ShardLogRecord]],
    node_id: str = "",
) -> None:
    """The WriteBatch holding these dispatches committed (their entries are MAILBOXED)."""
    for offset, d in batch:
        if isinstance(d, GroupDispatch):
            trace(
                log, "mailboxed", stage="mailboxed", message_id=d.message_id,
                tenant_id=d.tenant_id, conversation_id=d.conversation_id,
                dispatch_id=d.dispatch_id, mailbox_shard=shard, shard_epoch=shard_epoch,
                mailbox_seq=compose_mailbox_seq(shard_epoch, offset), mailbox_node_id=node_id,
            )  # fmt: skip
