"""REACT on the ConversationWriter (spec 13.6.2-13.6.3): checks, idempotency, the record.

Pure pieces of :meth:`ConversationWriterState.handle_react
<qim.core.conversation.writer.ConversationWriterState.handle_react>`, which decides and never
mutates, like ``handle_send``. Checks, in this order:

1. the frame: ``action`` is ``add`` or ``remove`` (else ``UPGRADE_REQUIRED``: a newer client's
   word this build cannot understand, the connection lives on); ``reaction_key`` is a short
   enum string (13.6.4: never encrypted, the server aggregates it): non-empty, no NUL
   (``PERMISSION_DENIED``), at most :data:`REACTION_KEY_MAX_BYTES` UTF-8 bytes
   (``PAYLOAD_TOO_LARGE``);
2. the requester belongs to the conversation (ACTIVE group member whose visible interval holds
   the target, or a participant of the one-to-one conversation), else ``PERMISSION_DENIED``;
3. the target is a normal, visible message (not absent, not a CONTROL, not RECALLED / DELETED),
   else ``PERMISSION_DENIED`` (a probe learns only "no");
4. the idempotency key ``(tenant, conversation, seq, user, reaction_key)`` (13.6.2): a repeated
   add, or a remove of a reaction the user does not have, succeeds with the current aggregate
   and appends nothing, so ``summary_version`` does not move (AT-67) -- also at the rate cap:
   "returns success" is unconditional, and a no-op costs the system one point read;
5. ``per_user_reaction_rate`` (``RATE_LIMITED`` with ``retry_after_ms``), a bucket of its own,
   counted apart from ``per_user_msg_rate`` (13.6.3 item 4) and debited from the log like the
   message buckets (``admission``), so a no-op or a refusal costs no token;
6. otherwise a :class:`~qim.schemas.records.outbox.MessageReacted` with the new absolute counts
   and ``summary_version + 1``.

The aggregate and the rows are read through a :class:`~qim.core.reactions.store.ReactionReader`:
the MessageStore under the open transaction's own reaction writes, so two REACTs of one batch
see each other without cutting the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from qim.core.history.records import MessageRecord, MessageState
from qim.core.reactions.store import (
    PointReader,
    ReactionSummary,
    has_reaction,
    read_summary,
    self_reaction_keys,
)
from qim.schemas.frames.errors import ErrorCode
from qim.schemas.frames.reactions import ReactionUpdate
from qim.schemas.records.membership import MESSAGE_TYPE_CONTROL
from qim.schemas.records.outbox import REACTION_ACTIONS, ConversationKind, MessageReacted
from qim.schemas.records.requests import ReactRequest

__all__ = [
    "REACTION_KEY_MAX_BYTES",
    "ReactTarget",
    "ReactionLimits",
    "frame_refusal",
    "reaction_record",
    "target_refusal",
    "update_body",
]

REACTION_KEY_MAX_BYTES: Final = 64
"""Ours: Appendix B gives no bound; 64 bytes like ``custom_type_max_bytes`` (an enum word)."""

_HIDDEN = frozenset({MessageState.RECALLED, MessageState.DELETED})


@dataclass(frozen=True, slots=True)
class ReactionLimits:
    """The B.6.1 reaction values (tenant-configurable)."""

    detail_max_members: int = 1000
    detail_max_per_message: int = 10_000
    detail_page_limit: int = 100


@dataclass(frozen=True, slots=True)
class ReactTarget:
    """The conversation as the record pins it (kind, direct participants, member count)."""

    kind: ConversationKind
    participants: tuple[str, ...]
    member_count: int
    membership_version: int


def frame_refusal(request: ReactRequest) -> tuple[ErrorCode, str] | None:
    """Check 1 (module docstring): ``(code, reason)`` of a malformed REACT, or None."""
    if request.action not in REACTION_ACTIONS:
        return ErrorCode.UPGRADE_REQUIRED, "unknown_action"
    key = request.reaction_key
    if not key or "\x00" in key:
        return ErrorCode.PERMISSION_DENIED, "invalid_reaction_key"
    if len(key.encode("utf-8")) > REACTION_KEY_MAX_BYTES:
        return ErrorCode.PAYLOAD_TOO_LARGE, "reaction_key_too_long"
    return None


def target_refusal(
    original: MessageRecord | None, visible: tuple[int, int | None] | None
) -> str | None:
    """Check 3: the reason the target may not be reacted to, or None.

    ``visible`` is a group member's open interval ``(joined_at, left_at)``; None for a
    one-to-one conversation (full interval).
    """
    if original is None:
        return "no_target"
    if original.message_type == MESSAGE_TYPE_CONTROL:
        return "not_a_message"
    if original.state in _HIDDEN:
        return "target_recalled"
    if visible is not None:
        joined_at, left_at = visible
        seq = original.conversation_seq
        if seq <= joined_at or (left_at is not None and seq >= left_at):
            return "not_visible"
    return None


def update_body(
    request: ReactRequest, summary: ReactionSummary | None, mine: tuple[str, ...]
) -> ReactionUpdate:
    """The absolute REACTION_UPDATE of the message as ``summary`` has it, for ``request``'s user."""
    return ReactionUpdate(
        conversation_id=request.conversation_id,
        conversation_seq=request.conversation_seq,
        counts={} if summary is None else dict(summary.counts),
        summary_version=0 if summary is None else summary.summary_version,
        self_reaction_keys=mine,
    )


def reaction_record(
    request: ReactRequest,
    reader: PointReader,
    target: ReactTarget,
    original: MessageRecord,
    *,
    limits: ReactionLimits,
    committed_at: int,
    fencing_epoch: int,
) -> MessageReacted | ReactionUpdate:
    """Checks 5-6: the record of a change, or the current aggregate when nothing changes."""
    t, c, seq = request.tenant_id, request.conversation_id, request.conversation_seq
    key, user = request.reaction_key, request.user_id
    summary = read_summary(reader, t, c, seq)
    counts = {} if summary is None else dict(summary.counts)
    mine = self_reaction_keys(reader, t, c, seq, counts, user)
    has = has_reaction(reader, t, c, seq, key, user)
    rows = 0 if summary is None else summary.detail_rows
    complete = True if summary is None else summary.detail_complete
    if request.action == "add":
        if has:
            return update_body(request, summary, mine)
        detail = rows < limits.detail_max_per_message
        counts[key] = counts.get(key, 0) + 1
        rows += int(detail)
        complete = complete and detail
        mine = tuple(sorted({*mine, key})) if detail else mine
    else:
        if not has:
            return update_body(request, summary, mine)
        detail = True
        counts[key] = counts.get(key, 0) - 1
        if counts[key] <= 0:
            del counts[key]
        rows -= 1
        mine = tuple(k for k in mine if k != key)
    return MessageReacted(
        tenant_id=t,
        conversation_id=c,
        conversation_kind=target.kind,
        participants=target.participants,
        target_conversation_seq=seq,
        target_message_id=original.message_id,
        user_id=user,
        origin_device_id=request.device_id,
        reaction_key=key,
        action="add" if request.action == "add" else "remove",
        counts=dict(sorted(counts.items())),
        summary_version=(0 if summary is None else summary.summary_version) + 1,
        detail=detail,
        detail_rows=rows,
        detail_complete=complete,
        self_reaction_keys=mine,
        membership_version=target.membership_version,
        member_count=target.member_count,
        committed_at=committed_at,
        fencing_epoch=fencing_epoch,
    )
