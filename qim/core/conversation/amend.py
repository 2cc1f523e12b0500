"""RECALL / EDIT on the writer (spec 13.4): who may amend what, and the record that carries it.

Pure pieces of :meth:`ConversationWriterState.handle_amend
<qim.core.conversation.writer.ConversationWriterState.handle_amend>`, which, like
``handle_send``, decides and never mutates. Checks, in this order (each refusal is
``PERMISSION_DENIED`` unless named, and the probe learns nothing more than "no"):

1. the requester belongs to the conversation: an ACTIVE group member (GroupMembership), or a
   participant of a one-to-one conversation (the participants the MessageStore remembered, like
   PULL_HISTORY: the RECALL/EDIT frames name no peer);
2. the target is the MessageRecord at ``target_conversation_seq`` (read by the shell from the
   MessageStore, which holds every committed append: the shell cuts its batch like for
   PULL_HISTORY) and is a normal message: absent, a membership CONTROL or another amend (both
   ``message_type = 0xFF``) is refused;
3. permission and window (13.4.3): own messages within ``recall_self_window`` /
   ``edit_self_window``, measured from the target's ``created_at`` (its ``committed_at``) to
   the writer's log time (the wall clock, never below the HLC); OWNER/ADMIN recall any message
   with no window; edits are own-message only and never of a RECALLED / DELETED target;
4. an edit's ``new_payload`` obeys the send limit (``PAYLOAD_TOO_LARGE``);
5. the 13.4.4 short-circuit (:func:`already_recalled`);
6. admission, like a send (our decision: an amend fans out one mailbox entry per member, the
   cost the per-user / per-conversation rates bound; RATE_LIMITED), then allocation.

ClientDedup is not used: the frames carry no ``client_message_id``; the only idempotency key is
the target's ``recall_event_conversation_seq`` (INV-35).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import msgspec

from qim.core.conversation.allocation import Coordinates
from qim.core.conversation.config import WriterLimits
from qim.core.conversation.ids import conversation_kind
from qim.core.conversation.membership import MembershipView, Target
from qim.core.history.records import MessageRecord, MessageState
from qim.schemas.frames.connection import Error
from qim.schemas.frames.errors import ErrorCode
from qim.schemas.frames.messaging import SendAck
from qim.schemas.records.membership import MESSAGE_TYPE_CONTROL
from qim.schemas.records.outbox import (
    DIRECT,
    GROUP,
    MessageAmended,
    PreviewPlaceholder,
    RetentionClass,
)
from qim.schemas.records.requests import AmendRequest, WriterReply, conversation_key, reply_for

__all__ = [
    "AmendMembershipView",
    "Amended",
    "HistoryLookup",
    "already_recalled",
    "amend_ack",
    "amend_error",
    "amend_preview",
    "amend_record",
    "amend_refusal",
    "amend_target",
    "repaired_head_preview",
]

HistoryLookup = Callable[[int], MessageRecord | None]
"""The conversation's MessageRecord at a seq (the MessageStore, read by the shell)."""

_STATE_WORD = {"recall": "recalled", "edit": "edited", "delete": "deleted"}
_BODY_HIDDEN = frozenset({MessageState.RECALLED, MessageState.DELETED})
_ENCODER = msgspec.msgpack.Encoder()
_PREVIEW_DECODER = msgspec.msgpack.Decoder(PreviewPlaceholder)


class AmendMembershipView(MembershipView, Protocol):
    """GroupMembership as the amend path needs it: membership plus the admin roles."""

    def is_admin(self, tenant_id: str, conversation_id: str, user_id: str) -> bool:
        """True iff ``user_id`` is an ACTIVE OWNER or ADMIN of the group."""
        ...


@dataclass(frozen=True, slots=True)
class Amended:
    """An accepted amend: append ``record``, apply it, send ``reply`` once durable."""

    record: MessageAmended
    reply: WriterReply

    @property
    def record_key(self) -> bytes:
        return conversation_key(self.record.tenant_id, self.record.conversation_id)


def amend_error(
    request: AmendRequest, code: ErrorCode, retry_after_ms: int | None = None
) -> WriterReply:
    """ERROR{code} for the actor (no detail: a probe learns only the code)."""
    error = Error(code=int(code), retry_after_ms=retry_after_ms, request_id=request.request_id)
    return reply_for(request, error=error)


def amend_ack(
    request: AmendRequest, message_id: bytes, conversation_seq: int, last_activity_id: bytes
) -> WriterReply:
    """SEND_ACK of the CONTROL event; ``client_message_id`` empty (the frames carry none)."""
    ack = SendAck(
        request_id=request.request_id,
        message_id=message_id,
        conversation_seq=conversation_seq,
        last_activity_id=last_activity_id,
    )
    return reply_for(request, send_ack=ack)


def amend_target(
    request: AmendRequest,
    membership: AmendMembershipView,
    participants: tuple[str, ...] | None,
) -> tuple[Target, bool] | None:
    """The conversation with what the record pins, and whether the actor is OWNER/ADMIN.

    None when the actor may not write there (check 1). ``participants`` are a direct
    conversation's users as the MessageStore remembers them (None before its first message).
    """
    tenant, user, conversation_id = request.tenant_id, request.user_id, request.conversation_id
    kind = conversation_kind(conversation_id)
    if kind == DIRECT:
        if participants is None or user not in participants:
            return None
        return Target(DIRECT, participants, len(participants), 0), False
    if kind == GROUP:
        if not membership.is_member(tenant, conversation_id, user):
            return None
        count = max(1, membership.member_count(tenant, conversation_id))
        version = membership.version(tenant, conversation_id)
        target = Target(GROUP, (), count, version, e2ee=membership.is_e2ee(tenant, conversation_id))
        return target, membership.is_admin(tenant, conversation_id, user)
    return None


def amend_refusal(
    request: AmendRequest,
    original: MessageRecord | None,
    *,
    is_admin: bool,
    log_now_ms: int,
    limits: WriterLimits,
) -> tuple[ErrorCode, str] | None:
    """Checks 2-4 (module docstring): ``(code, reason)`` of the refusal, None if allowed."""
    if original is None:
        return ErrorCode.PERMISSION_DENIED, "no_target"
    if original.message_type == MESSAGE_TYPE_CONTROL:
        return ErrorCode.PERMISSION_DENIED, "not_a_message"
    own = original.sender_id == request.user_id
    elapsed = log_now_ms - original.created_at
    if request.action == "recall":
        if is_admin:
            return None  # 13.4.3: OWNER/ADMIN recall any message, no window
        if not own:
            return ErrorCode.PERMISSION_DENIED, "not_sender"
        if elapsed > limits.recall_self_window_ms:
            return ErrorCode.PERMISSION_DENIED, "window_closed"
        return None
    if not own:
        return ErrorCode.PERMISSION_DENIED, "not_sender"
    if original.state in _BODY_HIDDEN:
        return ErrorCode.PERMISSION_DENIED, "target_recalled"
    if elapsed > limits.edit_self_window_ms:
        return ErrorCode.PERMISSION_DENIED, "window_closed"
    if len(request.new_payload) > limits.max_custom_payload_bytes:
        return ErrorCode.PAYLOAD_TOO_LARGE, "payload_too_large"
    return None


def already_recalled(request: AmendRequest, original: MessageRecord) -> int | None:
    """13.4.4: the seq of the recall already in the log, or None.

    Keyed on ``recall_event_conversation_seq`` AND the hidden state (INV-35): the state alone
    could short-circuit in the crash window; the seq alone is also set by an edit, and an edited
    message may still be recalled (AT-14).
    """
    if request.action != "recall" or original.state not in _BODY_HIDDEN:
        return None
    return original.recall_event_conversation_seq


def amend_preview(
    action: str, original: MessageRecord, new_payload: bytes, *, e2ee: bool = False
) -> bytes:
    """The record's ``preview_or_placeholder``: the placeholder with the state word, or an
    edit's new payload (``MessageAmended`` docstring). In an E2EE conversation an edit's new
    payload is ciphertext, so its preview is the placeholder too (state ``edited``, 22.3)."""
    if action == "edit" and not e2ee:
        return new_payload
    placeholder = PreviewPlaceholder(
        message_type=original.message_type,
        custom_type=original.custom_type or "",
        state=_STATE_WORD[action],
        e2ee=e2ee,
    )
    return _ENCODER.encode(placeholder)


def repaired_head_preview(current: bytes, action: str) -> bytes:
    """The head's preview after an amend of its preview message: its placeholder, new state.

    The head's preview is that message's :class:`PreviewPlaceholder` (``policy``), so the type
    is known without the target record; an undecodable one becomes a bare placeholder.
    """
    try:
        placeholder = _PREVIEW_DECODER.decode(current)
    except (msgspec.DecodeError, msgspec.ValidationError):
        placeholder = PreviewPlaceholder()
    state = _STATE_WORD.get(action, "")
    return _ENCODER.encode(msgspec.structs.replace(placeholder, state=state))


def amend_record(
    request: AmendRequest,
    target: Target,
    original: MessageRecord,
    coords: Coordinates,
    *,
    repairs_preview: bool,
    retention_class: RetentionClass,
    fencing_epoch: int,
) -> MessageAmended:
    """The outbox record of an accepted amend: ``target_*`` copied from ``original``.

    ``target_reply_to_sender_id`` stays empty: a message's dispatch carries no
    ``reply_to_sender_id`` today (``qim.core.fanout.build.message_template``), so the target's
    entries had no REPLY_ME and the decrement must not assume one (12.5.5).
    """
    return MessageAmended(
        tenant_id=request.tenant_id,
        conversation_id=request.conversation_id,
        conversation_kind=target.kind,
        participants=target.participants,
        message_id=coords.message_id,
        conversation_seq=coords.conversation_seq,
        last_activity_id=coords.last_activity_id,
        sender_id=request.user_id,
        origin_device_id=request.device_id,
        action=request.action,
        target_message_id=original.message_id,
        target_conversation_seq=original.conversation_seq,
        target_sender_id=original.sender_id,
        target_flags=original.flags,  # a non-sender's entry flags of the target (spec 13.3)
        target_mention_targets=original.mention_targets,
        new_payload=request.new_payload if request.action == "edit" else b"",
        repairs_preview=repairs_preview,
        preview_or_placeholder=amend_preview(
            request.action, original, request.new_payload, e2ee=target.e2ee
        ),
        membership_version=target.membership_version,
        member_count=target.member_count,
        committed_at=coords.committed_at,
        retention_class=retention_class,
        fencing_epoch=fencing_epoch,
    )
