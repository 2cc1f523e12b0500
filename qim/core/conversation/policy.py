"""Commit-time decisions taken once by the ConversationWriter, and the record that carries them.

Inlining and the preview are written into the outbox record so no consumer ever decides them
again: if MailboxNodes decided inlining independently, shards could disagree and replays could
differ (spec 3 item 4, 7.8, ADR-0005); if the preview were derived at read time from a payload,
the server would be parsing custom or E2EE bodies (spec 13.1, 13.3).
"""

from __future__ import annotations

import msgspec

from qim.core.conversation.allocation import Coordinates
from qim.core.conversation.config import WriterConfig
from qim.core.conversation.custom_types import ORDINARY, SendContract
from qim.core.conversation.membership import Target
from qim.schemas.records.outbox import MessageCommitted, PreviewPlaceholder, RetentionClass
from qim.schemas.records.requests import SendRequest

__all__ = ["inline_body_decision", "message_record", "placeholder_preview"]

_ENCODER = msgspec.msgpack.Encoder()


def inline_body_decision(
    member_count: int,
    body_size: int,
    retention_class: RetentionClass,
    *,
    inline_body_budget_bytes: int,
    inline_body_max_bytes: int,
) -> bool:
    """ADR-0005: ``N x body_size <= budget AND body_size <= max AND retention_class == default``.

    ``N`` is the member count of the pinned membership version (direct: the participants), the
    number of mailbox entries the body would be copied into. Spec example: a 3-member chat with a
    1 KiB body inlines (3 KiB <= 8 KiB); a 100-member group does not (100 KiB). ``ephemeral_24h``
    and ``compliance_hold`` bodies are never inlined (their deletion paths must not chase copies).
    """
    if retention_class != "default":
        return False
    if body_size > inline_body_max_bytes:
        return False
    return member_count * body_size <= inline_body_budget_bytes


def placeholder_preview(
    message_type: int, custom_type: str, template: str = "", *, e2ee: bool = False
) -> bytes:
    """The default ``ConversationHead.preview_or_placeholder``: the type (and a custom type's
    ``preview_template``, a declared fixed text), never the payload; ``e2ee`` marks the
    generic E2EE placeholder (spec 22.3)."""
    return _ENCODER.encode(
        PreviewPlaceholder(
            message_type=message_type, custom_type=custom_type, template=template, e2ee=e2ee
        )
    )


def message_record(
    request: SendRequest,
    target: Target,
    coords: Coordinates,
    *,
    retention_class: RetentionClass,
    fencing_epoch: int,
    config: WriterConfig,
    contract: SendContract = ORDINARY,
    write_policy: str = "always",
) -> MessageCommitted:
    """The outbox record of an admitted send: the frame's fields plus every commit decision,
    its type's spec 13.3 contract included (``custom_types.send_contract``)."""
    msg = request.message
    return MessageCommitted(
        tenant_id=request.tenant_id,
        conversation_id=msg.conversation_id,
        conversation_kind=target.kind,
        participants=target.participants,
        message_id=coords.message_id,
        conversation_seq=coords.conversation_seq,
        last_activity_id=coords.last_activity_id,
        sender_id=request.sender_id,
        origin_device_id=request.sender_device_id,
        client_message_id=msg.client_message_id,
        message_type=msg.message_type,
        custom_type=msg.custom_type,
        payload=msg.payload,
        mention_targets=msg.mention_targets,
        reply_to_conversation_seq=msg.reply_to_conversation_seq,
        membership_version=target.membership_version,
        member_count=target.member_count,
        committed_at=coords.committed_at,
        inline_body=inline_body_decision(
            target.member_count,
            len(msg.payload),
            retention_class,
            inline_body_budget_bytes=config.inline_body_budget_bytes,
            inline_body_max_bytes=config.inline_body_max_bytes,
        ),
        retention_class=retention_class,
        preview_or_placeholder=placeholder_preview(
            msg.message_type, msg.custom_type, contract.preview_template, e2ee=target.e2ee
        ),
        fencing_epoch=fencing_epoch,
        flags=contract.flags,
        anchor_mode=contract.anchor_mode,
        schema_version=contract.schema_version,
        e2ee=target.e2ee,
        write_policy=write_policy,
    )
