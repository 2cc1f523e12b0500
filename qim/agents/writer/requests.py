"""Conversation requests -> core calls -> a :class:`~qim.agents.writer.partition.Plan`.

One branch per request kind, each a few lines around one core call; the rules live in the
cores (``qim.core.conversation``, ``qim.core.membership``, ``qim.core.history``; membership
requests in ``writer_membership``). What the shell adds here is only plumbing:

* the target of a RECALL / EDIT read from the MessageStore, and a one-to-one conversation's
  participants from there too (the frames name no peer);
* the visible interval of a PULL_HISTORY requester: GroupMembership's ``(joined_at, left_at)``
  for a group; for a one-to-one conversation the participants the MessageStore remembered from
  its MessageCommitted records (full interval). Before its first message nobody can be shown
  to be a participant (the id is a one-way hash and PULL_HISTORY names no peer), so the answer
  is PERMISSION_DENIED, the same as for a stranger or a user of another tenant;
* turning a refusal (``ProtocolError`` with a code) into an ERROR reply (``writer_replies``).
  A request on the wrong partition would break the single writer of its conversation: it is
  answered ``SHARD_MOVED`` and never applied.

Nothing here performs I/O except MessageStore reads; appends go into the plan.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Final

import msgspec

from qim.agents.keyring import BodyKeys
from qim.agents.writer.membership import admin, create, leave
from qim.agents.writer.partition import PartitionWriter, Plan
from qim.agents.writer.replies import refuse, reply_to
from qim.agents.writer.sealing import conversation_e2ee, opened_history, sealed_record
from qim.core.conversation import (
    Accepted,
    Amended,
    Reacted,
    Rejected,
    Transient,
    WriterConfig,
    conversation_kind,
)
from qim.core.conversation.at_all import DETAIL_DAILY, DETAIL_RATE, DETAIL_ROLE
from qim.core.conversation.ids import is_direct_participant
from qim.core.conversation.quota import QUOTA_EXHAUSTED, UserKey, joining_users, quota_refused
from qim.core.history import (
    FULL_INTERVAL,
    HistoryLimits,
    MessageRecord,
    VisibleInterval,
    bounds_from_store,
    decode_message_record,
    message_key,
    pull_history,
)
from qim.core.membership import (
    DEFAULT_E2EE_MAX_MEMBERS,
    MemberPageLimits,
    MembershipRejected,
    create_reply,
    pull_members,
)
from qim.core.reactions.decide import ReactTarget, target_refusal
from qim.core.reactions.store import joined_reactions, reaction_page
from qim.core.transient import (
    TypingGate,
    TypingRules,
    TypingVerdict,
    by_connection_shard,
    decide_typing,
    ephemeral_relays,
)
from qim.schemas import connection_shard_id, user_bucket
from qim.schemas.frames.errors import ErrorCode
from qim.schemas.frames.exceptions import ProtocolError
from qim.schemas.frames.history import HistoryBatch
from qim.schemas.frames.reactions import ReactionList
from qim.schemas.frames.rtc import RtcSignalDown
from qim.schemas.ids import ClockUnsafeError
from qim.schemas.records import (
    DIRECT,
    GROUP,
    AdminGroupRequest,
    AmendRequest,
    ConversationRequest,
    CreateGroupRequest,
    LeaveGroupRequest,
    OutboxRecord,
    PullHistoryRequest,
    PullMembersRequest,
    PullReactionsRequest,
    ReactRequest,
    RtcSignalRequest,
    SendRequest,
    TypingRequest,
    conversation_partition,
)
from qim.schemas.records.outbox import MessageCommitted
from qim.schemas.records.transient import RtcRelay, TypingRelay
from qim.tables.message_store import MessageStore

__all__ = ["RequestContext", "connection_shards", "conversation_of_request", "handle_request"]


def connection_shards(virtual_bucket_count: int, shard_count: int) -> Callable[[str, str], int]:
    """(tenant, user) -> the user's ConnectionShard (5.2), the gateways' ``shard_of``."""

    def shard_of(tenant_id: str, user_id: str) -> int:
        bucket = user_bucket(tenant_id, user_id, virtual_bucket_count)
        return connection_shard_id(bucket, shard_count)

    return shard_of


@dataclass(frozen=True, slots=True)
class RequestContext:
    """The configuration the handlers read; one per worker."""

    config: WriterConfig
    partition_count: int
    max_members: int
    e2ee_max_members: int = DEFAULT_E2EE_MAX_MEMBERS
    """B.6.1: the largest E2EE group (spec 22.1)."""
    member_limits: MemberPageLimits = field(default_factory=MemberPageLimits)
    history_limits: HistoryLimits = field(
        default_factory=lambda: HistoryLimits(max_bytes_cap=512 * 1024)
    )
    """512 KiB: a HISTORY_BATCH reply must fit one Kafka record (1 MiB by default)."""
    exhausted: Collection[UserKey] = frozenset()
    """The users at ``max_conversations_per_user`` (``UserQuotaFollower``: a live set)."""
    on_quota_refused: Callable[[str], None] = lambda _tenant_id: None
    """Called with the tenant of each request refused at the cap (20.4.1 rule 3's counter)."""
    typing: TypingRules = field(default_factory=TypingRules)
    typing_gate: TypingGate = field(default_factory=lambda: TypingGate(2000))
    """The merge window's memory (13.2): transient, never in a checkpoint."""
    connection_shard_of: Callable[[str, str], int] = lambda _tenant, _user: 0
    """(tenant, user) -> ConnectionShard, where a TYPING for that user goes."""
    on_typing: Callable[[str], None] = lambda _verdict: None
    """Called with each TYPING's verdict (``TypingVerdict.value``), for the metrics."""
    on_send_limited: Callable[[str, str], None] = lambda _tenant_id, _dimension: None
    """Called with (tenant, parameter) of each send refused by the @all gate or the L3
    ``tenant_fanout_quota`` (:data:`SEND_LIMIT_DIMENSIONS`), for the metrics."""
    keys: BodyKeys | None = None
    """The encrypt / decrypt point's keys (``writer_sealing``): records are sealed before the
    append, HISTORY_BATCH bodies opened before the reply. None: bodies stay as sent (unit
    tests of the handlers)."""
    ensure_keys: Callable[[set[tuple[str, str]]], Awaitable[None]] | None = None
    """Makes each (tenant, conversation)'s ConversationDEK durable before a batch that will
    seal with it is decided (``KeyTopicFollower.ensure_conversation_keys``)."""

    on_policy_switch: Callable[[str, str, str], None] = lambda _t, _c, _p: None
    """Called with (tenant, conversation, new policy) when an appended message switches its
    conversation's ``mailbox_write_policy`` (10.2.3), for the metrics."""


def conversations_to_seal(
    pw: PartitionWriter, ctx: RequestContext, requests: Iterable[object]
) -> set[tuple[str, str]]:
    """The non-E2EE conversations of ``requests`` that will seal a body (sends, edits)."""
    wanted: set[tuple[str, str]] = set()
    for request in requests:
        if isinstance(request, SendRequest) and request.message.payload:
            tc = (request.tenant_id, request.message.conversation_id)
        elif isinstance(request, AmendRequest) and request.action == "edit":
            tc = (request.tenant_id, request.conversation_id)
        else:
            continue
        if not conversation_e2ee(pw, ctx.config.e2ee_direct_tenants, *tc):
            wanted.add(tc)
    return wanted


SEND_LIMIT_DIMENSIONS: Final = {
    "fanout_quota_exceeded": "tenant_fanout_quota",
    DETAIL_ROLE: DETAIL_ROLE,
    DETAIL_RATE: DETAIL_RATE,
    DETAIL_DAILY: DETAIL_DAILY,
}
"""``Rejected.reason`` of a send -> the parameter that refused it."""


def conversation_of_request(request: ConversationRequest) -> tuple[str, str]:
    """``(tenant_id, conversation_id)`` the request is about (its partitioning key)."""
    match request:
        case SendRequest():
            return request.tenant_id, request.message.conversation_id
        case PullHistoryRequest() | PullMembersRequest() | RtcSignalRequest():
            return request.tenant_id, request.message.conversation_id
        case AmendRequest() | ReactRequest() | PullReactionsRequest() | TypingRequest():
            return request.tenant_id, request.conversation_id
        case CreateGroupRequest() | LeaveGroupRequest():
            return request.tenant_id, request.message.group_id
        case AdminGroupRequest():
            return request.tenant_id, request.group_id


def handle_request(
    pw: PartitionWriter, ctx: RequestContext, request: ConversationRequest, now_ms: int, plan: Plan
) -> None:
    """Decide one request: append records (applied at once) and replies to ``plan``.

    ``WriterFencedError`` propagates: the partition must be given up, not the request answered.
    """
    tenant_id, conversation_id = conversation_of_request(request)
    try:
        try:
            owner = conversation_partition(tenant_id, conversation_id, ctx.partition_count)
        except (TypeError, ValueError):
            raise MembershipRejected("invalid_conversation_id") from None
        if owner != pw.partition:
            raise ProtocolError("misrouted", code=ErrorCode.SHARD_MOVED)
        _check_quota(pw, ctx, request, tenant_id, conversation_id)
        _dispatch(pw, ctx, request, now_ms, plan)
    except ProtocolError as exc:
        refuse(request, exc, plan)
    except ClockUnsafeError as exc:
        wait = max(1, exc.regression_ms - ctx.config.clock_regression_reject_ms)
        refuse(request, ProtocolError("clock_unsafe", code=ErrorCode.CLOCK_UNSAFE), plan, wait)


def _check_quota(
    pw: PartitionWriter,
    ctx: RequestContext,
    request: ConversationRequest,
    tenant_id: str,
    conversation_id: str,
) -> None:
    """Refuse, before anything is appended, a request that makes a user at the cap join."""
    if not ctx.exhausted:
        return
    m = pw.membership
    if conversation_kind(conversation_id) == DIRECT:
        exists = pw.state.head(tenant_id, conversation_id) is not None
    else:
        exists = m.group(tenant_id, conversation_id) is not None or m.has_pending_create(
            tenant_id, conversation_id
        )
    joining = joining_users(
        request, exists=exists, is_member=lambda u: m.is_member(tenant_id, conversation_id, u)
    )
    if quota_refused(tenant_id, joining, ctx.exhausted):
        ctx.on_quota_refused(tenant_id)
        raise MembershipRejected(QUOTA_EXHAUSTED)


def _note_policy_switch(pw: PartitionWriter, ctx: RequestContext, record: MessageCommitted) -> None:
    head = pw.state.head(record.tenant_id, record.conversation_id)
    before = "always" if head is None else head.write_policy
    if record.write_policy != before:
        ctx.on_policy_switch(record.tenant_id, record.conversation_id, record.write_policy)


def _dispatch(
    pw: PartitionWriter, ctx: RequestContext, request: ConversationRequest, now_ms: int, plan: Plan
) -> None:
    match request:
        case SendRequest():
            decision = pw.state.handle_send(request, now_ms, pw.membership)
            if isinstance(decision, Accepted):
                _note_policy_switch(pw, ctx, decision.record)
                sent: OutboxRecord = decision.record
                if ctx.keys is not None:
                    sent = sealed_record(ctx.keys, sent, e2ee=decision.record.e2ee)
                pw.append(sent, plan)
            elif isinstance(decision, Rejected) and decision.reason in SEND_LIMIT_DIMENSIONS:
                ctx.on_send_limited(request.tenant_id, SEND_LIMIT_DIMENSIONS[decision.reason])
            plan.replies.append(decision.reply)
            if isinstance(decision, Transient):
                _ephemeral(pw, ctx, request, decision, plan)
        case AmendRequest():
            _amend(pw, ctx, request, now_ms, plan)
        case ReactRequest():
            _react(pw, request, now_ms, plan)
        case PullReactionsRequest():
            plan.replies.append(reply_to(request, reaction_list=_reactions(pw, ctx, request)))
        case PullHistoryRequest():
            plan.replies.append(reply_to(request, history=_history(pw, ctx, request)))
        case PullMembersRequest():
            page = pull_members(
                pw.membership,
                tenant_id=request.tenant_id,
                requester=request.user_id,
                request=request.message,
                limits=ctx.member_limits,
            )
            plan.replies.append(reply_to(request, members=page))
        case CreateGroupRequest():
            group_id = request.message.group_id
            create(
                pw,
                tenant_id=request.tenant_id,
                group_id=group_id,
                creator=request.user_id,
                invitees=request.message.member_ids,
                max_members=ctx.max_members,
                now_ms=now_ms,
                plan=plan,
                e2ee=request.message.e2ee,
                e2ee_max_members=ctx.e2ee_max_members,
            )
            page = create_reply(
                pw.membership,
                tenant_id=request.tenant_id,
                group_id=group_id,
                creator=request.user_id,
                limits=ctx.member_limits,
            )
            plan.replies.append(reply_to(request, members=page))
        case LeaveGroupRequest():
            plan.replies.append(reply_to(request, members=leave(pw, request, now_ms, plan)))
        case AdminGroupRequest():
            admin(
                pw,
                request,
                max_members=ctx.max_members,
                now_ms=now_ms,
                plan=plan,
                e2ee_max_members=ctx.e2ee_max_members,
            )
        case TypingRequest():
            _typing(pw, ctx, request, now_ms, plan)
        case RtcSignalRequest():
            _rtc_signal(pw, ctx, request, plan)


def _ephemeral(
    pw: PartitionWriter, ctx: RequestContext, request: SendRequest, decision: Transient, plan: Plan
) -> None:
    """An ephemeral custom message (13.3 -> 13.2): the core checked membership, type, size and
    the group size; one relay per ConnectionShard of the members (the sender too, for the
    other devices). Appends nothing: no outbox record, no seq, no checkpoint entry."""
    tenant_id = request.tenant_id
    conversation_id = request.message.conversation_id
    members: Iterable[str]
    if decision.target.kind == GROUP:
        group = pw.membership.group(tenant_id, conversation_id)
        rows = {} if group is None else group.rows
        members = (r.user_id for r in rows.values() if r.active)
    else:
        members = decision.target.participants
    plan.transient.extend(
        ephemeral_relays(
            request,
            decision.entry,
            members,
            lambda user: ctx.connection_shard_of(tenant_id, user),
        )
    )


def _rtc_signal(
    pw: PartitionWriter, ctx: RequestContext, request: RtcSignalRequest, plan: Plan
) -> None:
    """RTC_SIGNAL (13.5.1): sender and target must both be members of the conversation (a
    one-to-one conversation: its id is theirs, recomputed, so no message is needed first);
    then one relay to the target's ConnectionShard. Appends nothing."""
    tenant_id, signal = request.tenant_id, request.message
    sender, target = request.user_id, signal.target_user_id
    conversation_id = signal.conversation_id
    if conversation_kind(conversation_id) == GROUP:
        m = pw.membership
        allowed = m.is_member(tenant_id, conversation_id, sender) and m.is_member(
            tenant_id, conversation_id, target
        )
    else:
        allowed = sender != target and is_direct_participant(
            tenant_id, conversation_id, sender, target
        )
    if not allowed:
        raise MembershipRejected("not_a_member")
    plan.transient.append(
        RtcRelay(
            tenant_id=tenant_id,
            target_user_id=target,
            connection_shard=ctx.connection_shard_of(tenant_id, target),
            signal=RtcSignalDown(
                conversation_id=conversation_id,
                from_user_id=sender,
                from_device_id=request.device_id,
                call_id=signal.call_id,
                signal_type=signal.signal_type,
                reason=signal.reason,
                signal_payload=signal.signal_payload,
            ),
        )
    )


def _typing(
    pw: PartitionWriter, ctx: RequestContext, request: TypingRequest, now_ms: int, plan: Plan
) -> None:
    """TYPING (13.2): the core decides on the current members; one relay per shard of theirs.
    Appends nothing: only ``plan.transient`` (to-gateway) and, for a non-member, a refusal."""
    tenant_id, conversation_id = request.tenant_id, request.conversation_id
    user_id = request.user_id
    members: Callable[[], Iterable[str]] | None = None
    count = 0
    if conversation_kind(conversation_id) == GROUP:
        group = pw.membership.group(tenant_id, conversation_id)
        if group is not None and group.is_member(user_id):
            rows = group.rows
            members = lambda: (r.user_id for r in rows.values() if r.active)  # noqa: E731
            count = group.member_count
    else:
        participants = pw.store.participants(tenant_id, conversation_id) or ()
        if user_id in participants:
            members = lambda: participants  # noqa: E731
            count = len(participants)
    decision = decide_typing(
        (tenant_id, conversation_id, user_id),
        members=members,
        member_count=count,
        gate=ctx.typing_gate,
        rules=ctx.typing,
        now_ms=now_ms,
    )
    ctx.on_typing(decision.verdict.value)
    if decision.verdict is TypingVerdict.NOT_A_MEMBER:
        raise MembershipRejected("not_a_member")
    if decision.verdict is not TypingVerdict.FORWARD:
        return
    shards = by_connection_shard(
        decision.recipients, lambda user: ctx.connection_shard_of(tenant_id, user)
    )
    for shard, users in shards.items():
        plan.transient.append(
            TypingRelay(
                tenant_id=tenant_id,
                conversation_id=conversation_id,
                user_id=user_id,
                expires_in_ms=decision.expires_in_ms,
                connection_shard=shard,
                recipients=users,
            )
        )


def _amend(
    pw: PartitionWriter, ctx: RequestContext, request: AmendRequest, now_ms: int, plan: Plan
) -> None:
    """RECALL / EDIT: the core decides on the MessageStore's rows (committed: the batch was cut
    before this request if the conversation had an append in it, ``writer_txn``)."""
    tenant_id, conversation_id = request.tenant_id, request.conversation_id

    def lookup(seq: int) -> MessageRecord | None:
        raw = pw.store.get(message_key(tenant_id, conversation_id, seq))
        return None if raw is None else decode_message_record(raw)

    participants = None
    if conversation_kind(conversation_id) == DIRECT:
        participants = pw.store.participants(tenant_id, conversation_id)
    decision = pw.state.handle_amend(
        request, now_ms, pw.membership, lookup, participants=participants
    )
    if isinstance(decision, Amended):
        record: OutboxRecord = decision.record
        if ctx.keys is not None:
            e2ee = conversation_e2ee(pw, ctx.config.e2ee_direct_tenants, tenant_id, conversation_id)
            record = sealed_record(ctx.keys, record, e2ee=e2ee)
        pw.append(record, plan)
    plan.replies.append(decision.reply)


class _Overlay:
    """The MessageStore under the open plan's own reaction writes (a REACT decides on top of
    the batch's earlier REACTs without cutting the batch)."""

    __slots__ = ("_store", "_writes")

    def __init__(self, store: MessageStore, writes: dict[bytes, bytes | None]) -> None:
        self._store = store
        self._writes = writes

    def get(self, key: bytes) -> bytes | None:
        if key in self._writes:
            return self._writes[key]
        return self._store.get(key)


def _react_target(
    pw: PartitionWriter, tenant_id: str, conversation_id: str, user_id: str
) -> tuple[ReactTarget | None, tuple[int, int | None] | None]:
    """The conversation if ``user_id`` may react in it now (an ACTIVE group member, or a
    participant of the one-to-one conversation), with a group member's visible interval."""
    kind = conversation_kind(conversation_id)
    if kind == GROUP:
        seen = pw.membership.visible_interval(tenant_id, conversation_id, user_id)
        if seen is None or not pw.membership.is_member(tenant_id, conversation_id, user_id):
            return None, None
        target = ReactTarget(
            kind=GROUP,
            participants=(),
            member_count=pw.membership.member_count(tenant_id, conversation_id),
            membership_version=pw.membership.version(tenant_id, conversation_id),
        )
        return target, seen
    if kind == DIRECT:
        participants = pw.store.participants(tenant_id, conversation_id) or ()
        if user_id not in participants:
            return None, None
        return ReactTarget(DIRECT, participants, len(participants), 0), None
    return None, None


def _react(pw: PartitionWriter, request: ReactRequest, now_ms: int, plan: Plan) -> None:
    """REACT (13.6.2): the core decides on the store's target row (committed: a REACT of a
    conversation with a sequenced append in the open batch cut it, ``writer_txn``) and on the
    reaction rows under this batch's own reaction writes."""
    t, c = request.tenant_id, request.conversation_id
    target, visible = _react_target(pw, t, c, request.user_id)
    raw = pw.store.get(message_key(t, c, request.conversation_seq)) if target else None
    original = None if raw is None else decode_message_record(raw)
    reader = _Overlay(pw.store, plan.reaction_writes)
    decision = pw.state.handle_react(request, now_ms, target, original, reader, visible=visible)
    if isinstance(decision, Reacted):
        pw.append(decision.record, plan)
    plan.replies.append(decision.reply)


def _reactions(
    pw: PartitionWriter, ctx: RequestContext, request: PullReactionsRequest
) -> ReactionList:
    """PULL_REACTIONS (13.6.2): a member's page of who reacted; ``total`` only above
    ``reaction_detail_max_members`` members (13.6.3 item 3). ``limit`` 0 = the page limit,
    clamped to it; a recalled or invisible target reads like a stranger's request."""
    t, c = request.tenant_id, request.conversation_id
    target, visible = _react_target(pw, t, c, request.user_id)
    if target is None:
        raise MembershipRejected("not_a_member")
    raw = pw.store.get(message_key(t, c, request.conversation_seq))
    original = None if raw is None else decode_message_record(raw)
    reason = target_refusal(original, visible)
    if reason is not None:
        raise ProtocolError(reason, code=ErrorCode.PERMISSION_DENIED)
    limits = ctx.config.limits_for(t)
    page_limit = limits.reaction_detail_page_limit
    limit = page_limit if request.limit == 0 else min(request.limit, page_limit)
    return reaction_page(
        pw.store,
        t,
        c,
        request.conversation_seq,
        request.reaction_key,
        offset=request.offset,
        limit=limit,
        detail_served=target.member_count <= limits.reaction_detail_max_members,
    )


def _history(pw: PartitionWriter, ctx: RequestContext, request: PullHistoryRequest) -> HistoryBatch:
    tenant_id, user_id = request.tenant_id, request.user_id
    conversation_id = request.message.conversation_id
    kind = conversation_kind(conversation_id)
    if kind == GROUP:
        seen = pw.membership.visible_interval(tenant_id, conversation_id, user_id)
        if seen is None:
            raise MembershipRejected("not_a_member")
        interval = VisibleInterval(*seen)
    elif kind == DIRECT:
        participants = pw.store.participants(tenant_id, conversation_id) or ()
        if user_id not in participants:
            raise MembershipRejected("not_a_member")
        interval = FULL_INTERVAL
    else:
        raise MembershipRejected("not_a_member")
    batch = pull_history(
        pw.store,
        tenant_id=tenant_id,
        request=request.message,
        interval=interval,
        bounds=bounds_from_store(pw.store, tenant_id, conversation_id),
        limits=ctx.history_limits,
    )
    if ctx.keys is not None:
        batch = opened_history(ctx.keys, tenant_id, conversation_id, batch)
    return _join_reactions(pw.store, tenant_id, conversation_id, user_id, batch)


def _join_reactions(
    store: MessageStore, tenant_id: str, conversation_id: str, viewer: str, batch: HistoryBatch
) -> HistoryBatch:
    """18.3.1 / 13.6.4: the page's reaction aggregates from one range scan over its seqs, with
    the viewer's own keys, on each message that has any."""
    if not batch.messages:
        return batch
    seqs = [m.conversation_seq for m in batch.messages]
    joined = joined_reactions(store, tenant_id, conversation_id, min(seqs), max(seqs), viewer)
    if not joined:
        return batch
    messages = tuple(
        msgspec.structs.replace(m, reactions=joined[m.conversation_seq])
        if m.conversation_seq in joined
        else m
        for m in batch.messages
    )
    return msgspec.structs.replace(batch, messages=messages)
