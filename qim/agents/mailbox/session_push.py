"""SESSION_DELTA / BADGE_UPDATE / READ_SYNC from a committed fold to the user's online devices.

Same order and contract as the message push (``mailbox_push``, 11.1.2): planned only after the
WriteBatch is durable, read back from the committed store (the projection the fold wrote, so
a frame carries exactly the values a PULL_SESSION_LIST would return, INV-22), fire and forget
(a lost frame is repaired by the next absolute one or a pull, 12.6). One SESSION_DELTA per
touched conversation per fold (a fold already merges its own updates); the ConnectionNode then
merges across folds within ``session_delta_merge_window`` (``qim.gateway.push.delta_merge``: later
values replace earlier ones, never summed). Replay below the takeover point pushes nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer

from qim.agents.keyring import BodyKeys
from qim.core.mailbox.ports import KVReader
from qim.core.mailbox.session_store import load_header, load_row, load_state, shown_preview
from qim.core.mailbox.sessions import SessionChange
from qim.core.push import ShardPresenceCache
from qim.core.session_list import badge_update, session_delta
from qim.schemas.frames.control import ReadSync
from qim.schemas.records.session_push import SessionPush, encode_session_push

__all__ = ["plan_session_pushes", "send_session_pushes"]

log = logging.getLogger(__name__)


def plan_session_pushes(
    store: KVReader,
    changes: Sequence[SessionChange],
    *,
    presence: ShardPresenceCache | None,
    mailbox_shard: int,
    now_ms: int,
    bodies: BodyKeys | None = None,
) -> list[SessionPush]:
    """One SessionPush per online device of each changed user (nothing when the cache is
    still rebuilding: the client pulls)."""
    if presence is None:
        return []
    out: list[SessionPush] = []
    for change in changes:
        devices = presence.devices(change.tenant_id, change.user_id, now_ms)
        if not devices:
            continue
        tenant, user = change.tenant_id, change.user_id
        deltas = []
        for conv, key in change.touched:  # only the touched rows are read
            row = load_row(store, tenant, user, conv)
            if row is None:
                continue
            state = load_state(store, tenant, user, conv)
            preview = shown_preview(store, tenant, conv, row.latest_conversation_seq, state)
            if bodies is not None:  # the SESSION_DELTA preview fill (21.3.4)
                preview = bodies.open_preview(preview, tenant, conv)
            deltas.append(
                session_delta(
                    row,
                    state,
                    driving_event_id=key[2],
                    driving_mailbox_seq=key[0],
                    preview=preview,
                )
            )
        b = load_header(store, tenant, user).badge
        seq = b.badge_projection_mailbox_seq
        badge = (
            badge_update(b.total_unread, b.total_mention, b.muted_unread, seq)
            if change.badge_changed
            else None
        )
        for device in devices:
            reads = tuple(
                ReadSync(conversation_id=conv, read_conversation_seq=seq)
                for conv, seq, origin in change.read_advanced
                if origin != device.device_id
            )
            if not (deltas or badge or reads):
                continue
            out.append(
                SessionPush(
                    tenant_id=tenant,
                    user_id=change.user_id,
                    device_id=device.device_id,
                    connection_id=device.connection_id,
                    session_epoch=device.session_epoch,
                    connection_shard=device.connection_shard,
                    mailbox_shard=mailbox_shard,
                    deltas=tuple(deltas),
                    badge=badge,
                    read_syncs=reads,
                )
            )
    return out


async def send_session_pushes(
    producer: AIOKafkaProducer,
    topic: str,
    pushes: Sequence[SessionPush],
    tasks: set[asyncio.Task[None]],
) -> None:
    """Enqueue every record at its ConnectionShard; acks are gathered in the background."""
    futures = []
    for push in pushes:
        try:
            futures.append(
                await producer.send(
                    topic, encode_session_push(push), key=push.key, partition=push.partition
                )
            )
        except Exception:
            log.exception("SessionPush to connection shard %d not sent", push.partition)
    if futures:
        task = asyncio.ensure_future(_gather(futures))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def _gather(futures: Sequence[asyncio.Future[object]]) -> None:
    outcomes = await asyncio.gather(*futures, return_exceptions=True)
    failed = sum(isinstance(o, BaseException) for o in outcomes)
    if failed:
        log.warning("%d SessionPush record(s) not acknowledged", failed)
