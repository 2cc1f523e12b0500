"""Transient to-gateway records (spec 13.2): a typing indicator for the users of one shard.

The ConversationWriter decides a TYPING (membership, size, merge window) and writes one
:class:`TypingRelay` per ConnectionShard that holds a recipient, at that **explicit
partition** of ``qim.to-gateway``, like a reply; the gateway owning the shard writes the
downlink TYPING to every live connection of the named users. Nothing here is durable state:
a lost relay is a missed "typing..." that the next keystroke re-sends.

Values are msgpack maps, defaults omitted, unknown keys ignored (spec 27.2.1).
"""

from __future__ import annotations

from typing import Final

import msgspec

from qim.schemas.frames.base import U32
from qim.schemas.hashing import hash_input, validate_identifier

__all__ = ["TypingRelay", "decode_typing_relay", "encode_transient"]


class _Record(
    msgspec.Struct,
    kw_only=True,
    omit_defaults=True,
    frozen=True,
    forbid_unknown_fields=False,
    tag_field="kind",
):
    """Tagged msgpack map, like ``requests._Record``: one topic carries several kinds."""


class TypingRelay(_Record, tag="typing_relay", kw_only=True, frozen=True):
    """TYPING{conversation_id, user_id, expires_in_ms} for ``recipients`` on one shard."""

    tenant_id: str
    conversation_id: str
    user_id: str  # who is typing (never one of the recipients)
    expires_in_ms: U32
    connection_shard: U32
    recipients: tuple[str, ...] = ()

    @property
    def key(self) -> bytes:
        validate_identifier(self.tenant_id, "tenant_id")
        validate_identifier(self.conversation_id, "conversation_id")
        return hash_input(self.tenant_id, self.conversation_id)

    @property
    def partition(self) -> int:
        return self.connection_shard


_ENCODER: Final = msgspec.msgpack.Encoder()
_TYPING: Final = msgspec.msgpack.Decoder(TypingRelay)


def encode_transient(record: TypingRelay) -> bytes:
    return _ENCODER.encode(record)


def decode_typing_relay(data: bytes) -> TypingRelay:
    """Raises ``msgspec.ValidationError`` / ``DecodeError`` for anything else."""
    return _TYPING.decode(data)
