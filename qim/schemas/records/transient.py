"""Transient to-gateway records (spec 13.2, 13.3, 13.5): typing, ephemeral messages, RTC.

The ConversationWriter decides a TYPING (membership, size, merge window) and writes one
:class:`TypingRelay` per ConnectionShard that holds a recipient, at that **explicit
partition** of ``qim.to-gateway``, like a reply; the gateway owning the shard writes the
downlink TYPING to every live connection of the named users. Nothing here is durable state:
a lost relay is a missed "typing..." that the next keystroke re-sends.

An :class:`RtcRelay` carries one RTC_SIGNAL to every device of its target user on the
target's shard: written by the writer (a client's signal, after the membership check) or by
the callee's gateway (the server's ``cancel{reason=timeout}`` for the caller, 13.5.3).

An :class:`EphemeralRelay` carries one SEND_MESSAGE of an ``ephemeral`` custom type (13.3:
the transient path) for its recipients on one shard, as the A.4.1 entry the gateway writes in
a ``PUSH_EVENTS`` frame: ``mailbox_seq`` 0, ``conversation_seq`` 0, flags 0 (no mailbox, no
seq, no unread, no session move, no timeline row). The sender's *other* devices are recipients
too; the gateway skips ``origin_device_id`` of the sender.

Values are msgpack maps, defaults omitted, unknown keys ignored (spec 27.2.1).
"""

from __future__ import annotations

from typing import Final

import msgspec

from qim.schemas.frames.base import U32
from qim.schemas.frames.mailbox import SyncEntry
from qim.schemas.frames.rtc import RtcSignalDown
from qim.schemas.hashing import hash_input, validate_identifier

__all__ = [
    "EphemeralRelay",
    "RtcRelay",
    "TransientRelay",
    "TypingRelay",
    "decode_ephemeral_relay",
    "decode_rtc_relay",
    "decode_typing_relay",
    "encode_transient",
]


class _Record(
    msgspec.Struct,
    kw_only=True,
    omit_defaults=True,
    frozen=True,
    forbid_unknown_fields=False,
    tag_field="kind",
):
    """Tagged msgpack map, like ``requests._Record``: one topic carries several kinds."""


def _conversation_key(tenant_id: str, conversation_id: str) -> bytes:
    """The Kafka key of a relay about one conversation (TYPING, an ephemeral message)."""
    validate_identifier(tenant_id, "tenant_id")
    validate_identifier(conversation_id, "conversation_id")
    return hash_input(tenant_id, conversation_id)


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
        return _conversation_key(self.tenant_id, self.conversation_id)

    @property
    def partition(self) -> int:
        return self.connection_shard


class RtcRelay(_Record, tag="rtc_relay", kw_only=True, frozen=True):
    """RTC_SIGNAL for every live device of ``target_user_id`` (13.5.1: ring everywhere)."""

    tenant_id: str
    target_user_id: str
    connection_shard: U32
    signal: RtcSignalDown

    @property
    def key(self) -> bytes:
        validate_identifier(self.tenant_id, "tenant_id")
        validate_identifier(self.target_user_id, "user_id")
        return hash_input(self.tenant_id, self.target_user_id)

    @property
    def partition(self) -> int:
        return self.connection_shard


class EphemeralRelay(_Record, tag="ephemeral_relay", kw_only=True, frozen=True):
    """An ephemeral custom message (13.3) as a PUSH_EVENTS entry for ``recipients`` on one
    shard; ``sender_id`` / ``origin_device_id`` name the device that must not get it back."""

    tenant_id: str
    conversation_id: str
    sender_id: str
    origin_device_id: str
    connection_shard: U32
    recipients: tuple[str, ...] = ()
    entry: SyncEntry

    @property
    def key(self) -> bytes:
        return _conversation_key(self.tenant_id, self.conversation_id)

    @property
    def partition(self) -> int:
        return self.connection_shard


TransientRelay = TypingRelay | RtcRelay | EphemeralRelay
"""Every to-gateway record that is no state (the writer's ``Plan.transient``)."""

_ENCODER: Final = msgspec.msgpack.Encoder()
_TYPING: Final = msgspec.msgpack.Decoder(TypingRelay)
_RTC: Final = msgspec.msgpack.Decoder(RtcRelay)
_EPHEMERAL: Final = msgspec.msgpack.Decoder(EphemeralRelay)


def encode_transient(record: TransientRelay) -> bytes:
    return _ENCODER.encode(record)


def decode_ephemeral_relay(data: bytes) -> EphemeralRelay:
    """Raises ``msgspec.ValidationError`` / ``DecodeError`` for anything else."""
    return _EPHEMERAL.decode(data)


def decode_rtc_relay(data: bytes) -> RtcRelay:
    """Raises ``msgspec.ValidationError`` / ``DecodeError`` for anything else."""
    return _RTC.decode(data)


def decode_typing_relay(data: bytes) -> TypingRelay:
    """Raises ``msgspec.ValidationError`` / ``DecodeError`` for anything else."""
    return _TYPING.decode(data)
