"""ConversationRouter: business frames to the ConversationWriter, its replies back (§5.3, §8).

The node's ``frame_handler``. A frame from an ONLINE session becomes an envelope
(:mod:`~qim.gateway.routing.rules`, identity from the session) that :class:`RequestForwarder`
produces to ``qim.conversation-requests`` at the conversation's partition; the writer's
:class:`WriterReply` comes back on ``qim.to-gateway`` at this node's ConnectionShard, read from
:meth:`ShardOwnership.records` with ``isolation_level=read_committed`` (the writer replies inside
its Kafka transaction, so SEND_ACK is only ever seen once the message is durable and a fenced
writer's acknowledgements never surface; direction.md §4.6), and is written to the connection
whose ``session_epoch`` matches (:mod:`~qim.gateway.routing.replies`).

A request that cannot be produced is answered at once with ``ERROR{RATE_LIMITED,
retry_after_ms}`` (decision, topology.md): A.6 #7 REGION_FAILOVER says the conversation's Home
Region is switching, which a full queue on this node or a broker that is restarting is not;
what the spec prescribes for an unavailable log partition is "senders get RATE_LIMITED or
queue" (26.8), and RATE_LIMITED's client action (back off per ``retry_after_ms``, then resend
with the same client_message_id, 20.4.1) is what this needs. The hint is truthful: with the
queue full it is the time the queue takes to reach Kafka at its measured rate
(``RequestForwarder.drain_ms``); when Kafka took nothing in the last second, or a produce
failed, no rate can be measured and it is ``region_failover_retry_after_ms`` (B.5.3, the
spec's value for a writer that is temporarily unreachable), ±30 % jitter either way. The
``detail`` names the cause, ``qim_gateway_requests_failed_total{reason}`` counts it
(``queue_full`` / ``kafka``) so an outage or an overloaded node is told apart from user
pressure, which ``send_reject_total{RATE_LIMITED}`` (24.1.2, alert above 1 % of sends) now
also carries -- an outage should page too. Most broker blips never reach the client: the
forwarder queues while Kafka is away, and a producer a restart left unusable is replaced and
its records sent again (``forwarder``).

``per_user_history_pull_rate`` (20.4.1, B.5) is kept here, before the request is produced: a
user's devices all reach this node (the owner of the user's ConnectionShard), so one bucket
per ``(tenant, user)`` is exact. Over it PULL_HISTORY is answered ``ERROR{RATE_LIMITED,
retry_after_ms}`` at once, the hint being the token the bucket promised to that refusal
(:mod:`qim.core.ratelimit`), and ``qim_gateway_rate_limited_total{tenant,dimension}`` counts it.

With ``mailbox_sync`` the same forwarder and reader also carry login sync
(:class:`~qim.gateway.routing.mailbox_requests.MailboxRequests`): PULL_MAILBOX goes to
``qim.user-requests`` at the user's MailboxShard, and ``kind="mailbox_reply"`` records of the
to-gateway topic go to it instead of being counted as an unknown kind.

``kind="reaction_push"`` records (the ConversationWriter's merged REACTION_UPDATE of one message,
``qim.schemas.records.reactions``) go to every live session of their recipients on this node.

``kind="typing_relay"`` records (13.2, the writer's verdict on a TYPING) are written to every
live connection of their recipients (:mod:`~qim.gateway.push.transient`), and
``kind="ephemeral_relay"`` records (an ephemeral custom message, 13.3) as PUSH_EVENTS the same
way, the sending device excepted.

``kind="push_batch"`` records (the MailboxNode's PushBatch, spec 11.1) are expanded against
this node's live connections (:func:`~qim.core.push.expand_batch`, keyed by ``conn_id``, the
``connection_id`` the presence entry carries); each delivery goes to that connection's
:meth:`Session.push <qim.gateway.session.Session.push>`. Each PRESENCE_STALE is produced,
fire-and-forget, to ``qim.user-requests`` at the batch's MailboxShard (only with
``mailbox_sync``, which makes that topic one of the forwarder's; a lost report costs nothing
durable, 5.4.3).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol, runtime_checkable

import msgspec
from prometheus_client import CollectorRegistry

from qim.core.ratelimit import KeyedBuckets
from qim.gateway.actions import Send
from qim.gateway.devices import DeviceRegistry
from qim.gateway.logins import jittered
from qim.gateway.ports import AuthGrant
from qim.gateway.push.delivery import deliver_push_batch
from qim.gateway.push.metrics import PushMetrics
from qim.gateway.push.transient import deliver_ephemeral, deliver_typing
from qim.gateway.rooms.router import RoomRouter
from qim.gateway.rooms.router import handles as room_frame
from qim.gateway.routing.forwarder import RequestForwarder, RequestProducer, kafka_request_producer
from qim.gateway.routing.mailbox_requests import MailboxRequests
from qim.gateway.routing.metrics import RoutingMetrics
from qim.gateway.routing.prekeys import PREKEY_FRAMES, PrekeyRequests
from qim.gateway.routing.replies import ReplyVerdict, reply_send, resolve_reply
from qim.gateway.routing.rules import Routed, not_offered, request_kind, route_frame
from qim.gateway.routing.send_rate import UserMsgRate
from qim.observability.logging import trace
from qim.params.values import Rate
from qim.schemas.frames import (
    Error,
    ErrorCode,
    Frame,
    PullMailbox,
    PullMembers,
    SendMessage,
    for_code,
)
from qim.schemas.frames.control import ConversationState, MarkRead, PresenceSub
from qim.schemas.frames.history import PullHistory, PullSessionList
from qim.schemas.frames.reactions import ReactionUpdate
from qim.schemas.frames.rtc import RtcSignal
from qim.schemas.records.push import (
    PresenceStale,
    PushBatch,
    decode_to_gateway,
    encode_push_record,
)
from qim.schemas.records.reactions import decode_reaction_push
from qim.schemas.records.rooms import ROOM_TO_GATEWAY_KINDS
from qim.schemas.records.transient import (
    decode_ephemeral_relay,
    decode_rtc_relay,
    decode_typing_relay,
)
from qim.streams.producer import replaced_counter
from qim.streams.transit import TransitError, TransitSealer, load_transit_sealer

if TYPE_CHECKING:
    from qim.gateway.config import GatewayConfig
    from qim.gateway.presence_subs import PresenceSubscriptions
    from qim.gateway.rtc import RtcSignalling
    from qim.gateway.transport.connection import Connection

__all__ = ["ConversationRouter", "ReplySource", "build_router"]

log = logging.getLogger(__name__)

_HISTORY_PULL_RATE: Final = Rate(count=5, period_ms=1000)  # B.5 per_user_history_pull_rate
_PendingKey = tuple[str, str, str, int, int]  # tenant, user, device, session_epoch, request_id


class _Record(Protocol):
    @property
    def value(self) -> bytes | None: ...


@runtime_checkable
class ReplySource(Protocol):
    """Batches of the to-gateway records of the owned shards (``ShardOwnership.records``)."""

    def records(self) -> AsyncIterator[Sequence[_Record]]: ...


@dataclass(frozen=True, slots=True)
class _StaleRecord:
    """A PresenceStale as the forwarder's ``Outgoing``."""

    stale: PresenceStale

    @property
    def key(self) -> bytes:
        return self.stale.key

    @property
    def value(self) -> bytes:
        return encode_push_record(self.stale)

    @property
    def partition(self) -> int:
        return self.stale.partition


class _LiveGrants(Mapping[str, AuthGrant]):
    """The node's authenticated, open connections by ``conn_id``, as expansion reads them."""

    def __init__(self, connections: Mapping[str, Connection]) -> None:
        self._connections = connections

    def __getitem__(self, conn_id: str) -> AuthGrant:
        conn = self._connections[conn_id]
        grant = conn.session.grant
        if grant is None or conn.closing or conn.session.closed:
            raise KeyError(conn_id)
        return grant

    def __iter__(self) -> Iterator[str]:
        return iter(self._connections)

    def __len__(self) -> int:
        return len(self._connections)


@dataclass(frozen=True, slots=True)
class _Pending:
    started_ms: int
    kind: str


class ConversationRouter:
    """Forwards requests, delivers replies; ``start(source)`` / ``stop()`` with the node."""

    def __init__(
        self,
        forwarder: RequestForwarder,
        registry: DeviceRegistry[Connection],
        shard_of: Callable[[str, str], int],
        metrics_registry: CollectorRegistry,
        *,
        clock_ms: Callable[[], int],
        retry_after_ms: int = 2000,
        pending_ttl_ms: int = 60_000,
        max_pending: int = 100_000,
        history_pull_rate: Rate = _HISTORY_PULL_RATE,
        transit: TransitSealer | None = None,
    ) -> None:
        self.forwarder = forwarder
        self.transit = transit if transit is not None else load_transit_sealer()
        """Opens the to-gateway values the decrypt points sealed for this hop (decision 44)."""
        self._registry = registry
        self._shard_of = shard_of
        self._clock_ms = clock_ms
        self._retry_after_ms = retry_after_ms
        self._pending_ttl_ms = pending_ttl_ms
        self._max_pending = max_pending
        self._pending: dict[_PendingKey, _Pending] = {}
        # per_user_history_pull_rate (20.4.1: "in front of MessageStore"): every device of a
        # user reaches this node (its ConnectionShard's owner), so the bucket is exact per user
        self.history_pulls: KeyedBuckets[tuple[str, str]] = KeyedBuckets(
            history_pull_rate.per_second, history_pull_rate.count
        )
        self._pump: asyncio.Task[None] | None = None
        self.mailbox: MailboxRequests | None = None  # login sync, when the node has it on
        self.send_rate: UserMsgRate | None = None  # per_user_msg_rate (send_rate.py)
        self.prekeys: PrekeyRequests | None = None  # PREKEY_PUBLISH / _FETCH (``prekeys``)
        self.connections: Mapping[str, Connection] = {}  # the node's, by conn_id (pushes)
        self.push_metrics: PushMetrics | None = None  # the node's (24.1.6, body_encode_count)
        self.rooms: RoomRouter | None = None  # chatrooms (spec 14), when the node has them on
        self.presence: PresenceSubscriptions | None = None  # PRESENCE_SUB (13.2), the node's
        self.rtc: RtcSignalling | None = None  # RTC_SIGNAL ring timers (13.5), the node's
        self._presence_asks: dict[_PendingKey, tuple[Connection, Frame]] = {}
        self.metrics = RoutingMetrics(
            metrics_registry,
            clock_ms=clock_ms,
            in_flight=lambda: len(self._pending),
            queued=lambda: forwarder.queued,
        )

    async def start(self, source: ReplySource | None) -> None:
        await self.forwarder.start()
        if self.rooms is not None:
            self.rooms.connections = self.connections
            await self.rooms.start()
        if source is None:
            log.warning("no ConnectionShard record source: writer replies will not be delivered")
            return
        self._pump = asyncio.create_task(self._read(source), name="to-gateway-replies")

    async def stop(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
            self._pump = None
        if self.rooms is not None:
            await self.rooms.stop()
        await self.forwarder.stop()

    # -- requests -------------------------------------------------------------------------------

    def handle(self, conn: Connection, frame: Frame) -> None:
        """The node's frame handler: never blocks, never awaits Kafka."""
        grant = conn.session.grant
        if grant is None or conn.closing:
            return
        if self.rooms is not None and room_frame(frame):
            self.rooms.handle(conn, frame)
            return
        if self.mailbox is not None and isinstance(frame.body, PullMailbox):
            self.mailbox.pull(conn, frame)
            return
        if self.mailbox is not None and isinstance(frame.body, PullSessionList):
            self.mailbox.session_list(conn, frame)
            return
        if self.mailbox is not None and isinstance(frame.body, MarkRead):
            self.mailbox.mark_read(conn, frame)
            return
        if self.mailbox is not None and isinstance(frame.body, ConversationState):
            self.mailbox.conversation_state(conn, frame)
            return
        limited = SendMessage | RtcSignal  # 13.5.2: RTC_SIGNAL shares per_user_msg_rate
        if isinstance(frame.body, limited) and not self._admit_send(conn, frame):
            return
        if isinstance(frame.body, PullHistory) and not self._admit_history(conn, frame):
            return
        if self.prekeys is not None and isinstance(frame.body, PREKEY_FRAMES):
            self.prekeys.handle(conn, frame)
            return
        if self.presence is not None and isinstance(frame.body, PresenceSub):
            self.presence.handle(conn, frame)
            return
        rtc = self.rtc
        if rtc is not None and isinstance(frame.body, RtcSignal) and rtc.outgoing(conn, frame):
            return  # refused, or answered "offline" (13.5.2)
        shard = self._shard_of(grant.tenant_id, grant.user_id)
        routed = route_frame(
            frame, grant, connection_shard=shard, partition_count=self.forwarder.partition_count
        )
        rid = frame.header.request_id
        if routed is None:
            self.metrics.unrouted.labels(frame=frame.name).inc()
            conn.apply([Send(not_offered(frame), request_id=rid, version=conn.session.version)])
            return
        if isinstance(routed, Error):
            kind = request_kind(frame.body)
            self.metrics.refused.labels(kind=kind).inc()
            if kind == "send":
                self.metrics.send_reject.labels(code=ErrorCode.PERMISSION_DENIED.name).inc()
            conn.apply([Send(routed, request_id=rid, version=conn.session.version)])
            return
        key = (grant.tenant_id, grant.user_id, grant.device_id, grant.session_epoch, rid)
        self._remember(key, routed.kind)
        if not self.forwarder.submit(routed, lambda exc: self._produced(conn, key, routed, exc)):
            self._failed(conn, key, routed, "queue_full")

    def _admit_send(self, conn: Connection, frame: Frame) -> bool:
        """Take the user's ``per_user_msg_rate`` token (a send or an RTC_SIGNAL, 13.5.2), or
        answer RATE_LIMITED with the time a retry can succeed (``send_rate``; not jittered
        here, the client adds its own)."""
        grant = conn.session.grant
        if self.send_rate is None or grant is None:
            return True
        verdict = self.send_rate.take(grant.tenant_id, grant.user_id, self._clock_ms())
        if verdict.retry_after_ms is None:
            return True
        if isinstance(frame.body, SendMessage):
            self.metrics.send_reject.labels(code=ErrorCode.RATE_LIMITED.name).inc()
        return self._rate_limited(conn, frame, "per_user_msg_rate", verdict.retry_after_ms)

    def _admit_history(self, conn: Connection, frame: Frame) -> bool:
        """Take a ``per_user_history_pull_rate`` token, or answer RATE_LIMITED with the time
        a retry can succeed (the bucket's promise, :mod:`qim.core.ratelimit`; not jittered
        here: an earlier retry would be refused again, the client adds its own jitter)."""
        grant = conn.session.grant
        assert grant is not None
        verdict = self.history_pulls.take((grant.tenant_id, grant.user_id), self._clock_ms())
        if verdict.retry_after_ms is None:
            return True
        return self._rate_limited(conn, frame, "per_user_history_pull_rate", verdict.retry_after_ms)

    def _rate_limited(
        self, conn: Connection, frame: Frame, dimension: str, retry_after_ms: int
    ) -> bool:
        """Count the refusal by (tenant, dimension) and answer ERROR{RATE_LIMITED,
        retry_after_ms, detail=dimension} with the frame's request_id; always False."""
        grant = conn.session.grant
        assert grant is not None
        self.metrics.rate_limited.labels(tenant=grant.tenant_id, dimension=dimension).inc()
        rid = frame.header.request_id
        error = Error(
            code=int(ErrorCode.RATE_LIMITED),
            retry_after_ms=retry_after_ms,
            detail=dimension,
            request_id=rid,
        )
        conn.apply([Send(error, request_id=rid, version=conn.session.version)])
        return False

    def presence_members(self, conn: Connection, frame: Frame, conversation_id: str) -> None:
        """PRESENCE_SUB{conversation_id}: ask the writer for the members (one page of
        presence_sub_max_targets; it refuses a non-member), answered in ``deliver``."""
        grant = conn.session.grant
        presence = self.presence
        if grant is None or presence is None:
            return
        ask = dataclasses.replace(
            frame,
            body=PullMembers(conversation_id=conversation_id, limit=presence.max_targets),
        )
        rid = frame.header.request_id
        key = (grant.tenant_id, grant.user_id, grant.device_id, grant.session_epoch, rid)
        asks = self._presence_asks
        while len(asks) >= 10_000:
            del asks[next(iter(asks))]
        asks[key] = (conn, frame)
        self.handle(conn, ask)

    def _produced(
        self, conn: Connection, key: _PendingKey, routed: Routed, exc: BaseException | None
    ) -> None:
        if exc is None:
            self.metrics.forwarded.labels(kind=routed.kind).inc()
            return
        log.warning(
            "request %s to partition %d not produced: %r", routed.kind, routed.partition, exc
        )
        self._failed(conn, key, routed, "kafka")

    def _failed(self, conn: Connection, key: _PendingKey, routed: Routed, reason: str) -> None:
        self._pending.pop(key, None)
        self.metrics.failed.labels(kind=routed.kind, reason=reason).inc()
        if routed.kind == "send":
            self.metrics.send_reject.labels(code=ErrorCode.RATE_LIMITED.name).inc()
        if conn.closing or conn.session.closed:
            return
        rid = key[-1]
        drain_ms = self.forwarder.drain_ms() if reason == "queue_full" else None
        detail = (
            "gateway request queue full"
            if reason == "queue_full"
            else "commit log temporarily unavailable"
        )
        error = Error(
            code=int(ErrorCode.RATE_LIMITED),
            retry_after_ms=jittered(drain_ms if drain_ms is not None else self._retry_after_ms),
            detail=detail,
            request_id=rid,
        )
        conn.apply([Send(error, request_id=rid, version=conn.session.version)])

    def _remember(self, key: _PendingKey, kind: str) -> None:
        """Note when a request left, for the latency metrics; bounded in size and age."""
        now = self._clock_ms()
        pending = self._pending
        horizon = now - self._pending_ttl_ms
        while pending:
            oldest = next(iter(pending))
            if pending[oldest].started_ms >= horizon and len(pending) < self._max_pending:
                break
            del pending[oldest]
        pending.pop(key, None)  # re-insert at the end: insertion order stays time order
        pending[key] = _Pending(now, kind)

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    # -- replies --------------------------------------------------------------------------------

    def deliver(self, value: bytes | None) -> ReplyVerdict:
        """Write one to-gateway record to its connection (or count why not)."""
        if value:
            try:
                value = self.transit.open(value)
            except TransitError:
                self.metrics.records.labels(kind="sealed", result="malformed").inc()
                return ReplyVerdict.MALFORMED
        resolved = resolve_reply(value, self._registry)
        if self.mailbox is not None and value and resolved.kind == "mailbox_reply":
            verdict = self.mailbox.deliver(value)
            self.metrics.records.labels(kind=resolved.kind, result=verdict.value).inc()
            return verdict
        if self.mailbox is not None and value and resolved.kind == "session_push":
            verdict = self.mailbox.session_push(value)
            self.metrics.records.labels(kind=resolved.kind, result=verdict.value).inc()
            return verdict
        if value and resolved.kind == "rtc_relay" and self.rtc is not None:
            try:
                relay = decode_rtc_relay(value)
            except (msgspec.DecodeError, ValueError):
                verdict = ReplyVerdict.MALFORMED
            else:
                written = self.rtc.incoming(relay)
                verdict = ReplyVerdict.DELIVER if written else ReplyVerdict.NO_SESSION
            self.metrics.records.labels(kind=resolved.kind, result=verdict.value).inc()
            return verdict
        if value and resolved.kind == "typing_relay":
            verdict = self.typing(value)
            self.metrics.records.labels(kind=resolved.kind, result=verdict.value).inc()
            return verdict
        if value and resolved.kind == "ephemeral_relay":
            verdict = self.ephemeral(value)
            self.metrics.records.labels(kind=resolved.kind, result=verdict.value).inc()
            return verdict
        if self.prekeys is not None and value and resolved.kind == "prekey_reply":
            verdict = self.prekeys.deliver(value)
            self.metrics.records.labels(kind=resolved.kind, result=verdict.value).inc()
            return verdict
        if self.rooms is not None and value and resolved.kind in ROOM_TO_GATEWAY_KINDS:
            verdict = self.rooms.deliver(value)
            self.metrics.records.labels(kind=resolved.kind, result=verdict.value).inc()
            return verdict
        if value and resolved.kind == "push_batch":
            verdict = self.push(value)
            self.metrics.records.labels(kind=resolved.kind, result=verdict.value).inc()
            return verdict
        if value and resolved.kind == "reaction_push":
            verdict = self.push_reactions(value)
            self.metrics.records.labels(kind=resolved.kind, result=verdict.value).inc()
            return verdict
        self.metrics.records.labels(kind=resolved.kind, result=resolved.verdict.value).inc()
        reply = resolved.reply
        if reply is None:
            return resolved.verdict
        key = (reply.tenant_id, reply.user_id, reply.device_id, reply.session_epoch)
        entry = self._pending.pop((*key, reply.request_id), None)
        conn = resolved.conn
        if conn is None or resolved.verdict is not ReplyVerdict.DELIVER:
            return resolved.verdict
        asked = self._presence_asks.pop((*key, reply.request_id), None)
        if asked is not None and reply.members is not None and self.presence is not None:
            self.presence.members(asked[0], asked[1], reply.members)  # its targets, not a frame
            return resolved.verdict
        conn.apply([reply_send(reply, conn.session.version)])
        latency = None if entry is None else self._clock_ms() - entry.started_ms
        kind = entry.kind if entry is not None else ("send" if reply.send_ack else "unknown")
        error = None if reply.error is None else for_code(reply.error.code).name
        self.metrics.on_reply(kind, latency, ack=reply.send_ack is not None, error=error)
        ack = reply.send_ack
        if ack is not None:  # 24.2: the sender's side of the message's trace
            trace(
                log, "SEND_ACK written", stage="acked", message_id=ack.message_id,
                client_message_id=ack.client_message_id, tenant_id=reply.tenant_id,
                user_id=reply.user_id, device_id=reply.device_id,
                connection_shard=reply.connection_shard,
            )  # fmt: skip
        return resolved.verdict

    def push(self, value: bytes) -> ReplyVerdict:
        """Expand one PushBatch onto the live connections (11.1.1); report the stale ones."""
        try:
            batch = decode_to_gateway(value)
        except (msgspec.DecodeError, ValueError):
            return ReplyVerdict.MALFORMED
        if not isinstance(batch, PushBatch):
            return ReplyVerdict.MALFORMED
        live, now = _LiveGrants(self.connections), self._clock_ms()
        expansion = deliver_push_batch(batch, live, self.connections, now, self.push_metrics)
        for stale in expansion.stale:
            self._report_stale(stale)
        return ReplyVerdict.DELIVER if expansion.deliveries else ReplyVerdict.NO_SESSION

    def push_reactions(self, value: bytes) -> ReplyVerdict:
        """One ReactionPush: a REACTION_UPDATE to every live session of its recipients here
        (13.6.3 item 1: online members only; the others read the aggregate with the message)."""
        try:
            push = decode_reaction_push(value)
        except (msgspec.DecodeError, ValueError):
            return ReplyVerdict.MALFORMED
        delivered = False
        for user in push.recipients:
            frame: ReactionUpdate | None = None
            for slot in self._registry.devices(push.tenant_id, user).values():
                conn = slot.conn
                if conn.closing or conn.session.closed or conn.session.grant is None:
                    continue
                frame = frame or push.update_for(user)
                conn.apply([Send(frame, version=conn.session.version)])
                delivered = True
        return ReplyVerdict.DELIVER if delivered else ReplyVerdict.NO_SESSION

    def typing(self, value: bytes) -> ReplyVerdict:
        """A TYPING relay (13.2) onto the recipients' live connections on this node."""
        try:
            relay = decode_typing_relay(value)
        except (msgspec.DecodeError, ValueError):
            return ReplyVerdict.MALFORMED
        written = deliver_typing(relay, self._registry)
        return ReplyVerdict.DELIVER if written else ReplyVerdict.NO_SESSION

    def ephemeral(self, value: bytes) -> ReplyVerdict:
        """An ephemeral custom message (13.3) onto its recipients' live connections here."""
        try:
            relay = decode_ephemeral_relay(value)
        except (msgspec.DecodeError, ValueError):
            return ReplyVerdict.MALFORMED
        written = deliver_ephemeral(relay, self._registry)
        return ReplyVerdict.DELIVER if written else ReplyVerdict.NO_SESSION

    def _report_stale(self, stale: PresenceStale) -> None:
        mailbox = self.mailbox
        if mailbox is None:  # user-requests is not a topic of this forwarder
            return

        def produced(exc: BaseException | None) -> None:
            if exc is not None:
                log.debug("PRESENCE_STALE for %s not produced: %r", stale.user_id, exc)

        self.forwarder.submit(_StaleRecord(stale), produced, topic=mailbox.topic)

    async def _read(self, source: ReplySource) -> None:
        """Deliver every record; a failure of ours is logged and the stream goes on."""
        while True:
            try:
                async for batch in source.records():
                    for record in batch:
                        try:
                            self.deliver(record.value)
                        except Exception:
                            log.exception("to-gateway record not delivered")
                return  # the source stopped (ownership stopped)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("to-gateway reader failed; resuming")
                await asyncio.sleep(1)


def build_router(
    config: GatewayConfig,
    registry: DeviceRegistry[Connection],
    shard_of: Callable[[str, str], int],
    metrics_registry: CollectorRegistry,
    *,
    clock_ms: Callable[[], int],
    producer: RequestProducer | None = None,
) -> ConversationRouter:
    """The node's router from its configuration (``route_requests``); ``producer`` is a seam
    for tests, the default an idempotent ``acks=all`` Kafka producer."""
    assert config.kafka_bootstrap is not None  # GatewayConfig checks it
    if producer is None:
        replaced = replaced_counter(metrics_registry, "gateway")
        producer = kafka_request_producer(
            config.kafka_bootstrap,
            linger_ms=config.request_linger_ms,
            client_id=config.node_id,
            on_replaced=lambda reason: replaced.labels(producer="requests", reason=reason).inc(),
        )
        # a send's body is in clear until the writer seals it: sealed for this hop (decision 44)
        producer.seal_topics[config.requests_topic] = load_transit_sealer().seal  # type: ignore[attr-defined]
    settings = config.settings
    extra = {}
    if config.mailbox_sync:
        extra[config.user_requests_topic] = (
            int(settings.mailbox_shard_count),
            "mailbox_shard_count",
            "MailboxNode",
        )
    if config.prekeys:
        extra[config.prekey_requests_topic] = (
            config.prekey_partition_count,
            "prekey_partition_count",
            "key worker",
        )
    if config.rooms:
        extra[config.room_requests_topic] = (
            config.room_partition_count,
            "room_partition_count",
            "RoomWriter",
        )
    extra[config.to_gateway_topic] = (  # RTC: a callee's node tells the caller (13.5.3)
        int(settings.connection_shard_count),
        "connection_shard_count",
        "ConnectionNode",
    )
    if config.push_tasks_topic:  # RTC: a callee with no online device is pushed (13.5.2)
        extra[config.push_tasks_topic] = (
            int(settings.mailbox_shard_count),
            "mailbox_shard_count",
            "NotificationService",
        )
    forwarder = RequestForwarder(
        producer,
        config.requests_topic,
        config.conversation_partition_count,
        max_queued=config.max_queued_requests,
        extra_topics=extra,
    )
    router = ConversationRouter(
        forwarder,
        registry,
        shard_of,
        metrics_registry,
        clock_ms=clock_ms,
        retry_after_ms=int(settings.region_failover_retry_after_ms),
        history_pull_rate=settings.per_user_history_pull_rate,
    )
    router.send_rate = UserMsgRate(settings, config.tenant_settings)
    if config.mailbox_sync:
        router.mailbox = MailboxRequests(
            forwarder,
            registry,
            shard_of,
            metrics_registry,
            topic=config.user_requests_topic,
            virtual_bucket_count=int(settings.virtual_bucket_count),
            mailbox_shard_count=int(settings.mailbox_shard_count),
            node_id=config.node_id,
            timeout_ms=config.mailbox_sync_timeout_ms,
            request_timeout_ms=config.mailbox_request_timeout_ms,
            retry_after_ms=int(settings.reconnect_backoff.initial_ms),
            clock_ms=clock_ms,
        )
    if config.prekeys:
        router.prekeys = PrekeyRequests(
            forwarder,
            registry,
            shard_of,
            metrics_registry,
            topic=config.prekey_requests_topic,
            partition_count=config.prekey_partition_count,
            retry_after_ms=int(settings.region_failover_retry_after_ms),
        )
    if config.rooms:
        rate = settings.room_outbound_frame_rate
        router.rooms = RoomRouter(
            forwarder,
            shard_of,
            metrics_registry,
            topic=config.room_requests_topic,
            partition_count=config.room_partition_count,
            max_rooms_per_connection=int(settings.max_rooms_per_connection),
            window_ms=max(1, rate.period_ms // max(1, rate.count)),  # 100 ms for 10 frames/s
            renew_ms=config.room_target_renew_ms,
            retry_after_ms=int(settings.region_failover_retry_after_ms),
            clock_ms=clock_ms,
        )
    return router
