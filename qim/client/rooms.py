# ruff: noqa: ASYNC109  # timeout= is the reply deadline of one request (see client.py)
"""Chatrooms in the SDK (spec 14): join, leave, send, gap detection and replay.

A room subscription belongs to the connection (14.5): after a reconnect or a REDIRECT the app
joins again, and :class:`RoomTracker` decides from the JOIN answer between replay and a jump.

Gap detection (14.3): per room the tracker keeps ``room_epoch`` and ``applied``, the last
``room_seq`` up to which it holds every event. A batch whose events do not continue at
``applied + 1`` (or whose ``latest_room_seq`` is beyond what it carries) has a gap; the events
after the gap are held, and :meth:`RoomCalls.room_batch` asks ``ROOM_REPLAY{after_room_seq =
applied}``. A replay answered ``replay_truncated=true`` (outside the window), or a batch of
another ``room_epoch`` (the room restarted or moved), makes the tracker jump to
``latest_room_seq`` and report ``lost=True``: **chatrooms may lose messages** -- show "some
messages not shown", never pretend completeness. ``room_seq`` orders nothing but the room's
own events (6.9.4); a ``message_id`` already delivered is never delivered twice.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from qim.schemas.frames import Body, RoomBatch, SendAck, SendMessage
from qim.schemas.frames.room import RoomEvent, RoomJoin, RoomLeave, RoomReplay
from qim.schemas.seqs import split_room_seq

__all__ = ["RoomCalls", "RoomDelivery", "RoomTracker"]


@dataclass(frozen=True, slots=True)
class RoomDelivery:
    """What a batch gave the app: new events in ``room_seq`` order, and whether some are
    missing (``gap``: a replay is needed) or lost for good (``lost``: the tracker jumped)."""

    room_id: str
    events: tuple[RoomEvent, ...]
    gap: bool = False
    lost: bool = False


@dataclass(slots=True)
class _Room:
    epoch: int
    applied: int
    held: dict[int, RoomEvent] = field(default_factory=dict)
    seen_ids: set[bytes] = field(default_factory=set)


class RoomTracker:
    """Per joined room: epoch, the contiguous position, events held behind a gap. Pure."""

    def __init__(self) -> None:
        self._rooms: dict[str, _Room] = {}

    def joined(self, batch: RoomBatch) -> RoomDelivery:
        """A JOIN answer: a new epoch (or a first join) starts at ``latest_room_seq``."""
        room = self._rooms.get(batch.room_id)
        if room is None or room.epoch != batch.room_epoch or room.applied > batch.latest_room_seq:
            room = self._rooms[batch.room_id] = _Room(batch.room_epoch, batch.latest_room_seq)
        return self._take(batch.room_id, room, batch)

    def left(self, room_id: str) -> None:
        self._rooms.pop(room_id, None)

    def applied(self, room_id: str) -> int | None:
        room = self._rooms.get(room_id)
        return None if room is None else room.applied

    def is_joined(self, room_id: str) -> bool:
        return room_id in self._rooms

    def apply(self, batch: RoomBatch) -> RoomDelivery:
        """A live batch or a replay answer."""
        room = self._rooms.get(batch.room_id)
        if room is None:  # not joined (any more): nothing to deliver
            return RoomDelivery(batch.room_id, ())
        if batch.room_epoch != room.epoch:  # 14.3: drop the local state, start from latest
            fresh = _Room(batch.room_epoch, batch.latest_room_seq, seen_ids=room.seen_ids)
            self._rooms[batch.room_id] = fresh
            events = self._fresh(fresh, batch.events)
            return RoomDelivery(batch.room_id, events, lost=True)
        if batch.replay_truncated:  # outside the window: jump to the watermark
            target = max(batch.latest_room_seq, max(room.held, default=0))
            events = self._release(room, sorted(room.held.values(), key=_seq))
            room.held.clear()
            room.applied = max(room.applied, target)
            return RoomDelivery(batch.room_id, events, lost=True)
        return self._take(batch.room_id, room, batch)

    def replayed(self, batch: RoomBatch) -> RoomDelivery:
        """A ROOM_REPLAY answer: like a live batch, and events at or below the position the
        tracker already holds (the app asked from further back, e.g. after a rejoin that
        jumped) are delivered too, unless their ``message_id`` was delivered before."""
        room = self._rooms.get(batch.room_id)
        if room is None or batch.replay_truncated or batch.room_epoch != room.epoch:
            return self.apply(batch)
        back = [e for e in batch.events if e.room_seq <= room.applied]
        earlier = self._release(room, back)
        later = self._take(batch.room_id, room, batch)
        return RoomDelivery(batch.room_id, earlier + later.events, gap=later.gap)

    def _take(self, room_id: str, room: _Room, batch: RoomBatch) -> RoomDelivery:
        for event in batch.events:
            if event.room_seq > room.applied:
                room.held[event.room_seq] = event
        out: list[RoomEvent] = []
        while room.applied + 1 in room.held:
            event = room.held.pop(room.applied + 1)
            room.applied = event.room_seq
            out.extend(self._release(room, [event]))
        horizon = max(batch.latest_room_seq, max(room.held, default=0))
        gap = horizon > room.applied and _same_epoch(horizon, room.epoch)
        return RoomDelivery(room_id, tuple(out), gap=gap)

    def _fresh(self, room: _Room, events: tuple[RoomEvent, ...]) -> tuple[RoomEvent, ...]:
        """Events of a batch that opened a new epoch: delivered, nothing to fill before them."""
        got = self._release(room, [e for e in events if _same_epoch(e.room_seq, room.epoch)])
        room.applied = max([room.applied, *(e.room_seq for e in got)])
        return got

    @staticmethod
    def _release(room: _Room, events: list[RoomEvent]) -> tuple[RoomEvent, ...]:
        out = []
        for event in events:
            if event.message_id in room.seen_ids:
                continue  # a duplicate (a send processed twice across a writer takeover)
            room.seen_ids.add(event.message_id)
            out.append(event)
        if len(room.seen_ids) > 50_000:  # bounded: ids far behind can no longer come back
            room.seen_ids = {e.message_id for e in out}
        return tuple(out)


def _seq(event: RoomEvent) -> int:
    return event.room_seq


def _same_epoch(room_seq: int, epoch: int) -> bool:
    try:
        return split_room_seq(room_seq).room_epoch == epoch
    except ValueError:
        return False


class RoomCalls:
    """Mixin of :class:`~qim.client.QimClient`: the room frames and the tracker."""

    rooms: RoomTracker

    async def _call(self, body: Body, reply: type[Body], timeout: float | None) -> Body:
        raise NotImplementedError

    async def join_room(
        self, room_id: str, *, after_room_seq: int | None = None, timeout: float | None = None
    ) -> RoomDelivery:
        """ROOM_JOIN -> ROOM_BATCH{room_epoch, latest_room_seq, earliest_replay_room_seq}.

        Idempotent; raises QimError PERMISSION_DENIED (no such room or not allowed: the server
        does not say which) or RATE_LIMITED (``max_rooms_per_connection``). With
        ``after_room_seq`` the answer also replays what followed it, inside the window."""
        batch = await self._call(RoomJoin(room_id=room_id, after_room_seq=after_room_seq),
                                 RoomBatch, timeout)  # fmt: skip
        assert isinstance(batch, RoomBatch)
        self.last_join = batch
        return self.rooms.joined(batch)

    last_join: RoomBatch | None = None
    """The last JOIN answer (its ``earliest_replay_room_seq`` says how far back replay goes)."""

    async def leave_room(self, room_id: str, *, timeout: float | None = None) -> RoomBatch:
        """ROOM_LEAVE -> ROOM_BATCH{room_id, latest_room_seq} (no events)."""
        batch = await self._call(RoomLeave(room_id=room_id), RoomBatch, timeout)
        assert isinstance(batch, RoomBatch)
        self.rooms.left(room_id)
        return batch

    async def send_room(
        self,
        room_id: str,
        payload: bytes,
        *,
        message_type: int = 0,
        client_message_id: str | None = None,
        timeout: float | None = None,
    ) -> SendAck:
        """SEND_MESSAGE into a joined room -> SEND_ACK{message_id} (``conversation_seq`` 0:
        a room message has none; its ``room_seq`` arrives with the ROOM_BATCH that carries it).
        QimError RATE_LIMITED with ``retry_after_ms`` above ``room_msg_rate``."""
        body = SendMessage(
            client_message_id=client_message_id or uuid.uuid4().hex,
            conversation_id=room_id,
            message_type=message_type,
            payload=payload,
        )
        ack = await self._call(body, SendAck, timeout)
        assert isinstance(ack, SendAck)
        return ack

    async def replay_room(
        self, room_id: str, after_room_seq: int | None = None, *, timeout: float | None = None
    ) -> RoomDelivery:
        """ROOM_REPLAY{after_room_seq} (default: where the tracker's contiguous events end),
        applied to the tracker: filled events, or ``lost=True`` when outside the window."""
        after = self.rooms.applied(room_id) if after_room_seq is None else after_room_seq
        batch = await self._call(RoomReplay(room_id=room_id, after_room_seq=after or 0),
                                 RoomBatch, timeout)  # fmt: skip
        assert isinstance(batch, RoomBatch)
        return self.rooms.replayed(batch)

    async def room_batch(self, batch: RoomBatch, *, max_replays: int = 20) -> RoomDelivery:
        """A live ROOM_BATCH from :meth:`events`: its new events, with any gap replayed
        (ROOM_REPLAY from the last contiguous event until filled, or a jump if outside)."""
        got = self.rooms.apply(batch)
        events, lost = list(got.events), got.lost
        replays = 0
        while got.gap and replays < max_replays:
            replays += 1
            got = await self.replay_room(batch.room_id)
            events.extend(got.events)
            lost = lost or got.lost
        return RoomDelivery(batch.room_id, tuple(events), gap=got.gap, lost=lost)
