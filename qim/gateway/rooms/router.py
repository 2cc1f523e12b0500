"""RoomRouter: ROOM_JOIN / ROOM_LEAVE / ROOM_REPLAY and room sends of a ConnectionNode (14).

A part of the ConversationRouter (``router.rooms``), with the same forwarder and the same
to-gateway stream:

* **ROOM_JOIN** -> a ``RoomJoinRequest`` to the room's RoomWriter (``qim.room-requests`` at
  ``room_partition``), which checks the room and the user and registers this connection's
  ConnectionShard as a target. Its answer adds the connection to the node's
  ``room_id -> connections`` map (``core.rooms.members``) and goes to the connection as
  ROOM_BATCH{room_epoch, latest_room_seq, earliest_replay_room_seq} (or the writer's
  PERMISSION_DENIED). Idempotent: a second JOIN refreshes the positions only. More than
  ``max_rooms_per_connection`` -> ERROR{RATE_LIMITED} at once.
* **ROOM_LEAVE** is answered here (ROOM_BATCH{room_id, room_epoch, latest_room_seq}, no
  events); not a member -> PERMISSION_DENIED. When a shard's last member leaves, the shard is
  deregistered. A connection that closes leaves every room the same way (14.5).
* **ROOM_REPLAY** and **SEND_MESSAGE into an ``r:`` id** go to the RoomWriter for members
  only (anyone else: PERMISSION_DENIED, the same body as the writer's).
* **RoomBroadcast** records (one per ConnectionShard) are held per room for the merge window
  (``room_outbound_frame_rate``: 100 ms for 10 frames/s) and written as one ROOM_BATCH per
  member connection on stream 3 -- the lowest priority. A connection that is DEGRADED gets
  none (11.3.2: the first thing dropped; a dropped room message is really lost, the client
  finds the gap and replays). Events at or below a member's JOIN position are never sent.
* every ``renew_ms`` each (room, shard) with a member is renewed with its RoomWriter, whose
  registrations expire otherwise (``core.rooms.targets``).

Nothing here touches a mailbox, the session list or push (14.1).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
from prometheus_client import CollectorRegistry, Counter, Histogram

from qim.core.push import FlowState
from qim.core.rooms.ids import is_room_id, room_partition
from qim.core.rooms.members import RoomMembers
from qim.core.rooms.merge import RoomMerge, RoomView
from qim.gateway.actions import Send
from qim.gateway.logins import jittered
from qim.gateway.routing.forwarder import RequestForwarder
from qim.gateway.routing.replies import ReplyVerdict
from qim.schemas.frames import Error, ErrorCode, Frame, RoomBatch, SendAck, SendMessage
from qim.schemas.frames.room import RoomJoin, RoomLeave, RoomReplay
from qim.schemas.records.rooms import (
    RoomBroadcast,
    RoomJoinRequest,
    RoomReplayRequest,
    RoomReply,
    RoomSendRequest,
    RoomTargetRequest,
    decode_room_to_gateway,
    encode_room_record,
)

if TYPE_CHECKING:
    from qim.gateway.transport.connection import Connection

__all__ = ["RoomRouter", "handles"]

log = logging.getLogger(__name__)

RoomKey = tuple[str, str]


def handles(frame: Frame) -> bool:
    """The frames this router answers: the 0x05 range and sends into a room id."""
    body = frame.body
    if isinstance(body, RoomJoin | RoomLeave | RoomReplay):
        return True
    return isinstance(body, SendMessage) and body.conversation_id.startswith("r:")


@dataclass(frozen=True, slots=True)
class _Out:
    """A room request as the forwarder's ``Outgoing``."""

    key: bytes
    value: bytes
    partition: int


def _denied(request_id: int) -> Error:
    return Error(code=int(ErrorCode.PERMISSION_DENIED), request_id=request_id)


class RoomRouter:
    """The node's rooms; ``start()`` / ``stop()`` with the ConversationRouter."""

    def __init__(
        self,
        forwarder: RequestForwarder,
        shard_of: Callable[[str, str], int],
        registry: CollectorRegistry,
        *,
        topic: str,
        partition_count: int,
        max_rooms_per_connection: int,
        window_ms: int,
        renew_ms: int,
        retry_after_ms: int,
        clock_ms: Callable[[], int],
    ) -> None:
        self.forwarder = forwarder
        self.topic = topic
        self.partition_count = partition_count
        self.max_rooms = max_rooms_per_connection
        self.renew_ms = renew_ms
        self.retry_after_ms = retry_after_ms
        self._shard_of = shard_of
        self._clock_ms = clock_ms
        self.connections: Mapping[str, Connection] = {}
        self.members: RoomMembers[RoomKey] = RoomMembers()
        self.merge: RoomMerge[RoomKey] = RoomMerge(window_ms)
        self._pending_joins: dict[str, set[RoomKey]] = {}
        self._sent_at: dict[RoomKey, int] = {}  # room -> allocation time of its oldest held event
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.frames = Counter(
            "qim_gateway_room_frames_total",
            "Live ROOM_BATCH frames per connection: sent, or dropped (DEGRADED / closing)",
            ["result"],
            registry=registry,
        )
        self.requests = Counter(
            "qim_gateway_room_requests_total",
            "Room frames of clients by kind and outcome at this node",
            ["kind", "result"],
            registry=registry,
        )
        self.latency = Histogram(
            "room_broadcast_latency",
            "RoomWriter allocation -> ROOM_BATCH queued on the socket, ms (24.1.10)",
            buckets=(5, 10, 25, 50, 100, 150, 200, 300, 500, 1000, 2000, 5000),
            registry=registry,
        )

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._flush_loop(), name="room-merge"),
            asyncio.create_task(self._renew_loop(), name="room-targets"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    # -- frames from clients ----------------------------------------------------------------------

    def handle(self, conn: Connection, frame: Frame) -> None:
        grant = conn.session.grant
        if grant is None or conn.closing:
            return
        body = frame.body
        rid = frame.header.request_id
        if isinstance(body, SendMessage):
            room_id, kind = body.conversation_id, "send"
        else:
            assert isinstance(body, RoomJoin | RoomLeave | RoomReplay)
            room_id = body.room_id
            kind = {RoomJoin: "join", RoomLeave: "leave", RoomReplay: "replay"}[type(body)]
        if not is_room_id(room_id):
            self._answer(conn, _denied(rid), rid, kind, "denied")
            return
        room = (grant.tenant_id, room_id)
        member = self.members.is_member(conn.conn_id, room)
        if isinstance(body, RoomLeave):
            self._leave(conn, room, rid)
            return
        if not member and not isinstance(body, RoomJoin):
            self._answer(conn, _denied(rid), rid, kind, "not_member")
            return
        shard = self._shard_of(grant.tenant_id, grant.user_id)
        who = (grant.tenant_id, grant.user_id, grant.device_id, grant.session_epoch)
        tenant, user, device, epoch = who
        request: RoomJoinRequest | RoomReplayRequest | RoomSendRequest
        if isinstance(body, RoomJoin):
            pending = self._pending_joins.setdefault(conn.conn_id, set())
            count = self.members.rooms_of(conn.conn_id) + len(pending)
            if not member and room not in pending and count >= self.max_rooms:
                error = Error(
                    code=int(ErrorCode.RATE_LIMITED),
                    detail="max_rooms_per_connection",
                    request_id=rid,
                )
                self._answer(conn, error, rid, kind, "limit")
                return
            pending.add(room)
            request = RoomJoinRequest(
                tenant_id=tenant, user_id=user, device_id=device, session_epoch=epoch,
                connection_shard=shard, conn_id=conn.conn_id, request_id=rid, room_id=room_id,
                after_room_seq=body.after_room_seq,
            )  # fmt: skip
        elif isinstance(body, RoomReplay):
            request = RoomReplayRequest(
                tenant_id=tenant, user_id=user, device_id=device, session_epoch=epoch,
                connection_shard=shard, conn_id=conn.conn_id, request_id=rid, room_id=room_id,
                after_room_seq=body.after_room_seq,
            )  # fmt: skip
        else:
            request = RoomSendRequest(
                tenant_id=tenant, user_id=user, device_id=device, session_epoch=epoch,
                connection_shard=shard, conn_id=conn.conn_id, request_id=rid, room_id=room_id,
                message=body, received_at_ms=self._clock_ms(),
            )  # fmt: skip
        self._submit(conn, request, rid, kind)

    def _leave(self, conn: Connection, room: RoomKey, rid: int) -> None:
        if not self.members.is_member(conn.conn_id, room):
            self._answer(conn, _denied(rid), rid, "leave", "not_member")
            return
        view = self.merge.view(room)  # before _left: the last member takes the view along
        shard = self._shard_of(room[0], conn.session.grant.user_id) if conn.session.grant else None
        self._left(room, self.members.leave(conn.conn_id, room), shard)
        batch = RoomBatch(
            room_id=room[1],
            room_epoch=view.room_epoch if view else 0,
            latest_room_seq=view.latest_room_seq if view else 0,
        )
        self._answer(conn, batch, rid, "leave", "ok")

    def closed(self, conn: Connection) -> None:
        """The connection is closing: it leaves every room (the implicit ROOM_LEAVE, 14.5)."""
        self._pending_joins.pop(conn.conn_id, None)
        for room, shard in self.members.close(conn.conn_id):
            self._left(room, shard)

    def _left(self, room: RoomKey, emptied_shard: int | None, shard: int | None = None) -> None:
        if emptied_shard is not None:
            self._target(room, emptied_shard, present=False)
        elif shard is not None:  # still members there: say who (a promotion reads it, 14.4)
            self._target(room, shard, present=True)
        if not self.members.has_members(room):
            self.merge.forget(room)

    def _answer(
        self, conn: Connection, body: Error | RoomBatch, rid: int, kind: str, result: str
    ) -> None:
        self.requests.labels(kind=kind, result=result).inc()
        conn.apply([Send(body, request_id=rid, version=conn.session.version)])

    def _submit(
        self,
        conn: Connection,
        request: RoomJoinRequest | RoomReplayRequest | RoomSendRequest,
        rid: int,
        kind: str,
    ) -> None:
        out = self._out(request.tenant_id, request.room_id, request.key, request)

        def done(exc: BaseException | None) -> None:
            if exc is None:
                self.requests.labels(kind=kind, result="forwarded").inc()
                return
            self._refused(conn, request, rid, kind, "kafka")

        if not self.forwarder.submit(out, done, topic=self.topic):
            self._refused(conn, request, rid, kind, "queue_full")

    def _refused(
        self,
        conn: Connection,
        request: RoomJoinRequest | RoomReplayRequest | RoomSendRequest,
        rid: int,
        kind: str,
        reason: str,
    ) -> None:
        if isinstance(request, RoomJoinRequest):
            self._pending_joins.get(conn.conn_id, set()).discard(
                (request.tenant_id, request.room_id)
            )
        if conn.closing or conn.session.closed:
            return
        error = Error(
            code=int(ErrorCode.RATE_LIMITED),
            retry_after_ms=jittered(self.retry_after_ms),
            detail="gateway request queue full"
            if reason == "queue_full"
            else "commit log unavailable",
            request_id=rid,
        )
        self._answer(conn, error, rid, kind, reason)

    def _out(self, tenant: str, room_id: str, key: bytes, record: msgspec.Struct) -> _Out:
        partition = room_partition(tenant, room_id, self.partition_count)
        return _Out(key, encode_room_record(record), partition)

    def _target(self, room: RoomKey, shard: int, *, present: bool) -> None:
        users = self.members.users(room, shard) if present else ()
        record = RoomTargetRequest(
            tenant_id=room[0],
            room_id=room[1],
            connection_shard=shard,
            present=present,
            user_ids=users,
        )

        def done(exc: BaseException | None) -> None:
            if exc is not None:
                log.debug("room target %s/%d not produced: %r", room[1], shard, exc)

        self.forwarder.submit(
            self._out(room[0], room[1], record.key, record), done, topic=self.topic
        )

    # -- records from RoomWriters -----------------------------------------------------------------

    def deliver(self, value: bytes) -> ReplyVerdict:
        try:
            record = decode_room_to_gateway(value)
        except (msgspec.DecodeError, ValueError):
            return ReplyVerdict.MALFORMED
        if isinstance(record, RoomBroadcast):
            return self._broadcast(record)
        return self._reply(record)

    def _reply(self, reply: RoomReply) -> ReplyVerdict:
        room = (reply.tenant_id, reply.room_id)
        conn = self.connections.get(reply.conn_id)
        if reply.action == "join":
            pending = self._pending_joins.get(reply.conn_id)
            if pending is not None:
                pending.discard(room)
        grant = None if conn is None else conn.session.grant
        alive = conn is not None and not conn.closing and not conn.session.closed
        if conn is None or grant is None or not alive:
            if reply.action == "join" and reply.batch is not None:
                self._maybe_unregister(room, reply.connection_shard)
            return ReplyVerdict.NO_SESSION
        if (grant.tenant_id, grant.user_id, grant.device_id) != (
            reply.tenant_id,
            reply.user_id,
            reply.device_id,
        ) or grant.session_epoch != reply.session_epoch:
            return ReplyVerdict.STALE_EPOCH
        batch = reply.batch
        if batch is not None:
            view = RoomView(batch.room_epoch, batch.latest_room_seq, batch.earliest_replay_room_seq)
            self.merge.learn(room, view)
            if reply.action == "join":
                self.members.join(
                    conn.conn_id, room, reply.connection_shard, batch.latest_room_seq, grant.user_id
                )
        body = _with_request_id(reply.body, reply.request_id)
        conn.apply([Send(body, request_id=reply.request_id, version=conn.session.version)])
        self.requests.labels(kind=reply.action, result="answered").inc()
        return ReplyVerdict.DELIVER

    def _maybe_unregister(self, room: RoomKey, shard: int) -> None:
        """A JOIN answered for a connection that is gone: undo its registration if the shard
        has no other member (else the lease would keep broadcasts coming for ttl)."""
        if not any(s == shard for r, s in self.members.shards() if r == room):
            self._target(room, shard, present=False)

    def _broadcast(self, cast: RoomBroadcast) -> ReplyVerdict:
        room = (cast.tenant_id, cast.room_id)
        if not self.members.has_members(room):
            self._maybe_unregister(room, cast.connection_shard)
            return ReplyVerdict.NO_SESSION
        view = RoomView(cast.room_epoch, cast.latest_room_seq, cast.earliest_replay_room_seq)
        first = self.merge.next_due_ms() is None
        if not self.merge.offer(room, view, cast.events, self._clock_ms()):
            return ReplyVerdict.STALE_EPOCH
        if cast.sent_at_ms:
            self._sent_at.setdefault(room, cast.sent_at_ms)  # the window's oldest message
        if first:
            self._wake.set()
        return ReplyVerdict.DELIVER

    # -- the merge window -------------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        while True:
            due = self.merge.next_due_ms()
            if due is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            delay = due - self._clock_ms()
            if delay > 0:
                await asyncio.sleep(delay / 1000)
            try:
                self.flush(self._clock_ms())
            except Exception:
                log.exception("room batches not flushed")

    def flush(self, now_ms: int) -> None:
        """Write every room whose window ended: one ROOM_BATCH per member connection."""
        degraded = FlowState.DEGRADED
        for room, held in self.merge.due(now_ms):
            sent_at = self._sent_at.pop(room, None)
            view = held.view
            for conn_id, floor in self.members.members(room):
                conn = self.connections.get(conn_id)
                if conn is None or conn.closing or conn.session.closed:
                    self.frames.labels(result="closing").inc()
                    continue
                if conn.session.flow_state is degraded:
                    self.frames.labels(result="dropped_degraded").inc()
                    continue
                events = tuple(e for e in held.events if e.room_seq > floor)
                if not events:
                    continue
                batch = RoomBatch(
                    room_id=room[1],
                    room_epoch=view.room_epoch,
                    events=events,
                    latest_room_seq=view.latest_room_seq,
                    earliest_replay_room_seq=view.earliest_replay_room_seq,
                )
                conn.apply([Send(batch, version=conn.session.version)])
                self.members.raise_floor(conn_id, room, events[-1].room_seq)
                self.frames.labels(result="sent").inc()
            if sent_at is not None:
                self.latency.observe(max(0, now_ms - sent_at))

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.renew_ms / 1000)
            for room, shard in self.members.shards():
                self._target(room, shard, present=True)


def _with_request_id(
    body: RoomBatch | SendAck | Error, request_id: int
) -> RoomBatch | SendAck | Error:
    """ERROR and SEND_ACK repeat the header's request_id in the body (A.4 #6, #21)."""
    if isinstance(body, SendAck | Error) and body.request_id == 0 and request_id:
        return msgspec.structs.replace(body, request_id=request_id)
    return body
