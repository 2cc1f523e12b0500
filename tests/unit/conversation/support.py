"""Builders and an in-memory ``MembershipView`` for the ConversationWriter tests."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from qim.core.conversation import (
    Accepted,
    ConversationWriterState,
    Decision,
    WriterConfig,
    WriterLimits,
    direct_conversation_id,
)
from qim.params import Settings
from qim.schemas.frames import SendMessage
from qim.schemas.message_types import CustomTypeContract
from qim.schemas.records import SendRequest
from qim.schemas.records.outbox import RetentionClass

NOW = 1_790_000_000_000  # 2026-09-21, Unix ms
TENANT = "acme"
REGION = 1
WRITER = 5


def settings() -> Settings:
    return Settings.load(env={})


def config(**limits: Any) -> WriterConfig:
    """Appendix B defaults, with ``WriterLimits`` fields overridden by keyword."""
    base = WriterConfig.from_settings(settings())
    if not limits:
        return base
    return replace(base, limits=replace(base.limits, **limits))


def contract(custom_type: str, **fields: Any) -> CustomTypeContract:
    """A persistent, ordinary-looking declaration of ``custom_type``; fields by keyword."""
    values: dict[str, Any] = {
        "custom_type": custom_type,
        "schema_version": 1,
        "delivery_class": "persistent",
        "counts_unread": True,
        "affects_session_order": True,
        "timeline_visible": True,
        "anchor_mode": "own_seq",
        "preview_template": f"[{custom_type}]",
        "max_payload_bytes": 1024,
        "minimum_client_version": "1.0",
    }
    values.update(fields)
    return CustomTypeContract(**values)


def typed_config(*contracts: CustomTypeContract, tenant: str = TENANT) -> WriterConfig:
    """Appendix B defaults plus ``contracts`` declared for ``tenant`` (spec 13.3)."""
    return WriterConfig.from_settings(settings(), custom_types={tenant: contracts})


def writer(cfg: WriterConfig | None = None, *, epoch: int = 1) -> ConversationWriterState:
    return ConversationWriterState(
        cfg or config(), region_id=REGION, writer_id=WRITER, fencing_epoch=epoch
    )


@dataclass
class Groups:
    """``MembershipView`` double: members per (tenant, group), optional count override."""

    members: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    versions: dict[tuple[str, str], int] = field(default_factory=dict)
    roles: dict[tuple[str, str, str], str] = field(default_factory=dict)
    """Overrides; a member without one is a MEMBER."""
    e2ee: set[tuple[str, str]] = field(default_factory=set)

    def add(
        self,
        group_id: str,
        users: Iterable[str],
        *,
        tenant: str = TENANT,
        count: int | None = None,
        version: int = 1,
        e2ee: bool = False,
    ) -> str:
        key = (tenant, group_id)
        self.members[key] = set(users)
        if e2ee:
            self.e2ee.add(key)
        if count is not None:
            self.counts[key] = count
        self.versions[key] = version
        return group_id

    def is_member(self, tenant_id: str, conversation_id: str, user_id: str) -> bool:
        return user_id in self.members.get((tenant_id, conversation_id), set())

    def member_count(self, tenant_id: str, conversation_id: str) -> int:
        key = (tenant_id, conversation_id)
        return self.counts.get(key, len(self.members.get(key, set())))

    def version(self, tenant_id: str, conversation_id: str) -> int:
        return self.versions.get((tenant_id, conversation_id), 0)

    def role(self, tenant_id: str, conversation_id: str, user_id: str) -> str:
        if not self.is_member(tenant_id, conversation_id, user_id):
            return ""
        return self.roles.get((tenant_id, conversation_id, user_id), "MEMBER")

    def is_e2ee(self, tenant_id: str, conversation_id: str) -> bool:
        return (tenant_id, conversation_id) in self.e2ee


def send_request(
    sender: str,
    conversation_id: str,
    cmid: str = "cm-1",
    *,
    tenant: str = TENANT,
    peer: str = "",
    payload: bytes = b"hello",
    request_id: int = 1,
    device: str = "phone",
    message_type: int = 1,
    custom_type: str = "",
    reply_to: int | None = None,
    mentions: tuple[str, ...] = (),
) -> SendRequest:
    return SendRequest(
        tenant_id=tenant,
        sender_id=sender,
        sender_device_id=device,
        session_epoch=7,
        connection_shard=42,
        request_id=request_id,
        message=SendMessage(
            request_id=request_id,
            client_message_id=cmid,
            conversation_id=conversation_id,
            message_type=message_type,
            custom_type=custom_type,
            payload=payload,
            reply_to_conversation_seq=reply_to,
            mention_targets=mentions,
        ),
        peer_user_id=peer,
    )


def direct_request(
    sender: str,
    peer: str,
    cmid: str = "cm-1",
    *,
    tenant: str = TENANT,
    payload: bytes = b"hello",
    request_id: int = 1,
) -> SendRequest:
    conv = direct_conversation_id(tenant, sender, peer)
    return send_request(
        sender, conv, cmid, tenant=tenant, peer=peer, payload=payload, request_id=request_id
    )


def commit(
    state: ConversationWriterState,
    request: SendRequest,
    now_ms: int = NOW,
    groups: Groups | None = None,
    *,
    retention_class: RetentionClass = "default",
) -> Decision:
    """``handle_send`` and, when accepted, ``apply`` (what the shell does once durable)."""
    decision = state.handle_send(
        request, now_ms, groups or Groups(), retention_class=retention_class
    )
    if isinstance(decision, Accepted):
        state.apply(decision.record)
    return decision


def accepted(decision: Decision) -> Accepted:
    assert isinstance(decision, Accepted), decision
    return decision


__all__ = [
    "NOW",
    "REGION",
    "TENANT",
    "WRITER",
    "Groups",
    "WriterLimits",
    "accepted",
    "commit",
    "config",
    "contract",
    "direct_request",
    "send_request",
    "settings",
    "typed_config",
    "writer",
]
