"""Prekey requests (gateway -> key worker) and replies (-> gateway), spec 7.14 / 22.2.

Topics:

* ``qim.prekey-requests``: key :func:`~qim.schemas.records.requests.user_key` of the bundle
  **owner** (the publisher for PREKEY_PUBLISH, the target user for PREKEY_FETCH), explicit
  partition = :func:`prekey_partition` (blake3 of that key, like ``conversation_partition``).
  One partition has one consumer in the ``qim-keys`` group, so every publish and fetch of one
  user's bundles is applied by one owner, in log order: that is what makes "each one-time
  prekey is handed out once" hold under concurrent fetches from any number of gateways.
* ``qim.to-gateway``: :class:`PrekeyReply` (``kind="prekey_reply"``) at explicit partition =
  ``connection_shard``, next to the writer's and MailboxNode's replies.

Wire shape (msgpack maps, defaults omitted, unknown keys ignored)::

    PrekeyPublishRequest kind="prekey_publish"   session identity + message: PrekeyPublish
    PrekeyFetchRequest   kind="prekey_fetch"     session identity + message: PrekeyFetch
    PrekeyReply          kind="prekey_reply"
      tenant_id, user_id, device_id, session_epoch, connection_shard, request_id
      exactly one of: bundles: PrekeyFetchDown | error: Error

A reply with ``session_epoch=0`` and ``request_id=0`` is server-initiated (the low-water notice
to the bundle's owner device): the gateway writes it to whichever session the device has.
"""

from __future__ import annotations

from typing import Final, TypeAlias

import msgspec

from qim.schemas.frames.base import U32, U64
from qim.schemas.frames.connection import Error
from qim.schemas.frames.e2ee import PrekeyFetch, PrekeyFetchDown, PrekeyPublish
from qim.schemas.hashing import blake3_digest
from qim.schemas.records.requests import user_key

__all__ = [
    "PrekeyFetchRequest",
    "PrekeyPublishRequest",
    "PrekeyReply",
    "PrekeyRequest",
    "decode_prekey_reply",
    "decode_prekey_request",
    "encode_prekey_record",
    "prekey_partition",
]


class _Record(
    msgspec.Struct,
    kw_only=True,
    omit_defaults=True,
    frozen=True,
    forbid_unknown_fields=False,
    tag_field="kind",
):
    """Tagged msgpack map, like the other request records."""


class _FromSession(_Record, kw_only=True, frozen=True):
    """Who asked (the authenticated session, never the frame) and where the reply goes."""

    tenant_id: str
    user_id: str
    device_id: str
    session_epoch: U64
    connection_shard: U32
    request_id: U32 = 0


def prekey_partition(tenant_id: str, owner_user_id: str, partition_count: int) -> int:
    """``be_u64(blake3(tenant 0x00 user)[0:8]) mod partition_count``: every gateway picks the
    owner's partition with no client-library partitioner."""
    if partition_count <= 0:
        raise ValueError("partition_count must be positive")
    digest = blake3_digest(user_key(tenant_id, owner_user_id))
    return int.from_bytes(digest[:8], "big") % partition_count


class PrekeyPublishRequest(_FromSession, tag="prekey_publish", kw_only=True, frozen=True):
    """PREKEY_PUBLISH of the session's own device (the owner is the session's user)."""

    message: PrekeyPublish

    @property
    def owner_key(self) -> bytes:
        return user_key(self.tenant_id, self.user_id)


class PrekeyFetchRequest(_FromSession, tag="prekey_fetch", kw_only=True, frozen=True):
    """PREKEY_FETCH of another (or the same) user's devices in the session's tenant."""

    message: PrekeyFetch

    @property
    def owner_key(self) -> bytes:
        return user_key(self.tenant_id, self.message.target_user_id)


PrekeyRequest: TypeAlias = PrekeyPublishRequest | PrekeyFetchRequest


class PrekeyReply(_Record, tag="prekey_reply", kw_only=True, frozen=True):
    """The key worker's answer (or notice) for the gateway owning ``connection_shard``."""

    tenant_id: str
    user_id: str
    device_id: str
    session_epoch: U64 = 0
    connection_shard: U32
    request_id: U32 = 0
    bundles: PrekeyFetchDown | None = None
    error: Error | None = None

    def __post_init__(self) -> None:
        if (self.bundles is None) == (self.error is None):
            raise ValueError("a PrekeyReply carries exactly one of bundles and error")

    @property
    def body(self) -> PrekeyFetchDown | Error:
        return self.bundles if self.bundles is not None else self.error  # type: ignore[return-value]

    @property
    def key(self) -> bytes:
        return user_key(self.tenant_id, self.user_id)

    @property
    def partition(self) -> int:
        return self.connection_shard


_ENC: Final = msgspec.msgpack.Encoder()
_REQUESTS: msgspec.msgpack.Decoder[PrekeyRequest] = msgspec.msgpack.Decoder(PrekeyRequest)
_REPLY: Final = msgspec.msgpack.Decoder(PrekeyReply)


def encode_prekey_record(record: PrekeyPublishRequest | PrekeyFetchRequest | PrekeyReply) -> bytes:
    return _ENC.encode(record)


def decode_prekey_request(data: bytes) -> PrekeyRequest:
    """Decode a ``qim.prekey-requests`` value; raises ``msgspec.ValidationError`` if malformed."""
    return _REQUESTS.decode(data)


def decode_prekey_reply(data: bytes) -> PrekeyReply:
    """Decode a ``kind="prekey_reply"`` value of ``qim.to-gateway``."""
    return _REPLY.decode(data)
