"""Records of ``qim.outbox``, the commit log the ConversationWriter appends to (spec 8.1 step 7).

One record per committed conversation event; key :func:`~qim.schemas.records.conversation_key`
``(tenant, conversation_id)``, so a conversation's records are totally ordered in one partition.
The FanoutCoordinator (GroupDispatch, spec 7.8) and the HistoryArchiver / MessageStore (the
MessageRecord of spec 7.1) are pure functions of these records, and so is the writer's own state
(``qim.core.conversation``: ConversationHead, ClientDedup, HLC, admission buckets), which is
rebuilt by replaying them. A record therefore carries every decision taken at commit time, never
something a consumer would recompute with its own clock or configuration:

* ``committed_at`` is the writer's HLC time of ``message_id`` in Unix ms (spec 7.3: an entry's
  ``created_at`` is this value, never a consumer's clock);
* ``inline_body`` is decided once here (ADR-0005, spec 3 item 4, 7.8), MailboxNodes only execute;
* ``membership_version`` / ``member_count`` are pinned before the append (spec 7.9, 8.2 L3);
* ``fencing_epoch`` is the writer's epoch (spec 19.2.1 check point 2), filtered downstream.

u128 ids travel as 16-byte big-endian ``bin`` (spec 6.1), like in frames. Encoding: a tagged
msgpack map (``kind``), defaults omitted, unknown keys ignored (spec 27.2.1).

Extension point: a record kind is a tagged struct added to :data:`OutboxRecord`; membership
changes (``MembershipCommitted``, tag ``membership``, ``qim.schemas.records.membership``) are the
first. Every kind that occupies a ``conversation_seq`` or a ``last_activity_id`` must be applied
to the writer's state too, or the next message would reuse its seq: ``qim.core.conversation``
applies any record carrying the coordinate fields of :class:`MessageCommitted` under the same
names (``tenant_id, conversation_id, conversation_seq, message_id, last_activity_id,
committed_at, fencing_epoch``) generically (head, HLC and fencing filter advance; dedup,
admission and preview are message-only), and adapts ``MembershipCommitted`` explicitly.
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

import msgspec

from qim.schemas.frames.base import U8, U32, U64, U128, U128_ZERO, EntryFlags
from qim.schemas.records.membership import MembershipCommitted

__all__ = [
    "AMEND_ACTIONS",
    "DIRECT",
    "GROUP",
    "MESSAGE_FLAGS",
    "REACTION_ACTIONS",
    "RETENTION_CLASSES",
    "AmendAction",
    "ConversationKind",
    "MessageAmended",
    "MessageCommitted",
    "MessageReacted",
    "OutboxRecord",
    "PreviewPlaceholder",
    "ReactionAction",
    "RetentionClass",
    "decode_outbox_record",
    "encode_outbox_record",
]

ConversationKind: TypeAlias = Literal["direct", "group"]
DIRECT: Final = "direct"
GROUP: Final = "group"

MESSAGE_FLAGS: Final = int(
    EntryFlags.COUNTS_UNREAD | EntryFlags.AFFECTS_SESSION_ORDER | EntryFlags.TIMELINE_VISIBLE
)
"""``MessageCommitted.flags`` of an ordinary message (and of every record written before the
spec 13.3 contract existed: the default is omitted, so their bytes are unchanged)."""

RetentionClass: TypeAlias = Literal["default", "ephemeral_24h", "compliance_hold", "tenant_custom"]
RETENTION_CLASSES: Final[tuple[str, ...]] = (
    "default",
    "ephemeral_24h",
    "compliance_hold",
    "tenant_custom",
)


class MessageCommitted(
    msgspec.Struct,
    kw_only=True,
    omit_defaults=True,
    frozen=True,
    forbid_unknown_fields=False,
    tag_field="kind",
    tag="message",
):
    """A committed SEND_MESSAGE: the coordinates, the body and every commit-time decision.

    ``participants`` lists a direct conversation's users (sorted, one entry for a note to self)
    so fanout needs no lookup; it is empty for groups, whose recipients are the pinned
    ``membership_version``. ``member_count`` is that version's count (direct: the participants),
    the L3 fanout cost and the ``N`` of the inline decision. ``last_activity_id`` equals
    ``message_id`` for a message (same ID space, spec 6.4; the message is the activity).
    ``preview_or_placeholder`` is the ConversationHead preview fixed by the writer (spec 7.4,
    13.3): consumers copy it, they never derive one from the payload.

    The spec 13.3 contract of the type, decided by the writer from the tenant's declaration and
    copied here so no consumer reads live configuration (replay stays identical): ``flags`` are
    a non-sender's entry flags (``EntryFlags``), ``anchor_mode`` is ``own_seq`` /
    ``anchor_target`` (the target is ``reply_to_conversation_seq``) / ``none``,
    ``schema_version`` the declared one (0 for non-custom types).

    ``e2ee``: the conversation is end-to-end encrypted (spec 22.1, its creation flag): the
    payload is client ciphertext, passed through untouched, and ``preview_or_placeholder`` is
    the E2EE :class:`PreviewPlaceholder` (22.3), which the fanout ships to every shard so the
    session preview is never a payload prefix.
    """

    tenant_id: str
    conversation_id: str
    conversation_kind: ConversationKind
    participants: tuple[str, ...] = ()
    message_id: U128
    conversation_seq: U64
    last_activity_id: U128
    sender_id: str
    origin_device_id: str
    client_message_id: str = ""
    message_type: U8 = 0
    custom_type: str = ""
    payload: bytes = b""
    mention_targets: tuple[str, ...] = ()
    reply_to_conversation_seq: U64 | None = None
    membership_version: U64 = 0
    member_count: U32
    committed_at: U64
    inline_body: bool = False
    retention_class: RetentionClass = "default"
    preview_or_placeholder: bytes = b""
    fencing_epoch: U64 = 0
    flags: U8 = MESSAGE_FLAGS
    anchor_mode: str = "own_seq"
    schema_version: U32 = 0
    write_policy: str = "always"
    """``mailbox_write_policy`` the writer decided for this message (spec 10.2.3,
    ``qim.core.fanout.write_policy``): "always" or "mention_only"; copied onto its dispatches."""
    e2ee: bool = False
    sealed_preview: bytes = b""
    """The session preview of an ordinary (non-custom, non-E2EE) message: the first
    ``PREVIEW_BYTES`` of the body, sealed by the writer like the body (spec 21.3.4; AAD seq 0,
    ``qim.agents.keyring.PREVIEW_SEQ``). The fanout ships it as the dispatch's
    ``preview_or_placeholder``, so a MailboxNode never slices a preview out of ciphertext.
    Empty when bodies are not sealed (records written before crypto-erasure)."""


class PreviewPlaceholder(
    msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True, forbid_unknown_fields=False
):
    """The default ``preview_or_placeholder``: the type, never the payload.

    The server must not parse payloads (custom types, E2EE ciphertext; spec 13.1, 13.3): the
    preview is this msgpack map and the client renders "[image]", a declared custom type's
    ``template`` (its 13.3 ``preview_template``), "[custom message]" or its own decrypted text.
    """

    message_type: U8 = 0
    custom_type: str = ""
    template: str = ""
    """The custom type's ``preview_template`` (spec 13.3), a fixed text; empty otherwise."""
    state: str = ""
    """``""`` for a message as sent; ``"recalled"`` / ``"edited"`` / ``"deleted"`` after an amend
    (spec 13.4.1 step 4: the preview becomes "message recalled")."""
    e2ee: bool = False
    """The message is end-to-end encrypted: the generic placeholder of spec 22.3 (clients
    render "[Encrypted message]" or their own decrypted text); it holds no body fragment."""


AmendAction: TypeAlias = Literal["recall", "edit", "delete"]
AMEND_ACTIONS: Final[tuple[str, ...]] = ("recall", "edit", "delete")


class MessageAmended(
    msgspec.Struct,
    kw_only=True,
    omit_defaults=True,
    frozen=True,
    forbid_unknown_fields=False,
    tag_field="kind",
    tag="amend",
):
    """A committed RECALL / EDIT (or moderation delete): a CONTROL event with its own seq.

    Spec 13.4.1: the event gets its own ``conversation_seq`` and ``last_activity_id`` (it must
    reach offline members through their mailboxes, whose visibility check needs a seq), and
    anchors on the target (``anchor_target``): it never becomes the conversation's latest
    message. ``target_*`` are copied from the target's MessageRecord at decision time, so every
    consumer applies the amend without a lookup (INV-17: decrements use only these).
    ``sender_id`` is the actor (the sender, or an OWNER/ADMIN). ``new_payload`` is an edit's new
    body. ``preview_or_placeholder`` is the target's preview after the amend, as the session
    list shows it: a :class:`PreviewPlaceholder` with ``state`` "recalled" / "deleted" (the
    target's type kept), or an edit's ``new_payload`` (MailboxNodes keep a payload prefix as a
    message's preview, ``qim.core.mailbox.sessions`` deviation 2). ``repairs_preview`` is true
    when the target is the message the ConversationHead shows as its preview (step 4: only then
    does the head's preview change, to the placeholder with the new ``state``).
    """

    tenant_id: str
    conversation_id: str
    conversation_kind: ConversationKind
    participants: tuple[str, ...] = ()
    message_id: U128
    conversation_seq: U64
    last_activity_id: U128
    sender_id: str
    origin_device_id: str = ""
    action: AmendAction
    target_message_id: U128
    target_conversation_seq: U64
    target_sender_id: str
    target_flags: U8 = 0
    target_mention_targets: tuple[str, ...] = ()
    target_reply_to_sender_id: str = ""
    new_payload: bytes = b""
    repairs_preview: bool = False
    preview_or_placeholder: bytes = b""
    membership_version: U64 = 0
    member_count: U32
    committed_at: U64
    retention_class: RetentionClass = "default"
    fencing_epoch: U64 = 0


ReactionAction: TypeAlias = Literal["add", "remove"]
REACTION_ACTIONS: Final[tuple[str, ...]] = ("add", "remove")


class MessageReacted(
    msgspec.Struct,
    kw_only=True,
    omit_defaults=True,
    frozen=True,
    forbid_unknown_fields=False,
    tag_field="kind",
    tag="reaction",
):
    """A committed REACT that changed the aggregate of one message (spec 13.6, 7.15).

    Delivery class ``ephemeral_aggregate`` (13.6.1): it takes no ``conversation_seq`` and no
    ``last_activity_id`` (it adds no timeline row and never reorders the session list), so the
    head does not move; only a REACT that changes something is appended (a repeated add or a
    remove of nothing is answered and leaves no record, 13.6.2). The record carries the
    **result**, not only the delta: ``counts`` is the message's full map after the change and
    ``summary_version`` its new version, so the MessageStore's ``MessageReactionSummary`` is a
    blind put of the record (replay rewrites identical bytes) and every consumer could push the
    absolute frame without a lookup. ``detail`` says whether the ``MessageReaction`` row of
    ``(user_id, reaction_key)`` is written (add) or deleted (remove): False once the message
    reached ``reaction_detail_max_per_message`` rows (7.15: only the aggregate grows);
    ``detail_rows`` is the message's row count after the change and ``detail_complete`` false
    once an add went without a row.
    ``self_reaction_keys`` are the reactor's keys on the message after the change (the reply's
    and the reactor's other devices' REACTION_UPDATE). ``target_message_id`` guards against a
    foreign log like an amend's. ``committed_at`` is the writer's log time (the detail row's
    ``created_at`` and the admission debit of ``per_user_reaction_rate``).
    """

    tenant_id: str
    conversation_id: str
    conversation_kind: ConversationKind
    participants: tuple[str, ...] = ()
    target_conversation_seq: U64
    target_message_id: U128
    user_id: str
    origin_device_id: str = ""
    reaction_key: str
    action: ReactionAction
    counts: dict[str, U32] = msgspec.field(default_factory=dict)
    summary_version: U64
    detail: bool = True
    detail_rows: U32 = 0
    detail_complete: bool = True
    self_reaction_keys: tuple[str, ...] = ()
    membership_version: U64 = 0
    member_count: U32
    committed_at: U64
    fencing_epoch: U64 = 0

    @property
    def conversation_seq(self) -> int:
        """0: a reaction occupies no seq (13.6.1), like an earlier create chunk."""
        return 0

    @property
    def message_id(self) -> bytes:
        """All zeros: a reaction is no message and has no id of its own (the target's is
        ``target_message_id``)."""
        return U128_ZERO

    @property
    def last_activity_id(self) -> bytes:
        """All zeros: a reaction never moves the session order (13.6.1)."""
        return U128_ZERO


OutboxRecord: TypeAlias = MessageCommitted | MembershipCommitted | MessageAmended | MessageReacted
"""Every kind of the outbox topic (tag field ``kind``: ``message``, ``membership``, ``amend``,
``reaction``)."""

_DECODER: msgspec.msgpack.Decoder[OutboxRecord] = msgspec.msgpack.Decoder(OutboxRecord)
_ENCODER = msgspec.msgpack.Encoder()


def encode_outbox_record(record: OutboxRecord) -> bytes:
    """The outbox value bytes; equal records encode to identical bytes."""
    return _ENCODER.encode(record)


def decode_outbox_record(data: bytes) -> OutboxRecord:
    """Decode an outbox value; raises ``msgspec.ValidationError`` if malformed."""
    return _DECODER.decode(data)
