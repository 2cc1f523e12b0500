"""Body encoding shared by every frame: MessagePack maps via msgspec, and the wire integer types.

Why msgpack maps keyed by field name (not arrays, not protobuf tags):

* forward compatible for free: a decoder skips keys it does not know (§27.1.2 "unknown field"),
  and a missing key takes the field's default (§27.2.1: absence means "feature off");
* schema'd: one ``msgspec.Struct`` per frame validates types and integer ranges on decode;
* small: ``omit_defaults=True`` drops zero / empty / None fields, so a sparse entry costs only
  the fields it carries (proto3-style zero defaults for the same reason);
* fast: msgspec encodes and decodes in C without an intermediate dict.

Integer widths follow the spec's types (§6, §7): u64 values travel as msgpack uint (max
2**64-1). msgpack integers stop at 64 bits, so u128 values (``message_id``, ``last_activity_id``,
``last_message_id``, ``target_message_id``, ``edited_at_activity_id``) travel as **16-byte
big-endian bin**. Fixed-width big-endian bytes compare in the same order as the integers, so
they remain valid sort keys without conversion (§6.2, §6.4).

Enumerations: values the spec gives as words (``older|newer``, ``add|remove``, ``replaced|...``)
travel as those words (``str``); values the spec gives as ordinals or that sit on every sync
entry (``event_type``, ``mention_type``, ``flags``, ``message_type``) travel as small ints. Both
are typed as plain ``str`` / ``int`` on purpose: a strict enum would fail the whole frame on a
value added by a newer peer, which §27.1.2 forbids. The constants below name the
values this build knows.

msgspec omits a field when its value *is* the default object (identity, not ==). Every default
here is a shared object (0, "", b"", False, None, (), ``U128_ZERO``), and the named
constants are plain ints, so equal bodies encode to identical bytes; a freshly built
``bytes(16)`` is still written out (harmless, just not minimal).
"""

from __future__ import annotations

from enum import IntFlag
from typing import Annotated, Final

import msgspec

__all__ = [
    "I32",
    "MENTION_ALL",
    "U8",
    "U16",
    "U32",
    "U64",
    "U128",
    "U128_ZERO",
    "Body",
    "Capability",
    "EntryFlags",
    "EventType",
    "MentionType",
    "u128_from_bytes",
    "u128_to_bytes",
]

U8 = Annotated[int, msgspec.Meta(ge=0, le=0xFF)]
U16 = Annotated[int, msgspec.Meta(ge=0, le=0xFFFF)]
U32 = Annotated[int, msgspec.Meta(ge=0, le=0xFFFF_FFFF)]
# No upper bound: msgspec bounds must fit int64, and msgpack cannot carry more than 2**64-1.
U64 = Annotated[int, msgspec.Meta(ge=0)]
I32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
U128 = Annotated[bytes, msgspec.Meta(min_length=16, max_length=16)]
U128_ZERO: Final = bytes(16)

# SEND_MESSAGE.mention_targets is "list<user_id> | ALL" (§7.1); ALL travels as this reserved
# target. Tenant user ids are opaque strings that never start with "@".
MENTION_ALL: Final = "@all"


def u128_to_bytes(value: int) -> bytes:
    """Encode a u128 id for the wire (16 octets, big-endian)."""
    if not 0 <= value < 1 << 128:
        raise ValueError(f"not a u128: {value}")
    return value.to_bytes(16, "big")


def u128_from_bytes(data: bytes) -> int:
    """Inverse of :func:`u128_to_bytes`."""
    if len(data) != 16:
        raise ValueError(f"u128 needs 16 octets, got {len(data)}")
    return int.from_bytes(data, "big")


class Body(
    msgspec.Struct,
    kw_only=True,
    omit_defaults=True,
    repr_omit_defaults=True,
):
    """Base of every frame body and nested struct: a map keyed by field name, defaults omitted."""


class EventType:
    """``event_type`` and its ``event_ordinal`` priority (A.4.1, §27.2.4); an immutable map.

    Plain ints, not an IntEnum: msgspec's omit_defaults tests identity, so an IntEnum member
    equal to the default would still be written and equal bodies would encode differently.
    """

    MESSAGE: Final = 0
    MENTION: Final = 1
    MEMBERSHIP: Final = 2
    CONTROL: Final = 3


class MentionType:
    """``mention_type`` of a mailbox entry (§7.3); plain ints for the reason above."""

    NONE: Final = 0
    AT_ME: Final = 1
    AT_ALL: Final = 2
    REPLY_ME: Final = 3


class EntryFlags(IntFlag):
    """``flags`` bitset of a mailbox entry (§7.3); type-level contract, no payload parsing.

    No zero member on purpose: pass ``0`` for "none" so the field is omitted.
    """

    COUNTS_UNREAD = 0x01
    AFFECTS_SESSION_ORDER = 0x02
    TIMELINE_VISIBLE = 0x04


class Capability(IntFlag):
    """``AUTH.capabilities`` bits (§27.1.1); unknown bits are kept, never rejected."""

    E2EE = 0x01
    COMPRESSION = 0x02
    CHATROOM = 0x04
    OFFLINE_PUSH = 0x08
