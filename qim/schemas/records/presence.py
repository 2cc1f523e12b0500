"""PresenceEntry (§7.10) as a record of the compacted presence topic, and its key and partition.

Pure: no Kafka here. The ConnectionNode that owns a ConnectionShard is the only writer
(§5.4.2). The record's key is ``(tenant_id, user_id, device_id)`` in the project's one
canonical multi-field encoding (:func:`qim.schemas.hash_input`: UTF-8, NUL-separated), so a
compacted topic keeps exactly one record per device. The partition is **explicit**: the user's
``mailbox_shard_id`` (direction.md §3), never a key hash, so a MailboxNode reads presence for
exactly the users of the shards it owns. A null value is a tombstone.

The value is a msgpack map (msgspec, like frame bodies), defaults omitted, unknown keys
ignored on decode so fields can be added (§27.2.1).

TODO(lead): the MailboxNode decodes this record too, and agents may not import the gateway
(tests/unit/test_architecture.py); the record belongs in ``qim/schemas``. It has no I/O, so
moving it is a file move.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import msgspec

from qim.schemas import hash_input, mailbox_shard_id, parse_hash_input, user_bucket
from qim.schemas.frames import U32, U64

__all__ = [
    "PresenceEntry",
    "PresenceKey",
    "decode_presence",
    "encode_presence",
]


@dataclass(frozen=True, slots=True, order=True)
class PresenceKey:
    """The compacted topic's key: one record per (tenant, user, device)."""

    tenant_id: str
    user_id: str
    device_id: str

    def encode(self) -> bytes:
        return hash_input(self.tenant_id, self.user_id, self.device_id)

    @classmethod
    def decode(cls, data: bytes) -> PresenceKey:
        tenant, user, device = parse_hash_input(data, (str, str, str))
        assert isinstance(tenant, str) and isinstance(user, str) and isinstance(device, str)
        return cls(tenant, user, device)

    def partition(self, *, virtual_bucket_count: int, mailbox_shard_count: int) -> int:
        """The user's mailbox_shard_id: presence is co-partitioned with the mailbox (§5.4.2)."""
        bucket = user_bucket(self.tenant_id, self.user_id, virtual_bucket_count)
        return mailbox_shard_id(bucket, mailbox_shard_count)


class PresenceEntry(
    msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=False, frozen=True
):
    """One online device (§7.10): where its connection is and until when the lease holds.

    ``capabilities`` keeps the AUTH bits; ``protocol_version`` is the negotiated Ve (§27.1.1
    stores both in PresenceEntry.capabilities). ``lease_expire_at`` is epoch ms; an entry not
    renewed by then is offline (§5.4.3 (3)).
    """

    tenant_id: str
    user_id: str
    device_id: str
    connection_id: str
    node_id: str
    connection_shard: U32
    session_epoch: U64
    capabilities: U64 = 0
    protocol_version: U32 = 1
    client_platform: str = ""
    lease_expire_at: U64 = 0

    @property
    def key(self) -> PresenceKey:
        return PresenceKey(self.tenant_id, self.user_id, self.device_id)

    def is_online(self, now_ms: int) -> bool:
        """A reader's rule: online only while the lease holds (5.4.3 (3)); a gateway that died
        without a tombstone makes its devices offline when their leases run out."""
        return now_ms < self.lease_expire_at


_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODER: Final = msgspec.msgpack.Decoder(PresenceEntry)


def encode_presence(entry: PresenceEntry) -> bytes:
    return _ENCODER.encode(entry)


def decode_presence(value: bytes | None) -> PresenceEntry | None:
    """None for a tombstone; raises msgspec.DecodeError on a value that is not an entry."""
    return None if value is None else _DECODER.decode(value)
