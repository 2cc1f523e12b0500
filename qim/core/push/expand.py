"""The ConnectionNode's expansion of a PushBatch into per-connection pushes (spec 11.1.1).

For each recipient of the batch:

1. its ``connection_id`` is not a local connection (or names another device) -> drop that
   recipient only, answer PRESENCE_STALE (reason ``unknown_connection``);
2. the connection's ``session_epoch`` differs -> drop, PRESENCE_STALE (``epoch_mismatch``):
   the old connection was replaced and writing a replaced session's push into the new one is
   forbidden (15.2.2, I-20, 26.5.2);
3. otherwise the recipient's event joins that connection's :class:`PendingPush`, which becomes
   one ``PUSH_EVENTS{events, last_pushed_user_seq}`` on stream 1 when the connection's
   :class:`~qim.core.push.connection.ConnectionPush` writes it.

Why the frame is not built here: ``last_pushed_user_seq`` is "the largest mailbox_seq written
to this socket" (15.1.1, I-21), and whether an event is written now, queued behind the login
barrier (9.4) or dropped by flow control (11.3) is the connection's decision, so the value is
known only when the frame goes out. The common fragment is built once per batch and shared by
every connection (10.3, 11.1.1 "zero copy"); the ConnectionNode never reads or decodes a body.

A recipient dropped here costs no durability: the entry is in the mailbox (11.1.2).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from qim.core.push.wire import EntryFragment, PendingPush, common_fragment, personal_fragment
from qim.schemas.records.push import (
    STALE_EPOCH_MISMATCH,
    STALE_UNKNOWN_CONNECTION,
    PresenceStale,
    PushBatch,
    PushRecipient,
)

__all__ = ["Delivery", "Expansion", "LocalConnection", "expand_batch"]


class LocalConnection(Protocol):
    """What expansion needs to know of a live local connection (the gateway's session)."""

    @property
    def tenant_id(self) -> str: ...
    @property
    def user_id(self) -> str: ...
    @property
    def device_id(self) -> str: ...
    @property
    def session_epoch(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Delivery:
    """This batch's events for one local connection; feed it to that ConnectionPush."""

    connection_id: str
    pending: PendingPush


@dataclass(frozen=True, slots=True)
class Expansion:
    """Deliveries in first-recipient order, and the PRESENCE_STALE replies to produce."""

    deliveries: tuple[Delivery, ...]
    stale: tuple[PresenceStale, ...]


def expand_batch(batch: PushBatch, connections: Mapping[str, LocalConnection]) -> Expansion:
    """Apply the 11.1.1 rules to every recipient of ``batch`` (module doc)."""
    stale: dict[tuple[str, str, str, int], PresenceStale] = {}  # one reply per device
    events: dict[str, list[tuple[PushRecipient, EntryFragment]]] = {}
    for recipient in batch.recipients:
        reason = _check(batch.tenant_id, recipient, connections.get(recipient.connection_id))
        if reason is not None:
            device = (
                recipient.user_id,
                recipient.device_id,
                recipient.connection_id,
                recipient.session_epoch,
            )
            stale.setdefault(device, _stale(batch, recipient, reason))
            continue
        events.setdefault(recipient.connection_id, []).append(
            (recipient, personal_fragment(recipient))
        )
    common = common_fragment(batch) if events else EntryFragment(b"", 0)
    deliveries = []
    for connection_id, items in events.items():
        items.sort(key=lambda item: (item[0].mailbox_seq, item[0].event_ordinal, item[0].event_id))
        pending = PendingPush(
            mailbox_seq=max(r.mailbox_seq for r, _ in items),
            common=common,
            events=tuple(fragment for _, fragment in items),
            priority=batch.priority,
        )
        deliveries.append(Delivery(connection_id, pending))
    return Expansion(tuple(deliveries), tuple(stale.values()))


def _check(tenant_id: str, recipient: PushRecipient, conn: LocalConnection | None) -> str | None:
    if conn is None or (conn.tenant_id, conn.user_id, conn.device_id) != (
        tenant_id,
        recipient.user_id,
        recipient.device_id,
    ):
        return STALE_UNKNOWN_CONNECTION
    if conn.session_epoch != recipient.session_epoch:
        return STALE_EPOCH_MISMATCH
    return None


def _stale(batch: PushBatch, recipient: PushRecipient, reason: str) -> PresenceStale:
    return PresenceStale(
        tenant_id=batch.tenant_id,
        user_id=recipient.user_id,
        device_id=recipient.device_id,
        connection_id=recipient.connection_id,
        observed_epoch=recipient.session_epoch,
        reason=reason,
        mailbox_shard=batch.mailbox_shard,
    )
