"""One room's short log at its RoomWriter: ``room_seq``, retention, replay (14.3, 14.5, 7.12).

``room_seq = compose_room_seq(room_epoch, counter)`` (spec 6.6): the counter is contiguous
within an epoch, so a client finds a gap by comparing ``latest_room_seq`` with what it holds.
Records are kept for ``room_log_retention_minutes`` and at most ``max_records`` (the count cap
of 7.12); what is older has left the replay window.

Positions of the JOIN answer:

* ``latest_room_seq``: the last allocated seq (``compose(epoch, 0)`` before the first message);
* ``earliest_replay_room_seq``: the smallest ``after_room_seq`` a replay can serve completely,
  i.e. the first retained record's seq minus one (``latest`` when nothing is retained). A.4
  says replay is worth asking for iff ``after_room_seq >= earliest_replay_room_seq``.

Replay of ``after_room_seq``: inside the window -> the retained records after it (at most
``limit``; the client asks again from the last one it got), ``replay_truncated=false``. Outside
it -- below the window, another ``room_epoch`` (the writer restarted or the room moved), or
beyond ``latest`` -- an empty batch with ``replay_truncated=true`` and the current watermark:
never an ERROR, the client jumps to ``latest_room_seq`` (14.3).

A retried SEND_MESSAGE (same sender and ``client_message_id``) while its record is retained
returns that record instead of a second message.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from qim.schemas.frames.room import RoomEvent
from qim.schemas.seqs import MAX_COUNTER, compose_room_seq, split_room_seq

__all__ = ["Replay", "RoomRing", "RoomStored"]


@dataclass(frozen=True, slots=True)
class RoomStored:
    """A retained record: the event as clients see it, and who sent it under which id."""

    event: RoomEvent
    kept_at_ms: int
    client_message_id: str = ""


@dataclass(frozen=True, slots=True)
class Replay:
    events: tuple[RoomEvent, ...]
    truncated: bool


@dataclass(slots=True)
class RoomRing:
    """The log of one room in one ``room_epoch``."""

    room_epoch: int
    retention_ms: int
    max_records: int
    counter: int = 0
    records: deque[RoomStored] = field(default_factory=deque)
    _by_client: dict[tuple[str, str], RoomStored] = field(default_factory=dict)

    def __post_init__(self) -> None:
        compose_room_seq(self.room_epoch, 0)  # validates the epoch
        if self.retention_ms < 1 or self.max_records < 1:
            raise ValueError("retention and the record cap must be positive")

    @property
    def latest_room_seq(self) -> int:
        return compose_room_seq(self.room_epoch, self.counter)

    @property
    def earliest_replay_room_seq(self) -> int:
        if not self.records:
            return self.latest_room_seq
        return self.records[0].event.room_seq - 1

    def duplicate(self, sender_id: str, client_message_id: str) -> RoomEvent | None:
        """The retained record of an earlier send with this id, if any."""
        if not client_message_id:
            return None
        stored = self._by_client.get((sender_id, client_message_id))
        return None if stored is None else stored.event

    def append(
        self,
        *,
        message_id: bytes,
        sender_id: str,
        message_type: int,
        payload: bytes,
        created_at: int,
        now_ms: int,
        client_message_id: str = "",
    ) -> RoomEvent:
        """Allocate the next ``room_seq`` and keep the record."""
        if self.counter >= MAX_COUNTER:
            raise OverflowError("room_seq counter exhausted in this epoch")
        self.counter += 1
        event = RoomEvent(
            room_seq=compose_room_seq(self.room_epoch, self.counter),
            message_id=message_id,
            sender_id=sender_id,
            message_type=message_type,
            payload=payload,
            created_at=created_at,
        )
        stored = RoomStored(event, now_ms, client_message_id)
        self.records.append(stored)
        if client_message_id:
            self._by_client[(sender_id, client_message_id)] = stored
        self.expire(now_ms)
        return event

    def expire(self, now_ms: int) -> None:
        """Drop what is older than the retention or beyond the count cap."""
        horizon = now_ms - self.retention_ms
        records = self.records
        while records and (len(records) > self.max_records or records[0].kept_at_ms <= horizon):
            gone = records.popleft()
            if gone.client_message_id:
                key = (gone.event.sender_id, gone.client_message_id)
                if self._by_client.get(key) is gone:
                    del self._by_client[key]

    def replay(self, after_room_seq: int, now_ms: int, limit: int) -> Replay:
        """The records after ``after_room_seq`` if it is inside the window (module docstring)."""
        self.expire(now_ms)
        try:
            epoch, _ = split_room_seq(after_room_seq)
        except (TypeError, ValueError):
            return Replay((), True)
        latest = self.latest_room_seq
        if epoch != self.room_epoch or not (
            self.earliest_replay_room_seq <= after_room_seq <= latest
        ):
            return Replay((), True)
        if after_room_seq == latest:
            return Replay((), False)
        first = after_room_seq - self.earliest_replay_room_seq  # index of seq after_room_seq+1
        records = self.records
        stop = min(len(records), first + max(1, limit))
        return Replay(tuple(records[i].event for i in range(first, stop)), False)

    def idle(self, now_ms: int) -> bool:
        """Nothing retained any more (every record left the window)."""
        self.expire(now_ms)
        return not self.records
