"""ConnectionNode (§5.1): listeners, sessions, auth, devices, ownership, presence and metrics.

It holds the sockets of the ConnectionShards it owns and is the sole writer of PresenceEntry.
It touches Redis only through the authenticator at login, never per message or heartbeat
(direction.md §1). Timeouts run on one timing wheel with lazy checks (§15.1.5), presence
leases are renewed every ``presence_lease_renew`` in one pass (§5.4.2). With
``route_requests`` the ConversationRouter (``router.py``) forwards business frames to the
ConversationWriter and delivers its replies read from the owned ConnectionShards; with
``mailbox_sync`` it also carries login sync to the MailboxNode (``mailbox_requests.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from itertools import count
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from qim.core.push import BudgetDecision, FlowState
from qim.core.revocation import revocation_hits
from qim.gateway.actions import Authenticate, CloseReason, Count, Send
from qim.gateway.admission import ConnectAdmission, Refusal
from qim.gateway.config import GatewayConfig
from qim.gateway.devices import DeviceRegistry
from qim.gateway.logins import LoginFlow, jittered
from qim.gateway.metrics import GatewayMetrics
from qim.gateway.ports import Authenticator, OwnAll, Ownership, PresenceSink
from qim.gateway.presence_directory import PresenceDirectory
from qim.gateway.presence_subs import PresenceSubscriptions
from qim.gateway.presence_writer import KafkaPresenceWriter, MemoryPresence
from qim.gateway.push.delta_merge import SessionFrameMerge
from qim.gateway.push.evidence import EvidenceReporter
from qim.gateway.push.metrics import SendQueue
from qim.gateway.revocations import RevocationFollower
from qim.gateway.routing.forwarder import RequestProducer
from qim.gateway.routing.router import ConversationRouter, ReplySource, build_router
from qim.gateway.routing.rules import not_offered
from qim.gateway.rtc import RtcSignalling
from qim.gateway.session import Session
from qim.gateway.states import ConnState
from qim.gateway.transport.budget import NodeSendBudget, available_memory_bytes
from qim.gateway.transport.connection import Connection, Transport
from qim.gateway.transport.listeners import Listeners
from qim.gateway.wheel import TimingWheel
from qim.schemas.frames import Error, ErrorCode, Frame, PullMailbox
from qim.schemas.records.presence import PresenceKey
from qim.schemas.records.revocation import RevocationNotice
from qim.schemas.records.user_requests import mailbox_partition
from qim.streams.producer import replaced_counter

__all__ = ["ConnectionNode", "wall_clock_ms"]

log = logging.getLogger(__name__)

FrameHandler = Callable[[Connection, Frame], None]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class ConnectionNode:
    """One gateway process's worth of connections. ``await start()``, ``await stop()``."""

    def __init__(
        self,
        config: GatewayConfig,
        authenticator: Authenticator,
        *,
        ownership: Ownership | None = None,
        presence: PresenceSink | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        frame_handler: FrameHandler | None = None,
        request_producer: RequestProducer | None = None,
    ) -> None:
        self.config = config
        self.clock_ms = clock_ms
        self.ownership: Ownership = ownership or OwnAll(config.advertised_endpoint)
        self._writer: KafkaPresenceWriter | None = None
        if presence is None and config.kafka_bootstrap:
            presence = self._writer = KafkaPresenceWriter(
                config.kafka_bootstrap,
                config.presence_topic,
                virtual_bucket_count=int(config.settings.virtual_bucket_count),
                mailbox_shard_count=int(config.settings.mailbox_shard_count),
                on_replaced=lambda reason: self.producer_replaced.labels(
                    producer="presence", reason=reason
                ).inc(),
            )
        self.presence: PresenceSink = presence if presence is not None else MemoryPresence()
        self.connections: dict[str, Connection] = {}
        self.registry: DeviceRegistry[Connection] = DeviceRegistry(
            int(config.settings.max_devices_per_user)
        )
        rate = config.settings.per_ip_connect_rate
        self.admission = ConnectAdmission(
            rate_count=rate.count,
            rate_period_ms=rate.period_ms,
            max_connections=int(config.settings.per_ip_max_connections),
        )
        self.metrics = GatewayMetrics(
            config.node_id,
            clock_ms=clock_ms,
            online_count=lambda: len(self.registry),
            unauth_count=self._unauth_count,
            send_queues=self._send_queues,
        )
        # issue 15: the request and presence producers replace themselves after a broker restart
        self.producer_replaced = replaced_counter(self.metrics.registry, "gateway")
        self.revocation_kicks = Counter(
            "qim_gateway_revocation_kicks",
            "live sessions ended by a qim.revocations record, by scope",
            ["scope"],
            registry=self.metrics.registry,
        )
        self._revocations: RevocationFollower | None = None
        if config.follow_revocations and config.kafka_bootstrap:
            self._revocations = RevocationFollower(
                config.kafka_bootstrap,
                config.revocations_topic,
                self.revoke_live,
                on_malformed=self._malformed_revocation,
            )
        self.send_budget = NodeSendBudget(  # 11.3.3: the sum of every socket's send buffer
            config.settings.node_send_buffer_budget.resolve(available_memory_bytes()),
            clock_ms,
            on_decision=self._budget_decision,
        )
        self.logins = LoginFlow(
            config, authenticator, self.ownership, self.registry, self.presence,
            self.metrics, clock_ms,
        )  # fmt: skip
        self.router: ConversationRouter | None = None
        self.directory: PresenceDirectory | None = None  # the presence topic, all partitions
        self.presence_subs: PresenceSubscriptions | None = None
        self.rtc: RtcSignalling | None = None
        if config.route_requests:
            self.router = build_router(
                config, self.registry, self.logins.shard_of, self.metrics.registry,
                clock_ms=clock_ms, producer=request_producer,
            )  # fmt: skip
            self.logins.mailbox = self.router.mailbox  # login sync (``mailbox_sync``)
            self.router.connections = self.connections  # PushBatch expansion
            self.router.push_metrics = self.metrics.push
            assert config.kafka_bootstrap is not None  # route_requests needs it
            self.directory = PresenceDirectory(
                config.kafka_bootstrap, config.presence_topic, clock_ms=clock_ms,
                partitions=int(config.settings.mailbox_shard_count),
                client_id=f"{config.node_id}-presence",
            )  # fmt: skip
            self.presence_subs = PresenceSubscriptions(
                self.directory,
                max_targets=int(config.settings.presence_sub_max_targets),
                merge_window_ms=int(config.settings.presence_sub_merge_window),
                clock_ms=clock_ms,
            )
            self.presence_subs.members_of = self.router.presence_members
            self.router.presence = self.presence_subs
            self.rtc = RtcSignalling(
                self.registry, self.directory, self.router.forwarder,
                topic=config.to_gateway_topic, shard_of=self.logins.shard_of,
                ring_timeout_ms=int(config.settings.rtc_ring_timeout), clock_ms=clock_ms,
                push_topic=config.push_tasks_topic,
                push_partition_of=_user_shard(config),
            )  # fmt: skip
            self.router.rtc = self.rtc
        self.evidence: EvidenceReporter | None = None  # 16.1.2, with a MailboxNode to tell
        self._undelivered: set[Connection] = set()  # PUSHED, the peer's kernel ack not seen
        if self.router is not None and self.router.mailbox is not None:
            self.evidence = _evidence_reporter(config, self.router, self.metrics.registry)
        if frame_handler is None and self.router is not None:
            frame_handler = self.router.handle
        self.frame_handler = frame_handler
        self.listeners = Listeners(self)
        window = config.delta_merge_window_ms  # 12.6.3; 0: SESSION_DELTA sent at once
        self.delta_merge = (
            SessionFrameMerge(window, on_offer=self.metrics.push.on_session_frame)
            if window > 0
            else None
        )
        self._session_config = config.session_config()
        self._wheel: TimingWheel[Connection] = TimingWheel(
            config.wheel_tick, int(config.settings.heartbeat_wheel_slots), now_ms=clock_ms()
        )
        self._boot = secrets.token_hex(4)
        self._ids = count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self._background: list[asyncio.Task[None]] = []
        self.drained = asyncio.Event()  # set while no connection is open
        self.drained.set()

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        if self._writer is not None:
            await self._writer.start()
        if self._revocations is not None:
            await self._revocations.start()
        if self.directory is not None:
            await self.directory.start()
        if self.rtc is not None:
            await self.rtc.start()
        if self.router is not None:
            source = self.ownership if isinstance(self.ownership, ReplySource) else None
            await self.router.start(source)
        await self.listeners.start()
        self._background = [
            asyncio.create_task(self._wheel_loop(), name="timing-wheel"),
            asyncio.create_task(self._renew_loop(), name="presence-renew"),
        ]
        if self.evidence is not None:
            self._background.append(asyncio.create_task(self._evidence_loop(), name="evidence"))

    async def stop(self) -> None:
        """Stop listening, close every connection (tombstoning its presence), flush."""
        await self.listeners.stop_accepting()
        now = self.clock_ms()
        for conn in list(self.connections.values()):
            conn.apply(conn.session.shutdown(CloseReason.SHUTDOWN, now, "node stopping"))
        await self.listeners.wait_closed()
        if self.delta_merge is not None:
            self.delta_merge.close()
        for task in self._background:
            task.cancel()
        for task in [*self._background, *self._tasks]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.evidence is not None:
            self.evidence.flush()  # before the forwarder stops (the CONN_CLOSEDs are queued)
        if self.router is not None:
            await self.router.stop()
        if self._revocations is not None:
            await self._revocations.stop()
        if self.directory is not None:
            await self.directory.stop()
        if self.rtc is not None:
            await self.rtc.stop()
        if self._writer is not None:
            await self._writer.stop()
        await self.listeners.stop_metrics()

    # -- drivers call these -------------------------------------------------------------------

    def admit(self, peer_ip: str) -> bool:
        """Per-IP admission before TLS (§15.2.3); refusals carry no app frame (§20.4.1)."""
        if not self.check(peer_ip):
            return False
        self.acquire(peer_ip)
        return True

    def check(self, peer_ip: str) -> bool:
        """The rate and cap check alone (WebSocket: at the HTTP upgrade)."""
        refusal: Refusal | None = self.admission.check(peer_ip, self.clock_ms())
        if refusal is not None:
            self.metrics.refused.labels(reason=refusal.value).inc()
        return refusal is None

    def acquire(self, peer_ip: str) -> None:
        self.admission.acquire(peer_ip)

    def release(self, peer_ip: str) -> None:
        self.admission.release(peer_ip)

    def attach(self, transport: Transport, peer_ip: str) -> Connection:
        """A new admitted transport becomes a Connection in AWAITING_AUTH."""
        now = self.clock_ms()
        conn_id = f"{self._boot}-{next(self._ids)}"
        session = Session(self._session_config, now_ms=now, peer=peer_ip)
        conn = Connection(
            conn_id, session, transport, self,
            clock_ms=self.clock_ms,
            peer_ip=peer_ip,
            chunk_bytes=int(self.config.settings.stream_write_chunk_bytes),
            hard_watermark_bytes=self.config.settings.conn_send_hard_watermark.bytes,
            close_flush_timeout_ms=self.config.close_flush_timeout_ms,
            budget=self.send_budget,
            drain_poll_ms=self.config.drain_poll_ms,
            merge=self.delta_merge,
        )  # fmt: skip
        self.connections[conn_id] = conn
        self.drained.clear()
        self._schedule(conn)
        self.metrics.on_open()
        return conn

    def drop_shards(self, shards: set[int]) -> None:
        """The node lost these ConnectionShards: ERROR{SHARD_MOVED} + close their connections.

        No tombstones: the node is no longer the writer; its entries expire by lease and the
        new owner writes fresh ones (§5.4.2). Usable as ShardOwnership's ``on_revoked``.
        """
        now = self.clock_ms()
        for tenant, user, device, slot in list(self.registry):
            if self.logins.shard_of(tenant, user) in shards:
                self.registry.release(tenant, user, device, slot.conn)
                moved = Error(
                    code=int(ErrorCode.SHARD_MOVED),
                    retry_after_ms=jittered(self.logins.backoff_ms),
                    detail="connection_shard moved",
                )
                slot.conn.apply(slot.conn.session.refuse(moved, now))

    def _malformed_revocation(self) -> None:
        log.warning("a qim.revocations record did not decode; skipped")
        self.revocation_kicks.labels(scope="malformed_record").inc()

    def revoke_live(self, notice: RevocationNotice) -> None:
        """KICKED{reason} + close for every live session ``notice`` revokes (15.3.2)."""
        now = self.clock_ms()
        if notice.scope == "token":
            slots = [slot for *_ids, slot in self.registry]
        elif notice.tenant_id is None or notice.user_id is None:
            return
        else:
            slots = list(self.registry.devices(notice.tenant_id, notice.user_id).values())
        for slot in slots:
            conn = slot.conn
            grant = conn.session.grant
            if grant is None or conn.closing:
                continue
            if revocation_hits(
                notice,
                tenant_id=grant.tenant_id,
                user_id=grant.user_id,
                device_id=grant.device_id,
                token_id=grant.token_id,
                token_issued_at_ms=grant.token_issued_at_ms,
            ):
                conn.apply(conn.session.kick(notice.reason, None, now))
                self.revocation_kicks.labels(scope=notice.scope).inc()

    # -- ConnectionHooks ----------------------------------------------------------------------

    def authenticate(self, conn: Connection, action: Authenticate) -> None:
        self._spawn(self.logins.run(conn, action), f"auth-{conn.conn_id}")

    def forward(self, conn: Connection, frame: Frame) -> None:
        """Business frames go to the router (``route_requests``); without one each is answered
        as not offered (never silence, issue 16)."""
        sync = conn.session.sync
        if (
            sync is not None
            and isinstance(frame.body, PullMailbox)
            and sync.progress.acked_past_contiguity(frame.body.acked_seq)
        ):
            self.metrics.push.cursor_advanced.inc()  # 24.1.5 P1: served anyway, counted
        if isinstance(frame.body, PullMailbox):
            self._applied(conn, frame.body.acked_seq)  # 16.1.2 APPLIED evidence
        if self.frame_handler is not None:
            self.frame_handler(conn, frame)
        elif conn.session.grant is not None and not conn.closing:
            rid = frame.header.request_id
            conn.apply([Send(not_offered(frame), request_id=rid, version=conn.session.version)])

    def count(self, conn: Connection, action: Count) -> None:
        if action.name in ("ping", "ping_probe"):
            interval = conn.session.config.next_ping_interval_ms
            self.metrics.on_ping(action.name == "ping_probe", interval)
            self._applied(conn, conn.session.last_applied_mailbox_seq)  # 16.1.2 APPLIED
        else:
            self.metrics.on_count(action.name, action.label)

    def activity(self, conn: Connection) -> None:
        grant = conn.session.grant
        if grant is not None:
            self.registry.touch(
                grant.tenant_id, grant.user_id, grant.device_id, conn, conn.session.last_active_ms
            )
        deadline = conn.session.deadline_ms()
        if deadline is not None and (conn.scheduled_ms is None or deadline < conn.scheduled_ms):
            self._schedule(conn)

    def closing(self, conn: Connection, reason: CloseReason) -> None:
        self.metrics.closed.labels(reason=reason.value).inc()
        self._wheel.cancel(conn)
        if self.router is not None and self.router.rooms is not None:
            self.router.rooms.closed(conn)  # a closed connection leaves every room (14.5)
        if self.presence_subs is not None:
            self.presence_subs.closed(conn)  # soft state per connection (13.2)
        grant = conn.session.grant
        if grant is None:
            return
        self._undelivered.discard(conn)
        if self.evidence is not None:  # INV-50: every close path of an authenticated session
            self.evidence.closed(
                (grant.tenant_id, grant.user_id, grant.device_id, grant.session_epoch),
                last_pushed_user_seq=conn.session.last_pushed_user_seq,
                sync_to_seq=conn.session.sync_to_seq,
                connection_id=conn.conn_id,
                reason=reason.value,
            )
        key = PresenceKey(grant.tenant_id, grant.user_id, grant.device_id)
        if self.registry.release(key.tenant_id, key.user_id, key.device_id, conn):
            self.presence.tombstone(key)  # offline; a replaced one leaves its successor's key
            self.metrics.presence.labels(kind="tombstone").inc()

    def pushed(self, conn: Connection, mailbox_seq: int) -> None:
        """PUSH_EVENTS up to ``mailbox_seq`` left this connection's send buffer (PUSHED)."""
        grant = conn.session.grant
        if self.evidence is not None and grant is not None and not conn.closing:
            session = (grant.tenant_id, grant.user_id, grant.device_id, grant.session_epoch)
            self.evidence.pushed(session, mailbox_seq)
            self._undelivered.add(conn)

    def _delivered(self) -> None:
        """DELIVERED evidence of the connections whose PUSHED frames the peer's kernel has
        acknowledged since (read before each flush; only connections that pushed)."""
        evidence = self.evidence
        assert evidence is not None
        for conn in list(self._undelivered):
            grant = conn.session.grant
            if grant is None or conn.closing:
                self._undelivered.discard(conn)
                continue
            seq = conn.pushed_seq  # before the probe: those bytes are in the kernel already
            if conn.peer_acked():
                conn.delivered_seq = seq
                session = (grant.tenant_id, grant.user_id, grant.device_id, grant.session_epoch)
                evidence.delivered(session, seq)
                if conn.pushed_seq == seq:
                    self._undelivered.discard(conn)

    async def _evidence_loop(self) -> None:
        evidence = self.evidence
        assert evidence is not None
        while True:
            await asyncio.sleep(evidence.flush_ms / 1000)
            try:
                self._delivered()
                evidence.flush()
            except Exception:
                log.exception("push evidence flush failed")

    def _applied(self, conn: Connection, mailbox_seq: int) -> None:
        grant = conn.session.grant
        if self.evidence is not None and grant is not None and mailbox_seq:
            session = (grant.tenant_id, grant.user_id, grant.device_id, grant.session_epoch)
            self.evidence.applied(session, mailbox_seq)

    def finished(self, conn: Connection) -> None:
        self.connections.pop(conn.conn_id, None)
        self.release(conn.peer_ip)
        if not self.connections:
            self.drained.set()

    # -- internals --------------------------------------------------------------------------------

    def _send_queues(self) -> list[SendQueue]:
        degraded = FlowState.DEGRADED
        conns = list(self.connections.values())
        return [(c.buffered_bytes, c.session.flow_state is degraded) for c in conns]

    def _budget_decision(self, decision: BudgetDecision) -> None:
        for step in decision.steps:
            self.metrics.on_count("budget_step", str(step))
        log.warning("node send buffers over budget: %s", decision)

    def _unauth_count(self) -> int:
        waiting = (ConnState.AWAITING_AUTH, ConnState.AUTHENTICATING)
        return sum(1 for c in list(self.connections.values()) if c.session.state in waiting)

    def _schedule(self, conn: Connection) -> None:
        deadline = conn.session.deadline_ms()
        conn.scheduled_ms = deadline
        if deadline is not None:
            self._wheel.schedule(conn, deadline)

    def _spawn(self, coro: object, name: str) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _wheel_loop(self) -> None:
        tick = self._wheel.tick_ms / 1000
        while True:
            await asyncio.sleep(tick)
            started = time.monotonic()
            now = self.clock_ms()
            for conn in self._wheel.advance(now):
                conn.apply(conn.session.tick(now))
                if not conn.session.closed:
                    self._schedule(conn)
            if time.monotonic() - started > tick:
                self.metrics.tick_overruns.inc()

    async def _renew_loop(self) -> None:
        period = self.config.lease_renew_ms / 1000
        while True:
            await asyncio.sleep(period)
            for _tenant, _user, _device, slot in list(self.registry):
                self.logins.publish(slot.conn)


def _evidence_reporter(
    config: GatewayConfig, router: ConversationRouter, registry: CollectorRegistry
) -> EvidenceReporter:
    """16.1.2 evidence through the router's forwarder onto the user-requests topic."""
    mailbox = router.mailbox
    assert mailbox is not None
    buckets = int(config.settings.virtual_bucket_count)
    shards = int(config.settings.mailbox_shard_count)

    def produced(exc: BaseException | None) -> None:
        if exc is not None:
            log.debug("push evidence not produced: %r", exc)

    def submit(out: Any) -> bool:
        return router.forwarder.submit(out, produced, topic=mailbox.topic)

    def shard_of(tenant_id: str, user_id: str) -> int:
        return mailbox_partition(
            tenant_id, user_id, virtual_bucket_count=buckets, mailbox_shard_count=shards
        )

    return EvidenceReporter(submit, shard_of, registry, flush_ms=config.push_evidence_flush_ms)


def _user_shard(config: GatewayConfig) -> Callable[[PresenceKey], int]:
    """A (tenant, user, device) key's partition: the user's mailbox shard (push tasks)."""
    buckets = int(config.settings.virtual_bucket_count)
    shards = int(config.settings.mailbox_shard_count)

    def partition(key: PresenceKey) -> int:
        return key.partition(virtual_bucket_count=buckets, mailbox_shard_count=shards)

    return partition
