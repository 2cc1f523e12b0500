"""One GroupDispatch per target MailboxShard, every field copied from the commit (spec 7.8, 10.1).

Why copy and never look up: the MailboxNode materializes entries from the dispatch alone (spec
6.7 I-5: ``created_at = committed_at``, ``event_id`` from ``dispatch_id``), and the commit record
already carries every decision taken at commit time (``qim.schemas.records.outbox``). The body
always rides along (direction 4.4: stored once per shard, joined at read time); ``inline_body``
is the writer's ADR-0005 decision, shipped unchanged to every shard (spec 7.3, 26.3.7).

Event templates (spec 7.3 flags, 12.4 table, 12.5.1):

* a committed message: ``event_type = MESSAGE`` and the flags the writer put on the record
  (all three for an ordinary message, the declared contract for a custom type, spec 13.3). The
  sender's own entry never counts unread (12.5.1 ``m.sender_id != u``; a MailboxNode rule). An
  ``anchor_target`` custom message carries its target in ``target_conversation_seq`` (copied
  onto every entry, so a client anchors it without knowing the type), and its
  ``preview_or_placeholder`` (the 13.3 ``preview_template``), which the shard keeps as the
  session preview instead of a payload prefix. So does an E2EE message (``e2ee``, spec 22.3):
  its preview is the generic placeholder whatever its type.
* a membership CONTROL message (``qim.membership.v1``, App. A.3, ADR-0021): ``event_type =
  MEMBERSHIP`` for its subjects (the joined, left, removed or banned users), with
  ``counts_unread = false`` (joining creates no unread, 10.1.3), ``affects_session_order = true``
  (the conversation moves: 12.4 "create/join", "leave", "kicked") and ``timeline_visible = true``
  ("you joined the group", 26.3.5). The subjects are explicit recipients (``participants`` =
  the subjects on that shard): a leaver is no longer in the new version, and its ``left_at`` is
  this very seq, so no member expansion would reach it.
* broadcast (10.1.3): with ``member_count <= membership_event_broadcast_max_members`` the same
  dispatch pins the new ``membership_version`` and the other members get it as an ordinary
  MESSAGE entry (same flags: a notice, not unread); above the threshold it pins version 0, which
  means "explicit recipients only", exactly like a direct conversation, so non-subjects get 0
  entries (26.3.9).
* an amend (RECALL / EDIT / delete, spec 13.4.1 step 5, ``MessageAmended``): recipients exactly
  like a message at the event's own seq (the pinned version's visible members, or the direct
  participants), ``event_type = CONTROL``, :data:`AMEND_TEMPLATE` (anchor_target: no unread, no
  move, shown in place on the target row, 13.4.2), ``payload`` = an edit's new body, never
  inlined; ``amend_action`` / ``target_*`` / ``preview_or_placeholder`` copied from the record.
"""

from __future__ import annotations

from collections.abc import Callable

from qim.core.fanout.event_group import chunk_dispatch_id
from qim.schemas.events import EventType
from qim.schemas.frames.base import EntryFlags
from qim.schemas.ids import message_id_from_bytes
from qim.schemas.message_types import MessageType
from qim.schemas.records.dispatch import EventTemplate, GroupDispatch
from qim.schemas.records.membership import (
    MEMBERSHIP_CUSTOM_TYPE,
    MESSAGE_TYPE_CONTROL,
    MembershipCommitted,
    control_of,
    encode_control,
)
from qim.schemas.records.outbox import GROUP, MessageAmended, MessageCommitted

__all__ = [
    "AMEND_TEMPLATE",
    "MEMBERSHIP_TEMPLATE",
    "MESSAGE_TEMPLATE_FLAGS",
    "amend_dispatch",
    "anchor_target_seq",
    "membership_dispatch",
    "message_dispatch",
    "message_template",
    "shards_of",
]

MESSAGE_TEMPLATE_FLAGS = EventTemplate(
    counts_unread=True, affects_session_order=True, timeline_visible=True
)
"""Flags of an ordinary committed message (a custom type's come from its record's ``flags``)."""

MEMBERSHIP_TEMPLATE = EventTemplate(
    counts_unread=False, affects_session_order=True, timeline_visible=True
)
"""Flags of a membership CONTROL message, for its subjects and for a broadcast alike."""

AMEND_TEMPLATE = EventTemplate(
    counts_unread=False, affects_session_order=False, timeline_visible=True
)
"""Flags of a recall / edit / delete CONTROL entry (12.4.2: ``affects_session_order=false``)."""


def message_template(record: MessageCommitted) -> EventTemplate:
    """The template of a committed message: the flags its writer fixed (spec 13.3, the record's
    ``flags``; every flag for an ordinary message) plus its mention targets."""
    return EventTemplate(
        counts_unread=bool(record.flags & EntryFlags.COUNTS_UNREAD),
        affects_session_order=bool(record.flags & EntryFlags.AFFECTS_SESSION_ORDER),
        timeline_visible=bool(record.flags & EntryFlags.TIMELINE_VISIBLE),
        mention_targets=record.mention_targets,
    )


def anchor_target_seq(record: MessageCommitted) -> int | None:
    """The row an ``anchor_target`` custom message updates in place (its
    ``reply_to_conversation_seq``, checked by the writer); None for every other anchor."""
    if record.anchor_mode != "anchor_target":
        return None
    return record.reply_to_conversation_seq


def shards_of(users: tuple[str, ...], shard_of: Callable[[str], int]) -> tuple[int, ...]:
    """Distinct MailboxShards of ``users``, ascending (never set-iteration order)."""
    return tuple(sorted({shard_of(user) for user in users}))


def message_dispatch(record: MessageCommitted, shard: int) -> GroupDispatch:
    """The unsplit dispatch of a committed message for one target shard (chunk 0 of 1)."""
    return GroupDispatch(
        tenant_id=record.tenant_id,
        dispatch_id=chunk_dispatch_id(message_id_from_bytes(record.message_id), shard),
        message_id=record.message_id,
        conversation_id=record.conversation_id,
        conversation_kind=record.conversation_kind,
        conversation_seq=record.conversation_seq,
        last_activity_id=record.last_activity_id,
        sender_id=record.sender_id,
        origin_device_id=record.origin_device_id,
        client_message_id=record.client_message_id,
        participants=record.participants,
        fencing_epoch=record.fencing_epoch,
        membership_version=record.membership_version,
        target_mailbox_shard=shard,
        committed_at=record.committed_at,
        event_template=message_template(record),
        event_type=int(EventType.MESSAGE),  # plain int: an IntEnum 0 is not omitted as default
        inline_body=record.inline_body,
        message_type=record.message_type,
        custom_type=record.custom_type,
        schema_version=record.schema_version,
        payload=record.payload,
        reply_to_conversation_seq=record.reply_to_conversation_seq,
        retention_class=record.retention_class,
        target_conversation_seq=anchor_target_seq(record),
        preview_or_placeholder=(
            record.preview_or_placeholder
            if record.message_type == MessageType.CUSTOM or record.e2ee
            else record.sealed_preview  # b"" unless the writer sealed the body (21.3.4)
        ),
        e2ee=record.e2ee,
        write_policy=record.write_policy,
    )


def membership_dispatch(
    record: MembershipCommitted,
    shard: int,
    *,
    subjects: tuple[str, ...],
    broadcast: bool,
    fencing_epoch: int = 0,
) -> GroupDispatch:
    """The dispatch of a membership CONTROL message for one shard (module docstring).

    ``subjects`` are the record's targets routed to ``shard`` (ascending); ``broadcast`` pins
    the new version so the MailboxNode also expands the shard's other members.
    ``MembershipCommitted`` carries no ``fencing_epoch``; the caller passes the writer epoch it
    knows (0 = unfenced, spec 19.2.1 while ADR-0020 holds).
    """
    return GroupDispatch(
        tenant_id=record.tenant_id,
        dispatch_id=chunk_dispatch_id(message_id_from_bytes(record.message_id), shard),
        message_id=record.message_id,
        conversation_id=record.group_id,
        conversation_kind=GROUP,
        conversation_seq=record.conversation_seq,
        last_activity_id=record.last_activity_id,
        sender_id=record.actor,
        participants=subjects,
        fencing_epoch=fencing_epoch,
        membership_version=record.membership_version if broadcast else 0,
        target_mailbox_shard=shard,
        committed_at=record.committed_at,
        event_template=MEMBERSHIP_TEMPLATE,
        event_type=int(EventType.MEMBERSHIP),
        message_type=MESSAGE_TYPE_CONTROL,
        custom_type=MEMBERSHIP_CUSTOM_TYPE,
        payload=encode_control(control_of(record)),
    )


def amend_dispatch(record: MessageAmended, shard: int) -> GroupDispatch:
    """The unsplit CONTROL dispatch of an amend for one target shard (module docstring)."""
    return GroupDispatch(
        tenant_id=record.tenant_id,
        dispatch_id=chunk_dispatch_id(message_id_from_bytes(record.message_id), shard),
        message_id=record.message_id,
        conversation_id=record.conversation_id,
        conversation_kind=record.conversation_kind,
        conversation_seq=record.conversation_seq,
        last_activity_id=record.last_activity_id,
        sender_id=record.sender_id,
        origin_device_id=record.origin_device_id,
        participants=record.participants,
        fencing_epoch=record.fencing_epoch,
        membership_version=record.membership_version,
        target_mailbox_shard=shard,
        committed_at=record.committed_at,
        event_template=AMEND_TEMPLATE,
        event_type=int(EventType.CONTROL),
        inline_body=False,
        payload=record.new_payload if record.action == "edit" else b"",
        retention_class=record.retention_class,
        amend_action=record.action,
        target_message_id=record.target_message_id,
        target_conversation_seq=record.target_conversation_seq,
        target_sender_id=record.target_sender_id,
        target_flags=record.target_flags,
        target_mention_targets=record.target_mention_targets,
        target_reply_to_sender_id=record.target_reply_to_sender_id,
        preview_or_placeholder=record.preview_or_placeholder,
    )
