"""The RoomWriter's decisions for one fetch of room requests (spec 14.1, 14.2, 14.3, 14.5).

Pure: decoded requests, the room definitions and the time in; RoomRecords for the Room Log,
one :class:`RoomBroadcast` per (room, ConnectionShard with a member) and the replies out. The
agent (``qim.agents.rooms``) does the Kafka I/O around it.

* ROOM_JOIN: the room must exist and admit the user, else ``ERROR{PERMISSION_DENIED}`` with
  no detail -- the very same body for "no such room" and "not for you" (14.5). Then the
  connection's shard is registered as a target and the answer is the room's positions (and a
  replay when the JOIN names ``after_room_seq``).
* ROOM_REPLAY: the room's ring (``ring.RoomRing.replay``); a room deleted meanwhile answers
  PERMISSION_DENIED like a JOIN.
* SEND_MESSAGE into a room: permission, a retried ``client_message_id`` is answered with its
  first SEND_ACK, then ``room_msg_rate`` (``ERROR{RATE_LIMITED, retry_after_ms}``, up front),
  then ``message_id`` (HLC of this writer) and ``room_seq``. SEND_ACK carries the
  ``message_id``; ``conversation_seq`` stays 0 -- a room message has none (14.1) -- and the
  sender sees its ``room_seq`` in the ROOM_BATCH that carries it.
* the broadcast of a fetch: every room that got messages is sent once to each live target,
  whatever the number of connections behind it (14.1).

``room_epoch``: a room starts at the epoch given by ``next_epoch`` (its last epoch in the
retained Room Log + 1 when a writer takes the partition over, 1 for a room never seen), so a
restart or a move is an epoch change the clients see (I-28, acceptance 38).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from qim.core.rooms.admission import RoomAdmission
from qim.core.rooms.ring import RoomRing
from qim.core.rooms.targets import RoomTargets
from qim.schemas.frames import Error, ErrorCode, RoomBatch, RoomEvent, SendAck
from qim.schemas.ids import message_id_to_bytes
from qim.schemas.records.requests import AdminReply
from qim.schemas.records.rooms import (
    ReplyAction,
    RoomBroadcast,
    RoomDefinition,
    RoomJoinRequest,
    RoomPromoteRequest,
    RoomRecord,
    RoomReplayRequest,
    RoomReply,
    RoomRequest,
    RoomSendRequest,
    RoomTargetRequest,
)

__all__ = ["RoomConfig", "RoomKey", "RoomOutput", "RoomWriterCore"]

RoomKey: TypeAlias = tuple[str, str]  # tenant_id, room_id


@dataclass(frozen=True, slots=True)
class RoomConfig:
    msg_rate_count: int = 20  # room_msg_rate
    msg_rate_period_ms: int = 1000
    retention_ms: int = 30 * 60_000  # room_log_retention_minutes
    max_records: int = 10_000  # the ring's count cap (7.12; ours)
    target_ttl_ms: int = 30_000  # a target registration not renewed by then ends
    replay_limit: int = 500  # events per replay batch; the client asks on from the last


@dataclass(slots=True)
class RoomOutput:
    records: list[RoomRecord] = field(default_factory=list)
    broadcasts: list[RoomBroadcast] = field(default_factory=list)
    replies: list[RoomReply] = field(default_factory=list)
    admin_replies: list[AdminReply] = field(default_factory=list)
    rate_limited: list[RoomKey] = field(default_factory=list)
    truncated_replays: int = 0
    replays: int = 0


def denied(request_id: int) -> Error:
    """One body for "no such room" and "not allowed" (14.5)."""
    return Error(code=int(ErrorCode.PERMISSION_DENIED), request_id=request_id)


class RoomWriterCore:
    """The rooms of the partitions one RoomWriter owns."""

    def __init__(
        self,
        config: RoomConfig,
        definitions: Mapping[RoomKey, RoomDefinition],
        next_message_id: Callable[[RoomKey, int], int],
    ) -> None:
        self.config = config
        self.definitions = definitions
        self._next_message_id = next_message_id  # (room, wall ms) -> a fresh message_id (HLC)
        self.rings: dict[RoomKey, RoomRing] = {}
        self.admission: dict[RoomKey, RoomAdmission] = {}
        self.targets: RoomTargets[RoomKey] = RoomTargets(config.target_ttl_ms)
        self.next_epoch: dict[RoomKey, int] = {}
        self.online: dict[RoomKey, dict[int, set[str]]] = {}  # room -> shard -> users
        self.promoted: set[RoomKey] = set()  # room_seq allocation stopped (14.4)

    def ring(self, room: RoomKey) -> RoomRing:
        ring = self.rings.get(room)
        if ring is None:
            cfg = self.config
            epoch = self.next_epoch.get(room, 1)
            ring = self.rings[room] = RoomRing(epoch, cfg.retention_ms, cfg.max_records)
        return ring

    def forget(self, keep: Callable[[RoomKey], bool]) -> None:
        """Drop the rooms ``keep`` rejects (their partition was revoked)."""
        for room in [r for r in self.rings if not keep(r)]:
            del self.rings[room]
        for room in [r for r in self.admission if not keep(r)]:
            del self.admission[room]
        for room in [r for r in self.online if not keep(r)]:
            del self.online[room]
        self.targets.drop({r for r in self.targets.rooms() if keep(r)})

    def handle(self, requests: Sequence[RoomRequest], now_ms: int) -> RoomOutput:
        out = RoomOutput()
        fresh: dict[RoomKey, list[RoomEvent]] = {}
        for request in requests:
            room = (request.tenant_id, request.room_id)
            if isinstance(request, RoomTargetRequest):
                shards = self.online.setdefault(room, {})
                if request.present:
                    self.targets.register(room, request.connection_shard, now_ms)
                    shards[request.connection_shard] = set(request.user_ids)
                else:
                    self.targets.deregister(room, request.connection_shard)
                    shards.pop(request.connection_shard, None)
            elif isinstance(request, RoomPromoteRequest):
                self._promote(room, request, now_ms, out)
            elif isinstance(request, RoomJoinRequest):
                self._join(room, request, now_ms, out)
            elif isinstance(request, RoomReplayRequest):
                self._replay(room, request, now_ms, out)
            else:
                self._send(room, request, now_ms, out, fresh)
        for room, records in fresh.items():
            self._broadcast(room, records, now_ms, out)
        return out

    # -- requests -------------------------------------------------------------------------------

    def _admits(self, room: RoomKey, user_id: str) -> bool:
        if room in self.promoted:
            return False
        definition = self.definitions.get(room)
        return definition is not None and definition.admits(user_id)

    def online_users(self, room: RoomKey, now_ms: int) -> tuple[str, ...]:
        """The users with a connection in the room, on the shards whose lease is live."""
        shards = self.online.get(room, {})
        live = self.targets.shards(room, now_ms)
        return tuple(sorted({u for s in live for u in shards.get(s, ())}))

    def _promote(
        self, room: RoomKey, req: RoomPromoteRequest, now_ms: int, out: RoomOutput
    ) -> None:
        """14.4: the online members become the group's initial members (the admin plane
        creates it); from now on the room allocates no room_seq -- it answers like a room
        that does not exist."""
        to = req.reply_to
        if room not in self.promoted and room not in self.definitions:
            reply = AdminReply(
                node_id=to.node_id, correlation_id=to.correlation_id, error=denied(0)
            )
            out.admin_replies.append(reply)
            return
        members = self.online_users(room, now_ms)
        self.promoted.add(room)
        out.admin_replies.append(
            AdminReply(
                node_id=to.node_id,
                correlation_id=to.correlation_id,
                member_ids=members,
                member_count=len(members),
            )
        )

    def _join(self, room: RoomKey, req: RoomJoinRequest, now_ms: int, out: RoomOutput) -> None:
        if not self._admits(room, req.user_id):
            out.replies.append(_reply(req, "join", error=denied(req.request_id)))
            return
        self.targets.register(room, req.connection_shard, now_ms)
        self.online.setdefault(room, {}).setdefault(req.connection_shard, set()).add(req.user_id)
        ring = self.ring(room)
        events: tuple[RoomEvent, ...] = ()
        truncated = False
        if req.after_room_seq is not None:
            got = ring.replay(req.after_room_seq, now_ms, self.config.replay_limit)
            events, truncated = got.events, got.truncated
            out.replays += 1
            out.truncated_replays += truncated
        batch = self._batch(req.room_id, ring, events, truncated)
        out.replies.append(_reply(req, "join", batch=batch))

    def _replay(self, room: RoomKey, req: RoomReplayRequest, now_ms: int, out: RoomOutput) -> None:
        if not self._admits(room, req.user_id):
            out.replies.append(_reply(req, "replay", error=denied(req.request_id)))
            return
        ring = self.ring(room)
        got = ring.replay(req.after_room_seq, now_ms, self.config.replay_limit)
        out.replays += 1
        out.truncated_replays += got.truncated
        batch = self._batch(req.room_id, ring, got.events, got.truncated)
        out.replies.append(_reply(req, "replay", batch=batch))

    def _send(
        self,
        room: RoomKey,
        req: RoomSendRequest,
        now_ms: int,
        out: RoomOutput,
        fresh: dict[RoomKey, list[RoomEvent]],
    ) -> None:
        rid = req.request_id
        msg = req.message
        if not self._admits(room, req.user_id):
            out.replies.append(_reply(req, "send", error=denied(rid)))
            return
        ring = self.ring(room)
        earlier = ring.duplicate(req.user_id, msg.client_message_id)
        if earlier is not None:
            out.replies.append(_reply(req, "send", send_ack=_ack(rid, msg.client_message_id,
                                                                 earlier.message_id)))  # fmt: skip
            return
        gate = self.admission.get(room)
        if gate is None:
            cfg = self.config
            gate = self.admission[room] = RoomAdmission(cfg.msg_rate_count, cfg.msg_rate_period_ms)
        # the client's pace: when its gateway read the frame (never later than now, whatever
        # the gateway's clock says); a request without the stamp is judged on arrival
        at = min(req.received_at_ms, now_ms) if req.received_at_ms else now_ms
        retry_after = gate.admit(at)
        if retry_after is not None:
            error = Error(
                code=int(ErrorCode.RATE_LIMITED),
                retry_after_ms=retry_after,
                detail="room_msg_rate",
                request_id=rid,
            )
            out.replies.append(_reply(req, "send", error=error))
            out.rate_limited.append(room)
            return
        message_id = message_id_to_bytes(self._next_message_id(room, now_ms))
        event = ring.append(
            message_id=message_id,
            sender_id=req.user_id,
            message_type=msg.message_type,
            payload=msg.payload,
            created_at=now_ms,
            now_ms=now_ms,
            client_message_id=msg.client_message_id,
        )
        record = RoomRecord(
            tenant_id=req.tenant_id,
            room_id=req.room_id,
            room_epoch=ring.room_epoch,
            room_seq=event.room_seq,
            message_id=message_id,
            sender_id=req.user_id,
            message_type=msg.message_type,
            payload=msg.payload,
            created_at=now_ms,
            client_message_id=msg.client_message_id,
        )
        out.records.append(record)
        fresh.setdefault(room, []).append(event)
        ack = _ack(rid, msg.client_message_id, message_id)
        out.replies.append(_reply(req, "send", send_ack=ack))

    def _broadcast(
        self, room: RoomKey, records: list[RoomEvent], now_ms: int, out: RoomOutput
    ) -> None:
        ring = self.rings[room]
        events = tuple(records)
        for shard in self.targets.shards(room, now_ms):
            out.broadcasts.append(
                RoomBroadcast(
                    tenant_id=room[0],
                    room_id=room[1],
                    room_epoch=ring.room_epoch,
                    connection_shard=shard,
                    events=events,
                    latest_room_seq=ring.latest_room_seq,
                    earliest_replay_room_seq=ring.earliest_replay_room_seq,
                    sent_at_ms=now_ms,
                )
            )

    def _batch(
        self, room_id: str, ring: RoomRing, events: tuple[RoomEvent, ...], truncated: bool
    ) -> RoomBatch:
        return RoomBatch(
            room_id=room_id,
            room_epoch=ring.room_epoch,
            events=events,
            latest_room_seq=ring.latest_room_seq,
            earliest_replay_room_seq=ring.earliest_replay_room_seq,
            replay_truncated=truncated,
        )


def _ack(request_id: int, client_message_id: str, message_id: bytes) -> SendAck:
    return SendAck(request_id=request_id, client_message_id=client_message_id,
                   message_id=message_id)  # fmt: skip


def _reply(
    req: RoomJoinRequest | RoomReplayRequest | RoomSendRequest,
    action: ReplyAction,
    *,
    batch: RoomBatch | None = None,
    send_ack: SendAck | None = None,
    error: Error | None = None,
) -> RoomReply:
    return RoomReply(
        tenant_id=req.tenant_id,
        user_id=req.user_id,
        device_id=req.device_id,
        session_epoch=req.session_epoch,
        connection_shard=req.connection_shard,
        conn_id=req.conn_id,
        request_id=req.request_id,
        room_id=req.room_id,
        action=action,
        batch=batch,
        send_ack=send_ack,
        error=error,
    )
