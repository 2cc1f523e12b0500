"""ConversationHead (spec 7.4) and the rules that move it: forward only, once per record.

The head is what the writer allocates from (``latest_conversation_seq + 1``) and what the session
list reads (``last_activity_id``, ``last_message_id``, ``preview_or_placeholder``,
``last_sender_id``). It is updated from committed outbox records only, so it never runs ahead of
the log and a replay rebuilds it exactly.

Rules, checked in this order for every record (:func:`classify`):

1. ``fencing_epoch`` below the highest seen for the conversation: a zombie writer's record,
   dropped whole (spec 19.2.1 check point 2, the same per-conversation filter MailboxNodes keep).
   A kind without the field (``fencing_epoch is None``: MembershipCommitted today) is not
   filtered, so its seq is never lost to the filter; it should gain the field.
2. ``last_activity_id`` not above the head's: already applied (replay, or a duplicate append);
   ``last_activity_id`` strictly increases with every activity of a conversation (spec 6.4), so it
   identifies applied records for messages and for seq-less activities alike.
3. a ``conversation_seq`` not above the head's: out of order, dropped; a ``conversation_seq`` is
   never reused and the head never moves back (spec 6.3, 7.4). Only non-message kinds may carry
   ``conversation_seq = 0``, meaning an activity without a seq (join, create; spec 6.4).

``earliest_available_conversation_seq`` is moved by retention, not by the send path, and is not
kept here. ``member_count`` is the display approximation (spec 7.4), never a fanout cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import msgspec

from qim.core.conversation.amend import repaired_head_preview
from qim.schemas.frames.base import U32, U64, U128, U128_ZERO
from qim.schemas.records.membership import MembershipCommitted
from qim.schemas.records.outbox import MessageAmended, MessageCommitted

__all__ = [
    "ApplyOutcome",
    "ConversationHead",
    "Sequenced",
    "SequencedRecord",
    "advance",
    "classify",
]


class SequencedRecord(Protocol):
    """The coordinate fields any outbox record kind must carry to be applied by the writer."""

    @property
    def tenant_id(self) -> str: ...
    @property
    def conversation_id(self) -> str: ...
    @property
    def conversation_seq(self) -> int: ...
    @property
    def message_id(self) -> bytes: ...
    @property
    def last_activity_id(self) -> bytes: ...
    @property
    def committed_at(self) -> int: ...
    @property
    def fencing_epoch(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class Sequenced:
    """The coordinates of a record kind that does not carry them under the standard names."""

    tenant_id: str
    conversation_id: str
    conversation_seq: int
    message_id: bytes
    last_activity_id: bytes
    committed_at: int
    fencing_epoch: int | None = None

    @classmethod
    def of_membership(cls, record: MembershipCommitted) -> Sequenced | None:
        """A membership change's CONTROL message (seq J), or None for an unstamped create chunk.

        A group's conversation id is its group id (``ids``); the record has no fencing epoch yet.
        """
        if record.conversation_seq == 0 and record.last_activity_id == U128_ZERO:
            return None
        return cls(
            tenant_id=record.tenant_id,
            conversation_id=record.group_id,
            conversation_seq=record.conversation_seq,
            message_id=record.message_id,
            last_activity_id=record.last_activity_id,
            committed_at=record.committed_at,
        )


class ApplyOutcome(Enum):
    """What ``apply()`` did with a record; only APPLIED changed the state."""

    APPLIED = "applied"
    UNSEQUENCED = "unsequenced"  # a record with no coordinates (an earlier create chunk)
    ALREADY_APPLIED = "already_applied"
    STALE_EPOCH = "stale_epoch"
    OUT_OF_ORDER = "out_of_order"


class ConversationHead(msgspec.Struct, frozen=True, array_like=True):
    """One conversation's head; array-encoded inside writer snapshots."""

    tenant_id: str
    conversation_id: str
    latest_conversation_seq: U64 = 0
    last_message_id: U128 = U128_ZERO
    last_activity_id: U128 = U128_ZERO
    last_sender_id: str = ""
    preview_or_placeholder: bytes = b""
    member_count: U32 = 0
    updated_at: U64 = 0
    fencing_epoch: U64 = 0
    head_version: U64 = 0
    e2ee: bool = False
    """A message of this conversation was committed E2EE (spec 22.1: then all are). For a
    direct conversation this is the flag fixed by its first message; trailing, so older
    snapshots decode."""
    write_policy: str = "always"
    """The ``mailbox_write_policy`` of the last message (spec 10.2.3); trailing like ``e2ee``."""
    policy_switched_at: U64 = 0
    """Log time (``committed_at``) of the message that last changed ``write_policy``: the
    switch instant 10.2.3 records in the conversation metadata (0 = never switched)."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.tenant_id, self.conversation_id)


def classify(head: ConversationHead | None, record: SequencedRecord) -> ApplyOutcome:
    """Whether ``record`` moves ``head`` (APPLIED) or why it is dropped; pure."""
    if head is None:
        return ApplyOutcome.APPLIED
    if record.fencing_epoch is not None and record.fencing_epoch < head.fencing_epoch:
        return ApplyOutcome.STALE_EPOCH
    if record.last_activity_id <= head.last_activity_id:
        return ApplyOutcome.ALREADY_APPLIED
    seq = record.conversation_seq
    seqless = seq == 0 and not isinstance(record, MessageCommitted)
    if not seqless and seq <= head.latest_conversation_seq:
        return ApplyOutcome.OUT_OF_ORDER
    return ApplyOutcome.APPLIED


def advance(head: ConversationHead | None, record: SequencedRecord) -> ConversationHead:
    """The head after an APPLIED record: a message moves everything, other kinds the position.

    Non-message kinds (membership CONTROL and other activities, spec 6.4) move the seq (if they
    carry one), ``last_activity_id`` and the epoch, but not ``last_message_id`` or the preview.
    An amend (recall / edit / delete) occupies a seq like them (the head is the allocation
    counter, topology.md decision on INV-05); when it ``repairs_preview`` the preview becomes the
    target's placeholder with the new state and ``last_sender_id`` is kept (spec 13.4.1 step 4).
    """
    if head is None:
        head = ConversationHead(record.tenant_id, record.conversation_id)
    common = {
        "latest_conversation_seq": max(head.latest_conversation_seq, record.conversation_seq),
        "last_activity_id": record.last_activity_id,
        "updated_at": max(head.updated_at, record.committed_at),
        "fencing_epoch": max(head.fencing_epoch, record.fencing_epoch or 0),
        "head_version": head.head_version + 1,
    }
    if isinstance(record, MessageCommitted):
        switched = head.policy_switched_at
        if record.write_policy != head.write_policy:
            switched = record.committed_at
        return msgspec.structs.replace(
            head,
            write_policy=record.write_policy,
            policy_switched_at=switched,
            last_message_id=record.message_id,
            last_sender_id=record.sender_id,
            preview_or_placeholder=record.preview_or_placeholder,
            member_count=record.member_count,
            e2ee=head.e2ee or record.e2ee,
            **common,
        )
    if isinstance(record, MessageAmended) and record.repairs_preview:
        preview = repaired_head_preview(head.preview_or_placeholder, record.action)
        return msgspec.structs.replace(head, preview_or_placeholder=preview, **common)
    return msgspec.structs.replace(head, **common)
