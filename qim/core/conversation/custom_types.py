"""What a SEND_MESSAGE's type means, decided once by the ConversationWriter (spec 13.3).

:func:`send_contract` validates ``message_type`` / ``custom_type`` against the registry
(:mod:`qim.schemas.message_types`) and the tenant's declarations, and returns the type-level
facts the commit record carries: entry flags, anchor mode, schema version and the preview
template. The payload is never read, only measured. Refusals, in this order:

* ``message_type`` CONTROL or any value outside ``CLIENT_MESSAGE_TYPES`` ->
  ``PERMISSION_DENIED`` (``message_type_not_allowed``): server-only events are not messages;
* a ``custom_type`` on a non-CUSTOM message, or a CUSTOM message without one ->
  ``PERMISSION_DENIED`` (``custom_type_mismatch``): A.3 #4, ``custom_type`` is meaningful only
  with ``message_type=CUSTOM``, and an untyped custom message would have no contract;
* an undeclared ``custom_type`` -> ``PERMISSION_DENIED`` (``custom_type_not_declared``): A.6 has
  no closer code ("tenant ... authorization failed");
* payload over ``min(max_payload_bytes, max_custom_payload_bytes)`` -> ``PAYLOAD_TOO_LARGE``;
* (persistent types only) ``anchor_target`` without a ``reply_to_conversation_seq`` naming
  an earlier seq of the conversation -> ``PERMISSION_DENIED`` (``anchor_target_missing``).

An ``ephemeral`` type passes with ``delivery_class="ephemeral"``: the writer then takes the
transient path (13.2, ``qim.core.transient.ephemeral``) and commits nothing. Its contract's
flags do not apply to an entry that is in no mailbox, so the contract carries flags 0 and
anchor ``none`` (never on the timeline, never counted, never moves a session) and its
``anchor_mode`` is not checked.

Messages of the other client types keep the contract they always had: every flag, own_seq.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from qim.schemas.frames.errors import ErrorCode
from qim.schemas.frames.messaging import SendMessage
from qim.schemas.message_types import (
    ALL_TENANTS,
    CLIENT_MESSAGE_TYPES,
    DEFAULT_MESSAGE_FLAGS,
    AnchorMode,
    CustomTypeContract,
    DeliveryClass,
    MessageType,
    contract_flags,
)

__all__ = [
    "CustomTypeRegistry",
    "SendContract",
    "TypeRefusal",
    "send_contract",
]


@dataclass(frozen=True, slots=True)
class SendContract:
    """The type-level facts of one accepted send, copied onto its commit record."""

    flags: int = DEFAULT_MESSAGE_FLAGS
    anchor_mode: AnchorMode = "own_seq"
    schema_version: int = 0
    preview_template: str = ""
    delivery_class: DeliveryClass = "persistent"
    """``ephemeral``: relayed to online connections only, never committed (13.2 / 13.3)."""

    @property
    def ephemeral(self) -> bool:
        return self.delivery_class == "ephemeral"


ORDINARY: Final = SendContract()


@dataclass(frozen=True, slots=True)
class TypeRefusal:
    """``ERROR{code, detail}`` of a refused type; ``reason`` is the metric / log word."""

    code: ErrorCode
    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class CustomTypeRegistry:
    """Every tenant's declared custom types; ``"*"`` applies to tenants without their own.

    Built once at start from ``QIM_CUSTOM_TYPES`` (:meth:`build` checks each contract against
    the tenant's limits), then read-only on the hot path.
    """

    tenants: Mapping[str, Mapping[str, CustomTypeContract]] = field(
        default_factory=lambda: MappingProxyType({})
    )

    def lookup(self, tenant_id: str, custom_type: str) -> CustomTypeContract | None:
        declared = self.tenants.get(tenant_id)
        if declared is None:
            declared = self.tenants.get(ALL_TENANTS, {})
        return declared.get(custom_type)

    @classmethod
    def build(
        cls,
        declarations: Mapping[str, tuple[CustomTypeContract, ...]],
        *,
        max_payload_bytes: Mapping[str, int],
        default_max_payload_bytes: int,
        custom_type_max_bytes: int,
    ) -> CustomTypeRegistry:
        """Check each contract against its tenant's ``max_custom_payload_bytes`` (spec 13.3:
        ``max_payload_bytes <= max_custom_payload_bytes``) and ``custom_type_max_bytes``."""
        tenants: dict[str, Mapping[str, CustomTypeContract]] = {}
        for tenant, contracts in sorted(declarations.items()):
            cap = max_payload_bytes.get(tenant, default_max_payload_bytes)
            for contract in contracts:
                if contract.max_payload_bytes > cap:
                    raise ValueError(
                        f"tenant {tenant!r}, {contract.custom_type}: max_payload_bytes "
                        f"{contract.max_payload_bytes} > max_custom_payload_bytes {cap}"
                    )
                if len(contract.custom_type.encode()) > custom_type_max_bytes:
                    raise ValueError(
                        f"tenant {tenant!r}: custom_type {contract.custom_type!r} is longer than "
                        f"custom_type_max_bytes {custom_type_max_bytes}"
                    )
            tenants[tenant] = MappingProxyType({c.custom_type: c for c in contracts})
        return cls(MappingProxyType(tenants))


def send_contract(
    tenant_id: str,
    msg: SendMessage,
    registry: CustomTypeRegistry,
    *,
    max_custom_payload_bytes: int,
    latest_conversation_seq: int,
) -> SendContract | TypeRefusal:
    """The contract of ``msg`` or why it is refused (module docstring, in that order)."""
    kind, custom = msg.message_type, msg.custom_type
    if kind not in CLIENT_MESSAGE_TYPES:
        return TypeRefusal(
            ErrorCode.PERMISSION_DENIED,
            "message_type_not_allowed",
            f"message_type {kind} cannot be sent by a client",
        )
    if (kind == MessageType.CUSTOM) != bool(custom):
        return TypeRefusal(
            ErrorCode.PERMISSION_DENIED,
            "custom_type_mismatch",
            "custom_type is required with message_type CUSTOM and only with it",
        )
    if kind != MessageType.CUSTOM:
        if len(msg.payload) > max_custom_payload_bytes:
            return _too_large(len(msg.payload), max_custom_payload_bytes)
        return ORDINARY
    contract = registry.lookup(tenant_id, custom)
    if contract is None:
        return TypeRefusal(
            ErrorCode.PERMISSION_DENIED,
            "custom_type_not_declared",
            f"custom_type {custom!r} is not declared for this tenant",
        )
    cap = min(contract.max_payload_bytes, max_custom_payload_bytes)
    if len(msg.payload) > cap:
        return _too_large(len(msg.payload), cap)
    if contract.delivery_class == "ephemeral":
        return SendContract(
            flags=0,
            anchor_mode="none",
            schema_version=contract.schema_version,
            delivery_class="ephemeral",
        )
    if contract.anchor_mode == "anchor_target":
        target = msg.reply_to_conversation_seq
        if target is None or not 0 < target <= latest_conversation_seq:
            return TypeRefusal(
                ErrorCode.PERMISSION_DENIED,
                "anchor_target_missing",
                f"custom_type {custom!r} anchors on a target: reply_to_conversation_seq must "
                "name an earlier message of the conversation",
            )
    return SendContract(
        flags=contract_flags(contract),
        anchor_mode=contract.anchor_mode,
        schema_version=contract.schema_version,
        preview_template=contract.preview_template,
    )


def _too_large(size: int, cap: int) -> TypeRefusal:
    return TypeRefusal(
        ErrorCode.PAYLOAD_TOO_LARGE, "payload_too_large", f"payload is {size} bytes > {cap}"
    )
