"""The dispatch log: one partition per MailboxShard, the MailboxNode's only input of state.

Topic ``qim.dispatch``, **explicit partition = target mailbox shard** (never key hash, spec
6.5). Every change to mailbox-side state is a record here (direction.md 3): a
:class:`GroupDispatch` per (committed message, target shard) from the FanoutCoordinator (spec
7.8), the member slices of each membership version (:class:`MemberSliceRecord`, published before
any dispatch pinned to that version, direction.md 4.3), and later the users' own state commands
(mark read, pin, mute...). ``mailbox_seq`` = (shard_epoch, offset of the record in its
partition), so the MailboxNode's store is a pure function of this log.

Values are tagged msgpack maps (``kind``), defaults omitted, unknown keys ignored on decode.
"""

from __future__ import annotations

from typing import TypeAlias

import msgspec

from qim.schemas.frames.base import U8, U32, U64, U128
from qim.schemas.hashing import hash_input
from qim.schemas.records.membership import MemberSliceRecord
from qim.schemas.records.outbox import AmendAction, ConversationKind, RetentionClass
from qim.schemas.records.user_state import UserStateCommand

__all__ = [
    "DispatchLogRecord",
    "EventTemplate",
    "GroupDispatch",
    "ReactionSummary",
    "ShardLogRecord",
    "decode_dispatch_record",
    "dispatch_key",
    "encode_dispatch_record",
]


class EventTemplate(
    msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True, forbid_unknown_fields=False
):
    """How recipients' entries are derived (spec 7.3 flags, 7.8 event_template).

    ``counts_unread`` / ``affects_session_order`` / ``timeline_visible`` become the entry's
    ``flags`` (the sender's own entry never counts unread, spec 12.5.1). ``mention_targets`` are
    user ids (or ``"@all"``): a named recipient's MESSAGE entry carries the ``mention_type``
    (spec 11.4.1); a separate MENTION entry in the same event group exists only in the
    ``mention_only`` write tier (spec 6.7, 10.2.3). ``reply_to_sender_id`` gives that user
    ``mention_type = REPLY_ME``.
    """

    counts_unread: bool = True
    affects_session_order: bool = True
    timeline_visible: bool = True
    mention_targets: tuple[str, ...] = ()
    reply_to_sender_id: str = ""


class GroupDispatch(
    msgspec.Struct,
    kw_only=True,
    omit_defaults=True,
    frozen=True,
    forbid_unknown_fields=False,
    tag_field="kind",
    tag="dispatch",
):
    """One committed message for one target MailboxShard (spec 7.8; exactly one per shard).

    Recipients: for a group, the members of ``membership_version`` in this shard (the slice the
    MailboxNode holds) whose visible interval contains ``conversation_seq``; for a direct
    conversation, ``participants`` that fall in this shard. A membership notice lists the
    affected users in ``participants`` (they get a MEMBERSHIP entry even after leaving); with
    ``membership_version = 0`` only those listed users receive it (large groups, spec 26.3.9).
    The body always rides along (direction.md 4.4: stored once per shard, joined at read
    time); ``inline_body`` is the
    writer's ADR-0005 decision and only changes whether entries carry it materialized.
    ``client_message_id`` goes on the sender's own entry only; ``origin_device_id`` is the
    sending device (control events are not pushed back to it, spec 7.3, 9.7).
    ``chunk_index``/``chunk_count`` split a dispatch whose event groups would exceed the 6.7 caps
    (a split gets another ``dispatch_id`` input: the chunk index is part of its identity).

    Recall / edit / moderation delete (spec 13.4.1 step 5; :class:`MessageAmended`): set
    ``amend_action``; ``event_type`` is CONTROL, the template neither counts unread nor moves the
    session order (anchor_target), ``payload`` is an edit's new payload. ``target_*`` are copied
    from the target's MessageRecord by the writer: a recipient's ``target_mention_type`` is
    computed from ``target_mention_targets`` / ``target_reply_to_sender_id`` exactly like a
    message's ``mention_type`` (11.4.1); ``target_flags`` are the target entry's flags as a
    non-sender saw them. ``preview_or_placeholder`` is the target's preview after the amend
    (:class:`~qim.schemas.records.outbox.MessageAmended`); on a message's dispatch it is empty,
    except for a custom type (spec 13.3): its writer-fixed placeholder with the
    ``preview_template``, the session preview the shard keeps, and an E2EE message (``e2ee``,
    spec 22.3): the generic placeholder, so the shard never keeps a ciphertext prefix as the
    preview. ``e2ee`` also tells the push planner to send the placeholder only (16.7).
    ``target_conversation_seq`` of a message's dispatch is an ``anchor_target`` custom
    message's target row.
    """

    tenant_id: str
    dispatch_id: bytes  # 16 bytes, spec 7.8 frozen derivation (qim.schemas.dispatch_id)
    message_id: U128
    conversation_id: str
    conversation_kind: ConversationKind
    conversation_seq: U64
    last_activity_id: U128
    sender_id: str
    origin_device_id: str = ""
    client_message_id: str = ""
    participants: tuple[str, ...] = ()
    fencing_epoch: U64 = 0
    membership_version: U64 = 0
    target_mailbox_shard: U32
    committed_at: U64
    event_template: EventTemplate = EventTemplate()
    event_type: U8 = 0  # EventType of the primary entry: MESSAGE, MEMBERSHIP or CONTROL
    inline_body: bool = False
    message_type: U8 = 0
    custom_type: str = ""
    schema_version: U32 = 0
    payload: bytes = b""
    reply_to_conversation_seq: U64 | None = None
    retention_class: RetentionClass = "default"
    chunk_index: U32 = 0
    chunk_count: U32 = 1
    amend_action: AmendAction | None = None
    target_message_id: U128 | None = None
    target_conversation_seq: U64 | None = None
    target_sender_id: str = ""
    target_flags: U8 = 0
    target_mention_targets: tuple[str, ...] = ()
    target_reply_to_sender_id: str = ""
    preview_or_placeholder: bytes = b""
    e2ee: bool = False
    write_policy: str = "always"
    """The message's ``mailbox_write_policy`` (spec 10.2.3): under "mention_only" a slice member
    gets a MESSAGE entry only while active on its shard, a mentioned one a MENTION entry always
    (``qim.core.fanout.recipients``)."""

    @property
    def key(self) -> bytes:
        return dispatch_key(self.tenant_id, self.dispatch_id)

    @property
    def partition(self) -> int:
        return self.target_mailbox_shard


class ReactionSummary(
    msgspec.Struct,
    kw_only=True,
    omit_defaults=True,
    frozen=True,
    forbid_unknown_fields=False,
    tag_field="kind",
    tag="reaction_summary",
):
    """A message's reaction aggregate after one committed REACT, for one MailboxShard.

    Why it rides the dispatch log: PULL_MAILBOX joins from the shard's own copies
    (direction.md 4.4) and never reads the MessageStore, so the aggregate that 13.6 / 18.3.1
    return "with the message" must reach the shard through its log like a recall does.
    It is **no entry** (13.6.1, INV-36): the MailboxNode only overwrites the counts kept on the
    message's facts row (every message has one, inline or not) when ``summary_version`` is
    newer, so a redelivery or an out-of-order pair changes nothing. One record per target shard
    (the shards with members), never per member.
    """

    tenant_id: str
    conversation_id: str
    message_id: U128  # the reacted message (the outbox record's target_message_id)
    conversation_seq: U64
    counts: dict[str, U32] = msgspec.field(default_factory=dict)
    summary_version: U64
    target_mailbox_shard: U32
    committed_at: U64

    @property
    def key(self) -> bytes:
        """``tenant 0x00 message_id``: every summary of one message on the same key."""
        return hash_input(self.tenant_id, self.message_id)

    @property
    def partition(self) -> int:
        return self.target_mailbox_shard


DispatchLogRecord: TypeAlias = GroupDispatch | MemberSliceRecord | ReactionSummary
"""What the FanoutCoordinator writes to the dispatch log."""

ShardLogRecord: TypeAlias = GroupDispatch | MemberSliceRecord | UserStateCommand | ReactionSummary
"""Every kind of the dispatch log: the fanout's plus the MailboxNode's own appends of users'
state commands (``UserStateCommand``, 12.9)."""

_DECODER: msgspec.msgpack.Decoder[ShardLogRecord] = msgspec.msgpack.Decoder(ShardLogRecord)
_ENCODER = msgspec.msgpack.Encoder()


def dispatch_key(tenant_id: str, dispatch_id: bytes) -> bytes:
    """Kafka key of a dispatch: ``tenant 0x00 dispatch_id`` (direction.md 3)."""
    if len(dispatch_id) != 16:
        raise ValueError("dispatch_id is 16 bytes")
    return hash_input(tenant_id, dispatch_id)


def encode_dispatch_record(record: ShardLogRecord) -> bytes:
    return _ENCODER.encode(record)


def decode_dispatch_record(data: bytes) -> ShardLogRecord:
    """Decode a dispatch-log value; raises ``msgspec.ValidationError`` / ``DecodeError``."""
    return _DECODER.decode(data)
