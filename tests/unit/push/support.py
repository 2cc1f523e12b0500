"""Builders shared by the push tests: presence entries, materialized entries, local connections.

Users are real ids routed with the production hash (5.2), so connection shards come out the way
a deployment would see them: one MailboxShard's users spread over conn/mailbox ConnectionShards.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from functools import cache

from qim.core.push import (
    ENTRY_OVERHEAD_BYTES,
    BarrierState,
    ConnectionPush,
    EntryFragment,
    FlowState,
    MaterializedEntry,
    PendingPush,
    ShardPresenceCache,
)
from qim.schemas import (
    compose_mailbox_seq,
    connection_shard_id,
    mailbox_shard_id,
    user_bucket,
)
from qim.schemas.frames import EntryFlags, EventType, SyncEntry
from qim.schemas.records.presence import PresenceEntry

T = "t1"
SHARD = 5  # the MailboxShard under test (of 64)
TTL = 30_000  # presence_lease_ttl (B.4)
NOW = 1_700_000_000_000
MESSAGE_ID = (42).to_bytes(16, "big")
ACTIVITY_ID = (4242).to_bytes(16, "big")


@cache
def shard_users(count: int, shard: int = SHARD) -> tuple[str, ...]:
    """``count`` user ids whose mailbox shard is ``shard`` (default 64 shards)."""
    out: list[str] = []
    i = 0
    while len(out) < count:
        user = f"user-{i:06d}"
        if mailbox_shard_id(user_bucket(T, user)) == shard:
            out.append(user)
        i += 1
    return tuple(out)


def conn_shard(user: str) -> int:
    return connection_shard_id(user_bucket(T, user))


def presence(
    user: str,
    device: str = "phone",
    *,
    epoch: int = 1,
    lease: int = NOW + TTL,
    connection_id: str | None = None,
) -> PresenceEntry:
    return PresenceEntry(
        tenant_id=T,
        user_id=user,
        device_id=device,
        connection_id=connection_id or f"c:{user}:{device}:{epoch}",
        node_id="gw-1",
        connection_shard=conn_shard(user),
        session_epoch=epoch,
        lease_expire_at=lease,
    )


def cache_with(*entries: PresenceEntry, shard: int = SHARD) -> ShardPresenceCache:
    cache_ = ShardPresenceCache(shard)
    for entry in entries:
        cache_.apply(entry.key, entry, NOW)
    return cache_


def entry(
    user: str,
    *,
    sender: str = "alice",
    offset: int = 100,
    event_type: int = EventType.MESSAGE,
    origin_device_id: str | None = None,
    client_message_id: str | None = None,
) -> MaterializedEntry:
    """One recipient's durable entry of message 42 (the 7.3 reference part)."""
    return MaterializedEntry(
        user,
        SyncEntry(
            mailbox_seq=compose_mailbox_seq(1, offset),
            event_ordinal=event_type,
            event_id=zlib.crc32(user.encode()) * 4 + event_type,
            event_type=event_type,
            message_id=MESSAGE_ID,
            conversation_id="g:big",
            conversation_seq=7,
            last_activity_id=ACTIVITY_ID,
            sender_id=sender,
            flags=0 if user == sender else int(EntryFlags.COUNTS_UNREAD),
            created_at=NOW - 5,
            origin_device_id=origin_device_id,
            client_message_id=client_message_id if user == sender else None,
        ),
    )


@dataclass(frozen=True)
class Conn:
    """A local connection as the gateway knows it (expand.LocalConnection)."""

    tenant_id: str
    user_id: str
    device_id: str
    session_epoch: int


def pending(seq: int, ledger_bytes: int = 164) -> PendingPush:
    """A one-event push for ``seq`` whose ledger charge is exactly ``ledger_bytes`` (filler
    bytes, never decoded: the barrier and flow tests only count)."""
    filler = ledger_bytes - ENTRY_OVERHEAD_BYTES
    return PendingPush(seq, EntryFragment(b"\x00" * filler, 0), (EntryFragment(b"", 0),))


def flow_state(push: ConnectionPush) -> FlowState:
    """Read through a call so mypy does not keep a narrowed state across transitions."""
    return push.flow.state


def barrier_state(push: ConnectionPush) -> BarrierState:
    return push.barrier.state
