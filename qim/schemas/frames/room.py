"""Chatroom frames, opcodes 0x0500-0x05FF: ROOM_JOIN, ROOM_LEAVE, ROOM_REPLAY, ROOM_BATCH."""

from __future__ import annotations

from qim.schemas.frames.base import U8, U16, U64, U128, U128_ZERO, Body

__all__ = ["RoomBatch", "RoomEvent", "RoomJoin", "RoomLeave", "RoomReplay"]


class RoomJoin(Body):
    """ROOM_JOIN (A.3 #13): ``after_room_seq`` None = join at the live edge, no replay."""

    room_id: str = ""
    after_room_seq: U64 | None = None


class RoomLeave(Body):
    """ROOM_LEAVE (A.3 #14)."""

    room_id: str = ""


class RoomReplay(Body):
    """ROOM_REPLAY (A.3 #15)."""

    room_id: str = ""
    after_room_seq: U64 = 0


class RoomEvent(Body):
    """One ``ROOM_BATCH.events[]`` item: the §7 RoomRecord columns a client renders.

    A.4 gives only ``{room_seq, ...}``; the rest is this codec's choice.
    """

    room_seq: U64 = 0
    message_id: U128 = U128_ZERO
    sender_id: str = ""
    message_type: U8 = 0
    payload: bytes = b""
    created_at: U64 = 0


class RoomBatch(Body):
    """ROOM_BATCH (A.4 #14): replay past retention = empty events + replay_truncated (no ERROR)."""

    room_id: str = ""
    room_epoch: U16 = 0  # u15 in §6.6
    events: tuple[RoomEvent, ...] = ()
    latest_room_seq: U64 = 0
    earliest_replay_room_seq: U64 = 0
    replay_truncated: bool = False
