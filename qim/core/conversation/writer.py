"""``ConversationWriterState``: the send path of one outbox partition as a pure state machine.

Two functions carry all of it, and the Faust shell calls exactly these, live and in recovery:

* :meth:`~ConversationWriterState.handle_send` decides, in the order of spec 8.1: membership
  (PERMISSION_DENIED) -> type and size (``custom_types.send_contract``: a server-only
  ``message_type``, an undeclared or ephemeral custom type, PERMISSION_DENIED; an oversize
  payload, PAYLOAD_TOO_LARGE; an ephemeral type leaves here as a :class:`Transient`, see
  below) -> admission L1/L2 (RATE_LIMITED) -> ClientDedup (the same SEND_ACK) -> the @all
  gate of an @all (``at_all``: role, per-conversation rate, daily quota; RATE_LIMITED) -> L3
  ``tenant_fanout_quota`` (FANOUT_QUOTA_EXCEEDED) -> allocation of message_id /
  conversation_seq / last_activity_id in one step (CLOCK_UNSAFE if the wall clock went back
  too far). It **never mutates**: the accepted outcome
  is a record plus the ack, and allocation takes effect only when that record is applied.
* An ``ephemeral`` custom type (13.3) is decided by membership, type and size only, then
  leaves as a :class:`Transient` (``qim.core.transient.ephemeral``): no admission (the
  L1/L2 budgets guard the commit log it never enters; the sender's ``per_user_msg_rate`` is
  the gateway's), no ClientDedup (a retry is delivered again under a new id), refused
  PERMISSION_DENIED above ``large_group_member_threshold`` members (13.2). Its transient
  ``message_id`` comes from the same HLC, so it sorts with and never equals a committed id;
  the HLC's high-water of transient ids is the one thing ``handle_send`` changes besides the
  retry hints, memory only (not in ``snapshot()``: a restarted writer's clock is past it).
* :meth:`~ConversationWriterState.handle_amend` decides RECALL / EDIT the same way (order in
  ``amend``): its record, :class:`~qim.schemas.records.outbox.MessageAmended`, takes a seq and
  admission tokens like a message, moves the head's preview only when it repairs it.
* :meth:`~ConversationWriterState.handle_react` decides REACT (order in
  ``qim.core.reactions.decide``): its record, :class:`~qim.schemas.records.outbox.MessageReacted`,
  takes no seq and no activity id (13.6.1), only a ``per_user_reaction_rate`` token.
* :meth:`~ConversationWriterState.apply` folds a committed outbox record into the state: the
  ConversationHead, the HLC (restored before any later assignment), the ClientDedup entry, the
  admission tokens and the per-conversation fencing maximum. Replay is ``apply`` over the outbox,
  so the live state equals the replayed state by construction, byte for byte in ``snapshot()``.

Why allocation happens in ``apply`` and not in ``handle_send``: a rejected request, a duplicate,
or an accepted one whose append never became durable must leave no trace (spec 8.2 I-1). Here that
is true of every decision, because a decision is only data; and an applied record is exactly a
record the shell appended. ``conversation_seq`` is ``head + 1`` of the committed head, strictly
increasing and never reused (spec 6.3: holes are legal, reuse is not), so there is no reservation
window to lose; the log is the durable reservation. The single writer per conversation is the
partition's owner (Kafka group assignment, direction.md 4.1); a former owner that is still
writing is a zombie whose records carry a lower ``fencing_epoch`` and are dropped by ``apply``
here and by every consumer (spec 19.2.1 check point 2).

Time: ``now_ms`` is the shell's wall clock in Unix ms, an argument, never read here. The HLC
(spec 6.2) turns it into ids; admission and dedup run on the HLC's time, i.e. log time.
"""

from __future__ import annotations

import dataclasses
import itertools

from qim.core.conversation.admission import (
    LONG_LAYERS,
    AdmissionBuckets,
    Charge,
    at_all_charges,
    charges_for,
    fanout_charges,
    reaction_charges,
)
from qim.core.conversation.allocation import Coordinates, allocate
from qim.core.conversation.amend import (
    Amended,
    AmendMembershipView,
    HistoryLookup,
    already_recalled,
    amend_ack,
    amend_error,
    amend_record,
    amend_refusal,
    amend_target,
)
from qim.core.conversation.at_all import (
    DETAIL_DAILY,
    DETAIL_RATE,
    DETAIL_ROLE,
    DailyQuota,
    mentions_all,
    role_refused,
)
from qim.core.conversation.config import WriterConfig, WriterLimits
from qim.core.conversation.custom_types import TypeRefusal, send_contract
from qim.core.conversation.decision import (
    Accepted,
    Decision,
    Duplicate,
    Rejected,
    Transient,
    ack_reply,
    error_reply,
)
from qim.core.conversation.dedup import ClientDedup, DedupEntry
from qim.core.conversation.head import (
    ApplyOutcome,
    ConversationHead,
    Sequenced,
    SequencedRecord,
    advance,
    classify,
)
from qim.core.conversation.membership import MembershipView, Target, resolve_target
from qim.core.conversation.policy import message_record
from qim.core.conversation.snapshot import decode_snapshot, encode_snapshot
from qim.core.fanout.write_policy import ALWAYS, MENTION_ONLY, TierState, decide
from qim.core.history.records import MessageRecord
from qim.core.reactions.decide import (
    ReactionLimits,
    ReactTarget,
    frame_refusal,
    reaction_record,
    target_refusal,
)
from qim.core.reactions.store import PointReader
from qim.core.transient.ephemeral import ephemeral_entry
from qim.schemas.frames.base import U128_ZERO
from qim.schemas.frames.connection import Error
from qim.schemas.frames.errors import RETRY_AFTER_NEVER_MS, ErrorCode
from qim.schemas.frames.reactions import ReactionUpdate
from qim.schemas.ids import (
    ClockUnsafeError,
    HlcClock,
    hlc_ms_to_unix_ms,
    message_id_to_bytes,
    split_message_id,
)
from qim.schemas.records.membership import MembershipCommitted
from qim.schemas.records.outbox import (
    DIRECT,
    GROUP,
    MessageAmended,
    MessageCommitted,
    MessageReacted,
    OutboxRecord,
    RetentionClass,
)
from qim.schemas.records.requests import (
    AmendRequest,
    ReactRequest,
    SendRequest,
    WriterReply,
    reply_for,
)

__all__ = ["ConversationWriterState", "Reacted", "WriterFencedError"]


class WriterFencedError(RuntimeError):
    """This incarnation's fencing epoch is below one already in the log: stop writing.

    A bug or ops condition of ours (a zombie owner), never the client's fault: the shell must
    give the partition up, not answer the request.
    """


class ConversationWriterState:
    """Heads, ClientDedup, HLC and admission cells of one outbox partition."""

    __slots__ = (
        "_at_all_days",
        "_buckets",
        "_dedup",
        "_fencing_epoch",
        "_heads",
        "_long",
        "_max_id",
        "_transient_max_id",
        "config",
        "region_id",
        "writer_id",
    )

    def __init__(
        self, config: WriterConfig, *, region_id: int, writer_id: int, fencing_epoch: int = 0
    ) -> None:
        HlcClock(region_id, writer_id)  # validates the id fields
        self.config = config
        self.region_id = region_id
        self.writer_id = writer_id
        self._fencing_epoch = fencing_epoch
        self._max_id = 0  # the highest id applied: the HLC's persisted state (spec 6.2)
        self._transient_max_id = 0  # the highest ephemeral message's id: memory only
        self._heads: dict[tuple[str, str], ConversationHead] = {}
        self._dedup = ClientDedup(config.client_dedup_ttl_seconds, config.client_dedup_max_entries)
        self._buckets = AdmissionBuckets()
        self._long = AdmissionBuckets()  # the @all and L3 cells (``admission.LONG_LAYERS``)
        self._at_all_days = DailyQuota()

    # -- read side ---------------------------------------------------------------------------

    @property
    def fencing_epoch(self) -> int:
        return self._fencing_epoch

    @property
    def last_hlc_ms(self) -> int:
        """The highest HLC ms of any applied id: what a restarted writer resumes from."""
        return split_message_id(self._max_id).hlc_ms

    @property
    def dedup(self) -> ClientDedup:
        return self._dedup

    def head(self, tenant_id: str, conversation_id: str) -> ConversationHead | None:
        return self._heads.get((tenant_id, conversation_id))

    def heads(self) -> list[ConversationHead]:
        return list(self._heads.values())

    def raise_fencing_epoch(self, epoch: int) -> None:
        """Adopt a newer epoch (a new partition generation); epochs never go back."""
        if epoch < self._fencing_epoch:
            raise ValueError(f"fencing epoch {epoch} < current {self._fencing_epoch}")
        self._fencing_epoch = epoch

    # -- decide ------------------------------------------------------------------------------

    def handle_send(
        self,
        request: SendRequest,
        now_ms: int,
        membership: MembershipView,
        *,
        retention_class: RetentionClass = "default",
    ) -> Decision:
        """Decide one SEND_MESSAGE without changing any state but the retry-hint map (see module
        docstring; :meth:`AdmissionBuckets.promise`)."""
        msg = request.message
        tenant, sender, conversation_id = request.tenant_id, request.sender_id, msg.conversation_id
        target = resolve_target(request, membership)
        if target is None:
            return Rejected(error_reply(request, ErrorCode.PERMISSION_DENIED), "not_a_member")
        limits = self.config.limits_for(tenant)
        head = self._heads.get((tenant, conversation_id))
        target = self._direct_e2ee(tenant, target, head)
        contract = send_contract(
            tenant,
            msg,
            self.config.custom_types,
            max_custom_payload_bytes=limits.max_custom_payload_bytes,
            latest_conversation_seq=0 if head is None else head.latest_conversation_seq,
        )
        if isinstance(contract, TypeRefusal):
            reply = error_reply(request, contract.code, detail=contract.detail)
            return Rejected(reply, contract.reason)
        self._check_not_fenced(head)
        if contract.ephemeral:
            return self._transient(request, target, head, now_ms, contract.schema_version)
        at_all = mentions_all(msg.mention_targets)
        charges = charges_for(
            limits, tenant, conversation_id, target.member_count, sender, at_all=at_all
        )
        log_now_ms = max(now_ms, hlc_ms_to_unix_ms(self.last_hlc_ms))
        retry_after_ms = self._buckets.promise(charges, log_now_ms)
        if retry_after_ms is not None:
            reply = error_reply(request, ErrorCode.RATE_LIMITED, retry_after_ms)
            return Rejected(reply, "rate_limited")
        hit = self._dedup.get(tenant, sender, msg.client_message_id)
        if hit is not None:
            return Duplicate(
                ack_reply(request, hit.message_id, hit.conversation_seq, hit.last_activity_id)
            )
        # A retry of a committed send passed the @all gate and L3 when it was committed (and
        # took their tokens): checked only for new sends, so a resent @all whose SEND_ACK was
        # lost gets its ack, not a refusal that would say it failed.
        if at_all:
            refusal = self._at_all_refusal(request, limits, target, log_now_ms)
            if refusal is not None:
                return refusal
        retry_after_ms = self._long.promise(
            fanout_charges(limits, tenant, target.member_count), log_now_ms
        )
        if retry_after_ms is not None:
            reply = error_reply(request, ErrorCode.FANOUT_QUOTA_EXCEEDED, retry_after_ms)
            return Rejected(reply, "fanout_quota_exceeded")
        try:
            coords = self._allocate(head, now_ms)
        except ClockUnsafeError as exc:
            wait_ms = max(1, exc.regression_ms - self.config.clock_regression_reject_ms)
            return Rejected(error_reply(request, ErrorCode.CLOCK_UNSAFE, wait_ms), "clock_unsafe")
        record = message_record(
            request,
            target,
            coords,
            retention_class=retention_class,
            fencing_epoch=self._fencing_epoch,
            config=self.config,
            contract=contract,
            write_policy=_write_policy(limits, target, head, coords.committed_at),
        )
        ack = ack_reply(
            request, coords.message_id, coords.conversation_seq, coords.last_activity_id
        )
        return Accepted(record, ack)

    def _transient(
        self,
        request: SendRequest,
        target: Target,
        head: ConversationHead | None,
        now_ms: int,
        schema_version: int,
    ) -> Rejected | Transient:
        """An ephemeral message: a transient id and its entry, nothing to append."""
        threshold = self.config.limits_for(request.tenant_id).large_group_member_threshold
        if target.member_count > threshold:
            detail = (
                f"ephemeral messages are not forwarded in conversations of more than "
                f"{threshold} members (large_group_member_threshold)"
            )
            reply = error_reply(request, ErrorCode.PERMISSION_DENIED, detail=detail)
            return Rejected(reply, "ephemeral_large_group")
        try:
            coords = self._allocate(head, now_ms, advance_seq=False)
        except ClockUnsafeError as exc:
            wait_ms = max(1, exc.regression_ms - self.config.clock_regression_reject_ms)
            return Rejected(error_reply(request, ErrorCode.CLOCK_UNSAFE, wait_ms), "clock_unsafe")
        self._transient_max_id = max(
            self._transient_max_id, int.from_bytes(coords.message_id, "big")
        )
        entry = ephemeral_entry(request, coords.message_id, coords.committed_at, schema_version)
        ack = ack_reply(request, coords.message_id, 0, U128_ZERO)
        return Transient(entry, ack, target)

    def _at_all_refusal(
        self, request: SendRequest, limits: WriterLimits, target: Target, log_now_ms: int
    ) -> Rejected | None:
        """The 11.4.2 gate of an @all, in the order of ``at_all``; every refusal RATE_LIMITED."""
        tenant, sender = request.tenant_id, request.sender_id
        if target.kind == GROUP and role_refused(
            target.member_count,
            target.sender_role,
            min_role=limits.at_all_min_role,
            large_group_member_threshold=limits.large_group_member_threshold,
        ):
            retry_after_ms: int | None = RETRY_AFTER_NEVER_MS
            detail = DETAIL_ROLE
        else:
            conversation_id = request.message.conversation_id
            detail = DETAIL_RATE
            retry_after_ms = self._long.promise(
                at_all_charges(limits, tenant, conversation_id), log_now_ms
            )
            if retry_after_ms is None:
                detail = DETAIL_DAILY
                retry_after_ms = self._at_all_days.check(
                    (tenant, sender), limits.at_all_daily_quota_per_sender, log_now_ms
                )
        if retry_after_ms is None:
            return None
        reply = error_reply(request, ErrorCode.RATE_LIMITED, retry_after_ms, detail)
        return Rejected(reply, detail)

    def handle_amend(
        self,
        request: AmendRequest,
        now_ms: int,
        membership: AmendMembershipView,
        lookup: HistoryLookup,
        *,
        participants: tuple[str, ...] | None = None,
        retention_class: RetentionClass = "default",
    ) -> Rejected | Duplicate | Amended:
        """Decide one RECALL / EDIT without changing any state (order: ``amend`` module).

        ``lookup`` reads the conversation's MessageRecords (every committed append must be
        visible: the shell cuts its batch first); ``participants`` are a direct conversation's.
        A repeated recall answers the first one's SEND_ACK (:class:`Duplicate`, nothing new).
        """
        tenant, conversation_id = request.tenant_id, request.conversation_id
        resolved = amend_target(request, membership, participants)
        if resolved is None:
            return Rejected(amend_error(request, ErrorCode.PERMISSION_DENIED), "not_a_member")
        target, is_admin = resolved
        original = lookup(request.target_conversation_seq)
        head = self._heads.get((tenant, conversation_id))
        target = self._direct_e2ee(tenant, target, head)
        self._check_not_fenced(head)
        limits = self.config.limits_for(tenant)
        log_now_ms = max(now_ms, hlc_ms_to_unix_ms(self.last_hlc_ms))
        refusal = amend_refusal(
            request, original, is_admin=is_admin, log_now_ms=log_now_ms, limits=limits
        )
        if refusal is not None:
            return Rejected(amend_error(request, refusal[0]), refusal[1])
        assert original is not None  # amend_refusal refuses a missing target
        if self._edit_over_type_cap(request, original.custom_type):
            return Rejected(amend_error(request, ErrorCode.PAYLOAD_TOO_LARGE), "payload_too_large")
        done = already_recalled(request, original)
        if done is not None:
            event = lookup(done)
            message_id = U128_ZERO if event is None else event.message_id
            activity = U128_ZERO if event is None else event.last_activity_id
            return Duplicate(amend_ack(request, message_id, done, activity))
        charges = charges_for(limits, tenant, conversation_id, target.member_count, request.user_id)
        retry_after_ms = self._buckets.promise(charges, log_now_ms)
        if retry_after_ms is not None:
            reply = amend_error(request, ErrorCode.RATE_LIMITED, retry_after_ms)
            return Rejected(reply, "rate_limited")
        try:
            coords = self._allocate(head, now_ms)
        except ClockUnsafeError as exc:
            wait_ms = max(1, exc.regression_ms - self.config.clock_regression_reject_ms)
            return Rejected(amend_error(request, ErrorCode.CLOCK_UNSAFE, wait_ms), "clock_unsafe")
        record = amend_record(
            request,
            target,
            original,
            coords,
            repairs_preview=head is not None and head.last_message_id == original.message_id,
            retention_class=retention_class,
            fencing_epoch=self._fencing_epoch,
        )
        ack = amend_ack(
            request, coords.message_id, coords.conversation_seq, coords.last_activity_id
        )
        return Amended(record, ack)

    def _direct_e2ee(self, tenant_id: str, target: Target, head: ConversationHead | None) -> Target:
        """A direct conversation's E2EE flag (spec 22.1): fixed by its first message, which
        takes the tenant's setting; a group's comes from its membership (creation flag)."""
        if target.kind != DIRECT:
            return target
        e2ee = head.e2ee if head is not None else tenant_id in self.config.e2ee_direct_tenants
        return dataclasses.replace(target, e2ee=e2ee)

    def _edit_over_type_cap(self, request: AmendRequest, custom_type: str | None) -> bool:
        """An edit of a custom message is bounded by its type's ``max_payload_bytes`` too
        (spec 13.3), while the type is declared; ``amend_refusal`` checked the tenant's cap."""
        if request.action != "edit" or not custom_type:
            return False
        declared = self.config.custom_types.lookup(request.tenant_id, custom_type)
        return declared is not None and len(request.new_payload) > declared.max_payload_bytes

    def handle_react(
        self,
        request: ReactRequest,
        now_ms: int,
        target: ReactTarget | None,
        original: MessageRecord | None,
        reader: PointReader,
        *,
        visible: tuple[int, int | None] | None = None,
    ) -> Rejected | Duplicate | Reacted:
        """Decide one REACT without changing any state (order: ``qim.core.reactions.decide``).

        ``target`` is the conversation if the requester belongs to it (None: not a member),
        ``original`` the MessageRecord at the seq, ``visible`` a group member's interval;
        ``reader`` the MessageStore under the open batch's reaction writes. A REACT that
        changes nothing is a :class:`Duplicate` carrying the current absolute aggregate.
        """
        refusal = frame_refusal(request)
        if refusal is not None:
            return Rejected(_react_error(request, refusal[0]), refusal[1])
        if target is None:
            return Rejected(_react_error(request, ErrorCode.PERMISSION_DENIED), "not_a_member")
        reason = target_refusal(original, visible)
        if reason is not None or original is None:
            return Rejected(_react_error(request, ErrorCode.PERMISSION_DENIED), reason or "")
        self._check_not_fenced(self._heads.get((request.tenant_id, request.conversation_id)))
        limits = self.config.limits_for(request.tenant_id)
        log_now_ms = max(now_ms, hlc_ms_to_unix_ms(self.last_hlc_ms))
        outcome = reaction_record(
            request,
            reader,
            target,
            original,
            limits=ReactionLimits(
                detail_max_members=limits.reaction_detail_max_members,
                detail_max_per_message=limits.reaction_detail_max_per_message,
                detail_page_limit=limits.reaction_detail_page_limit,
            ),
            committed_at=log_now_ms,
            fencing_epoch=self._fencing_epoch,
        )
        if isinstance(outcome, ReactionUpdate):  # a no-op succeeds, even at the rate cap
            return Duplicate(reply_for(request, reaction_update=outcome))
        charges = reaction_charges(limits, request.tenant_id, request.user_id)
        retry_after_ms = self._buckets.check(charges, log_now_ms)
        if retry_after_ms is not None:
            reply = _react_error(request, ErrorCode.RATE_LIMITED, retry_after_ms)
            return Rejected(reply, "rate_limited")
        update = ReactionUpdate(
            conversation_id=outcome.conversation_id,
            conversation_seq=outcome.target_conversation_seq,
            counts=dict(outcome.counts),
            summary_version=outcome.summary_version,
            self_reaction_keys=outcome.self_reaction_keys,
        )
        return Reacted(outcome, reply_for(request, reaction_update=update))

    def next_coordinates(
        self, tenant_id: str, conversation_id: str, now_ms: int, *, advance_seq: bool = True
    ) -> Coordinates:
        """Allocate for another record kind (membership CONTROL, seq-less activities; spec 6.4).

        Like ``handle_send`` this reserves nothing: the caller builds its record with these
        coordinates and this writer's ``fencing_epoch`` and applies it. Raises
        ``ClockUnsafeError`` and ``WriterFencedError``.
        """
        head = self._heads.get((tenant_id, conversation_id))
        self._check_not_fenced(head)
        return self._allocate(head, now_ms, advance_seq=advance_seq)

    def _allocate(
        self, head: ConversationHead | None, now_ms: int, *, advance_seq: bool = True
    ) -> Coordinates:
        return allocate(
            max(self._max_id, self._transient_max_id),
            0 if head is None else head.latest_conversation_seq,
            now_ms,
            region_id=self.region_id,
            writer_id=self.writer_id,
            clock_regression_reject_ms=self.config.clock_regression_reject_ms,
            advance_seq=advance_seq,
        )

    def _check_not_fenced(self, head: ConversationHead | None) -> None:
        if head is not None and head.fencing_epoch > self._fencing_epoch:
            raise WriterFencedError(
                f"{head.conversation_id}: epoch {head.fencing_epoch} > ours {self._fencing_epoch}"
            )

    # -- apply -------------------------------------------------------------------------------

    def apply(self, record: OutboxRecord | SequencedRecord) -> ApplyOutcome:
        """Fold one committed outbox record in; idempotent, the only way state changes.

        Every outbox record of the partition goes through here in log order, whatever its kind:
        a membership CONTROL message occupies a seq the next message must not reuse.
        """
        if isinstance(record, MessageReacted):
            return self._apply_reaction(record)
        if isinstance(record, MembershipCommitted):
            sequenced = Sequenced.of_membership(record)
            if sequenced is None:
                return ApplyOutcome.UNSEQUENCED
            return self._apply(sequenced)
        return self._apply(record)

    def _apply(self, record: SequencedRecord) -> ApplyOutcome:
        key = (record.tenant_id, record.conversation_id)
        head = self._heads.get(key)
        outcome = classify(head, record)
        if outcome is not ApplyOutcome.APPLIED:
            return outcome
        self._max_id = max(
            self._max_id,
            int.from_bytes(record.message_id, "big"),
            int.from_bytes(record.last_activity_id, "big"),
        )
        self._heads[key] = advance(head, record)
        if isinstance(record, MessageCommitted):
            self._debit(record)
            self._dedup.record(
                (record.tenant_id, record.sender_id, record.client_message_id),
                _dedup_entry(record),
            )
        elif isinstance(record, MessageAmended):  # admitted like a send (``amend``), no dedup
            self._debit(record)
            self._dedup.expire(record.committed_at)
        else:
            self._buckets.evict(record.committed_at)
            self._long.evict(record.committed_at)
            self._at_all_days.evict(record.committed_at)
            self._dedup.expire(record.committed_at)
        return outcome

    def _apply_reaction(self, record: MessageReacted) -> ApplyOutcome:
        """A reaction moves no head (13.6.1): the zombie filter, then its rate token."""
        head = self._heads.get((record.tenant_id, record.conversation_id))
        if head is not None and record.fencing_epoch < head.fencing_epoch:
            return ApplyOutcome.STALE_EPOCH
        limits = self.config.limits_for(record.tenant_id)
        charges = reaction_charges(limits, record.tenant_id, record.user_id)
        self._buckets.debit(charges, record.committed_at)
        return ApplyOutcome.UNSEQUENCED

    def _debit(self, record: MessageCommitted | MessageAmended) -> None:
        """Take what ``handle_send`` / ``handle_amend`` checked, at the record's time. An amend
        is no @all and costs no fanout quota (its entries replace existing ones, 13.4)."""
        limits = self.config.limits_for(record.tenant_id)
        tenant, at = record.tenant_id, record.committed_at
        at_all = isinstance(record, MessageCommitted) and mentions_all(record.mention_targets)
        charges = charges_for(
            limits,
            tenant,
            record.conversation_id,
            record.member_count,
            record.sender_id,
            at_all=at_all,
        )
        self._buckets.debit(charges, at)
        long: tuple[Charge, ...] = ()
        if isinstance(record, MessageCommitted):
            long = fanout_charges(limits, tenant, record.member_count)
        if at_all:
            long = (*at_all_charges(limits, tenant, record.conversation_id), *long)
            self._at_all_days.debit((tenant, record.sender_id), at)
        self._long.debit(long, at)

    # -- checkpoint --------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """Deterministic checkpoint bytes of everything ``apply`` built."""
        return encode_snapshot(
            message_id_to_bytes(self._max_id),
            self._heads.values(),
            self._dedup.items(),
            itertools.chain(self._buckets.items(), self._long.items()),
            self._at_all_days.items(),
        )

    @classmethod
    def restore(
        cls,
        snapshot: bytes,
        config: WriterConfig,
        *,
        region_id: int,
        writer_id: int,
        fencing_epoch: int = 0,
    ) -> ConversationWriterState:
        """A state equal to the one that produced ``snapshot``, under a (new) incarnation."""
        data = decode_snapshot(snapshot)
        state = cls(config, region_id=region_id, writer_id=writer_id, fencing_epoch=fencing_epoch)
        state._max_id = int.from_bytes(data.last_id, "big")
        state._heads = {head.key: head for head in data.heads}
        state._dedup.load(row.split() for row in data.dedup)
        rows = [row.split() for row in data.buckets]
        state._buckets.load(row for row in rows if row[0][0] not in LONG_LAYERS)
        state._long.load(row for row in rows if row[0][0] in LONG_LAYERS)
        state._at_all_days.load(row.split() for row in data.at_all_days)
        return state


class Reacted:
    """An accepted REACT that changes the aggregate: append ``record``, then ``reply``."""

    __slots__ = ("record", "reply")

    def __init__(self, record: MessageReacted, reply: WriterReply) -> None:
        self.record = record
        self.reply = reply


def _react_error(
    request: ReactRequest, code: ErrorCode, retry_after_ms: int | None = None
) -> WriterReply:
    error = Error(code=int(code), retry_after_ms=retry_after_ms, request_id=request.request_id)
    return reply_for(request, error=error)


def _write_policy(
    limits: WriterLimits, target: Target, head: ConversationHead | None, committed_at: int
) -> str:
    """The message's ``mailbox_write_policy`` (spec 10.2.3, topology.md decision 46).

    Decided at the commit's log time from the head's policy and switch instant, so a replay of
    the outbox rebuilds the same head. The active count is 0: no per-conversation measure of
    |active| reaches the writer yet (``conversation_active_member_ratio`` is pending), so the
    admission test reduces to ``N > read_diffusion_min_saving`` until one does.
    """
    if target.kind != GROUP:
        return ALWAYS
    state = TierState()
    if head is not None and head.write_policy == MENTION_ONLY:
        state = TierState(MENTION_ONLY, head.policy_switched_at)
    elif head is not None:
        state = TierState(ALWAYS, head.policy_switched_at)
    return decide(limits.write_tier, state, target.member_count, 0, committed_at).policy


def _dedup_entry(record: MessageCommitted) -> DedupEntry:
    return DedupEntry(
        record.conversation_id,
        record.message_id,
        record.conversation_seq,
        record.last_activity_id,
        record.committed_at,
    )
