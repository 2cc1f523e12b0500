"""Ephemeral custom messages (spec 13.3 ``delivery_class=ephemeral``, 13.2 transient delivery).

A SEND_MESSAGE of a declared ``ephemeral`` type passes the ConversationWriter's membership
and type checks like any send, then takes the transient path instead of the commit log:

* it is never appended to the outbox, so it is in no mailbox, history, session list, unread
  count or offline push (INV-33), and takes no ``conversation_seq`` and no activity id;
* it gets a *transient* ``message_id`` from the writer's HLC (unique and time-ordered among
  the partition's ids, so a client's ``(message_id, event_id)`` dedup keeps two of them
  apart), and the sender a ``SEND_ACK`` with ``conversation_seq`` 0;
* the other members' online devices **and the sender's other devices** get it as a
  ``PUSH_EVENTS`` entry (:func:`ephemeral_entry`: ``mailbox_seq`` 0, flags 0, the body
  inline), one :class:`~qim.schemas.records.transient.EphemeralRelay` per ConnectionShard
  (:func:`ephemeral_relays`); DEGRADED connections drop it first (11.3);
* above ``large_group_member_threshold`` members it is refused, not silently dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from qim.core.transient.typing_relay import by_connection_shard
from qim.schemas.frames.base import U128_ZERO, EventType
from qim.schemas.frames.mailbox import SyncEntry
from qim.schemas.message_types import MessageType
from qim.schemas.records.requests import SendRequest
from qim.schemas.records.transient import EphemeralRelay

__all__ = ["ephemeral_entry", "ephemeral_relays"]


def ephemeral_entry(
    request: SendRequest, message_id: bytes, created_at: int, schema_version: int
) -> SyncEntry:
    """The A.4.1 entry of an ephemeral message: a body with no mailbox reference.

    ``mailbox_seq`` / ``conversation_seq`` 0 and no ``last_activity_id``: it moves no cursor
    and no session; flags 0: it counts nothing and is on no timeline, which every client
    applies even to a type it does not know (13.3's hard requirement)."""
    msg = request.message
    return SyncEntry(
        event_type=EventType.MESSAGE,
        message_id=message_id,
        conversation_id=msg.conversation_id,
        last_activity_id=U128_ZERO,
        sender_id=request.sender_id,
        flags=0,
        created_at=created_at,
        client_message_id=msg.client_message_id or None,
        origin_device_id=request.sender_device_id or None,
        body_included=True,
        message_type=MessageType.CUSTOM,
        custom_type=msg.custom_type,
        schema_version=schema_version,
        payload_or_ciphertext=msg.payload,
    )


def ephemeral_relays(
    request: SendRequest,
    entry: SyncEntry,
    members: Iterable[str],
    shard_of: Callable[[str], int],
) -> list[EphemeralRelay]:
    """One relay per ConnectionShard holding a member (the sender included, for the other
    devices; the gateway skips the sending device), shards ascending."""
    shards = by_connection_shard(members, shard_of)
    return [
        EphemeralRelay(
            tenant_id=request.tenant_id,
            conversation_id=entry.conversation_id,
            sender_id=request.sender_id,
            origin_device_id=request.sender_device_id,
            connection_shard=shard,
            recipients=users,
            entry=entry,
        )
        for shard, users in shards.items()
    ]
