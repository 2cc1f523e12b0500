"""The ``message_type`` registry and the spec 13.3 custom-type contract (contract types, pure).

Why a registry at all: ``counts_unread`` / ``affects_session_order`` / ``timeline_visible`` are
type-level contracts of ``message_type`` / ``custom_type`` (spec 13.3, 21.x "the server applies
its type table"), never read from a payload. A.3 names ``MESSAGE_TYPE_CONTROL`` and
``message_type=CUSTOM`` but gives no numbers; the values below are ours (docs/protocol.md) and
only grow. A client may send the :data:`CLIENT_MESSAGE_TYPES`; CONTROL (and every value not
listed) is the server's, so a client cannot forge a recall, a membership change or a user-state
event as a message.

A custom type is declared per tenant with the full contract of 13.3 (:class:`CustomTypeContract`,
every field required so a declaration never relies on a guessed default); the declarations are
configuration (``QIM_CUSTOM_TYPES``), read by the ConversationWriter only. Everything a consumer
needs is copied onto the committed record at commit time, so replay never reads live config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal, TypeAlias

import msgspec

from qim.schemas.frames.base import U32, EntryFlags
from qim.schemas.records.membership import MESSAGE_TYPE_CONTROL
from qim.schemas.records.outbox import MESSAGE_FLAGS

__all__ = [
    "ALL_TENANTS",
    "CLIENT_MESSAGE_TYPES",
    "DEFAULT_MESSAGE_FLAGS",
    "RESERVED_CUSTOM_TYPE_PREFIX",
    "AnchorMode",
    "CustomTypeContract",
    "DeliveryClass",
    "MessageType",
    "contract_flags",
    "decode_custom_types",
]

DeliveryClass: TypeAlias = Literal["persistent", "ephemeral"]
AnchorMode: TypeAlias = Literal["own_seq", "anchor_target", "none"]


class MessageType:
    """``message_type`` values (plain ints: msgspec's omit_defaults tests identity)."""

    TEXT: Final = 0
    RICH_TEXT: Final = 1
    IMAGE: Final = 2
    VIDEO: Final = 3
    AUDIO: Final = 4
    FILE: Final = 5
    CARD: Final = 6
    """Business card (spec 13.1)."""
    CUSTOM: Final = 8
    """A tenant-declared business type: ``custom_type`` names it (spec 13.3, A.3 #4)."""
    CONTROL: Final = MESSAGE_TYPE_CONTROL
    """Server-only events: membership, recall / edit, user state."""


CLIENT_MESSAGE_TYPES: Final = frozenset(
    {
        MessageType.TEXT,
        MessageType.RICH_TEXT,
        MessageType.IMAGE,
        MessageType.VIDEO,
        MessageType.AUDIO,
        MessageType.FILE,
        MessageType.CARD,
        MessageType.CUSTOM,
    }
)
"""What SEND_MESSAGE may carry; anything else is refused by the ConversationWriter."""

DEFAULT_MESSAGE_FLAGS: Final = MESSAGE_FLAGS
"""A non-sender's entry flags of an ordinary message: counts, moves the session, is shown."""

RESERVED_CUSTOM_TYPE_PREFIX: Final = "qim."
"""The server's own custom types (``qim.membership.v1``, ``qim.amend.v1``, ``qim.user_state``):
a tenant cannot declare one, so a client cannot send one."""

ALL_TENANTS: Final = "*"
"""Key of the declarations that apply to every tenant without its own list."""


class CustomTypeContract(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One declared custom type: the ten fields of spec 13.3, all required.

    ``anchor_mode``: ``own_seq`` anchors at the message's own seq (a new row);
    ``anchor_target`` updates the row at ``reply_to_conversation_seq`` in place (the only target
    coordinate SEND_MESSAGE carries, so such a send must name one); ``none`` is never on the
    timeline and requires ``timeline_visible=false``. ``max_payload_bytes`` may not exceed the
    tenant's ``max_custom_payload_bytes`` (checked where the limits are known).
    ``preview_template`` is the fixed text of the conversation preview (the server never reads
    the payload, so it cannot interpolate one). ``minimum_client_version`` is carried for the
    clients: the server still delivers the entry to older ones (13.3 "never drops silently").
    """

    custom_type: str
    schema_version: U32
    delivery_class: DeliveryClass
    counts_unread: bool
    affects_session_order: bool
    timeline_visible: bool
    anchor_mode: AnchorMode
    preview_template: str
    max_payload_bytes: int
    minimum_client_version: str

    def __post_init__(self) -> None:
        if not self.custom_type:
            raise ValueError("custom_type must not be empty")
        if self.custom_type.startswith(RESERVED_CUSTOM_TYPE_PREFIX):
            raise ValueError(
                f"{self.custom_type!r}: the {RESERVED_CUSTOM_TYPE_PREFIX!r} prefix is the server's"
            )
        if self.max_payload_bytes < 0:
            raise ValueError(f"{self.custom_type}: max_payload_bytes must be >= 0")
        if self.anchor_mode == "none" and self.timeline_visible:
            raise ValueError(f"{self.custom_type}: anchor_mode=none needs timeline_visible=false")


def contract_flags(contract: CustomTypeContract) -> int:
    """The ``EntryFlags`` of a non-sender's entry of this type."""
    flags = 0
    if contract.counts_unread:
        flags |= EntryFlags.COUNTS_UNREAD
    if contract.affects_session_order:
        flags |= EntryFlags.AFFECTS_SESSION_ORDER
    if contract.timeline_visible:
        flags |= EntryFlags.TIMELINE_VISIBLE
    return int(flags)


_DECLARATIONS = msgspec.json.Decoder(dict[str, list[CustomTypeContract]])


def decode_custom_types(raw: str | bytes) -> Mapping[str, tuple[CustomTypeContract, ...]]:
    """``{tenant_id | "*": [contract, ...]}`` from JSON; a bad or duplicate declaration raises.

    Raises ``ValueError`` (``msgspec.ValidationError`` is one) naming the offending field.
    """
    data = _DECLARATIONS.decode(raw)
    out: dict[str, tuple[CustomTypeContract, ...]] = {}
    for tenant, contracts in sorted(data.items()):
        if not tenant:
            raise ValueError("a tenant id of QIM_CUSTOM_TYPES must not be empty")
        names = [c.custom_type for c in contracts]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"tenant {tenant!r} declares {duplicates} more than once")
        out[tenant] = tuple(contracts)
    return out
