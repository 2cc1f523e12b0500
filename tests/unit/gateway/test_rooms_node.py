"""The ConnectionNode's chatrooms with an in-memory producer (spec 14.1, 14.2, 14.5).

A JOIN leaves for the room's RoomWriter and its answer makes the connection a member; a
RoomBroadcast of one ConnectionShard becomes one merged ROOM_BATCH per member; LEAVE and REPLAY
of a non-member are PERMISSION_DENIED; a closed connection leaves every room and the shard's
last leave deregisters it; more than max_rooms_per_connection is RATE_LIMITED; every ROOM_*
frame is served (never "not offered") once rooms are on.
"""

from __future__ import annotations

from typing import Any

import pytest

from qim.core.rooms.ids import room_partition
from qim.gateway.transport.connection import Connection
from qim.schemas.frames import Error, ErrorCode, Frame, RoomBatch, encode_frame
from qim.schemas.frames.opcodes import FRAMES_BY_NAME, Role
from qim.schemas.frames.room import RoomEvent, RoomJoin, RoomLeave, RoomReplay
from qim.schemas.records.rooms import (
    RoomBroadcast,
    RoomJoinRequest,
    RoomReply,
    RoomTargetRequest,
    decode_room_request,
    encode_room_record,
)
from qim.schemas.seqs import compose_room_seq
from tests.gateway_support import wait_until
from tests.unit.gateway.test_router import COUNT, Harness, Pipe, harness

ROOMS: dict[str, Any] = {"rooms": True, "room_partition_count": COUNT}
ROOM = "r:live"


def room_requests(h: Harness) -> list[Any]:
    return [decode_room_request(v) for t, _, v, _ in h.producer.sent if t == "qim.room-requests"]


async def joined(h: Harness, conn: Connection, pipe: Pipe, rid: int = 7) -> RoomJoinRequest:
    """JOIN, and answer it as the RoomWriter would."""
    before = len(room_requests(h))
    conn.feed_message(encode_frame(RoomJoin(room_id=ROOM), rid))
    await wait_until(lambda: len(room_requests(h)) > before)
    request = room_requests(h)[-1]
    assert isinstance(request, RoomJoinRequest)
    batch = RoomBatch(room_id=ROOM, room_epoch=1, latest_room_seq=compose_room_seq(1, 2),
                      earliest_replay_room_seq=compose_room_seq(1, 0))  # fmt: skip
    reply = RoomReply(
        tenant_id=request.tenant_id, user_id=request.user_id, device_id=request.device_id,
        session_epoch=request.session_epoch, connection_shard=request.connection_shard,
        conn_id=request.conn_id, request_id=rid, room_id=ROOM, action="join", batch=batch,
    )  # fmt: skip
    h.router.deliver(encode_room_record(reply))
    await wait_until(lambda: any(f.header.request_id == rid for f in pipe.frames))
    return request


def batches(pipe: Pipe) -> list[RoomBatch]:
    return [f.body for f in pipe.frames if isinstance(f.body, RoomBatch)]


async def test_a_join_goes_to_the_rooms_partition_and_its_answer_makes_a_member() -> None:
    async with harness(**ROOMS) as h:
        conn, pipe = await h.online()
        request = await joined(h, conn, pipe)
        _, _, _, partition = next(s for s in h.producer.sent if s[0] == "qim.room-requests")
        assert partition == room_partition("t1", ROOM, COUNT)
        assert (request.user_id, request.room_id, request.conn_id) == ("alice", ROOM, conn.conn_id)
        [answer] = batches(pipe)
        assert answer.latest_room_seq == compose_room_seq(1, 2)
        assert h.router.rooms is not None and h.router.rooms.members.is_member(
            conn.conn_id, ("t1", ROOM)
        )


async def test_a_shard_broadcast_is_one_merged_batch_per_member_above_its_join_position() -> None:
    async with harness(**ROOMS) as h:
        a, pipe_a = await h.online("alice")
        b, pipe_b = await h.online("bob")
        req = await joined(h, a, pipe_a, 7)
        await joined(h, b, pipe_b, 8)
        for counter in (2, 3, 4):  # 2 is at the join position: never sent again
            event = RoomEvent(
                room_seq=compose_room_seq(1, counter), message_id=bytes([counter]) * 16
            )
            cast = RoomBroadcast(
                tenant_id="t1", room_id=ROOM, room_epoch=1, connection_shard=req.connection_shard,
                events=(event,), latest_room_seq=event.room_seq,
                earliest_replay_room_seq=compose_room_seq(1, 0),
            )  # fmt: skip
            h.router.deliver(encode_room_record(cast))
        await wait_until(lambda: len(batches(pipe_a)) == 2 and len(batches(pipe_b)) == 2)
        for pipe in (pipe_a, pipe_b):
            live = batches(pipe)[1]
            assert [e.room_seq for e in live.events] == [compose_room_seq(1, c) for c in (3, 4)]
            assert live.latest_room_seq == compose_room_seq(1, 4)
            assert [f for f in pipe.frames if isinstance(f.body, RoomBatch)][
                1
            ].header.stream_id == 3


async def test_leave_and_replay_of_a_non_member_are_denied_and_leave_acknowledges() -> None:
    async with harness(**ROOMS) as h:
        conn, pipe = await h.online()
        conn.feed_message(encode_frame(RoomLeave(room_id=ROOM), 3))
        conn.feed_message(encode_frame(RoomReplay(room_id=ROOM, after_room_seq=1), 4))
        await wait_until(lambda: len([b for b in pipe.bodies() if isinstance(b, Error)]) == 2)
        errors = [b for b in pipe.bodies() if isinstance(b, Error)]
        assert {e.code for e in errors} == {int(ErrorCode.PERMISSION_DENIED)}
        assert {e.request_id for e in errors} == {3, 4} and all(not e.detail for e in errors)
        assert room_requests(h) == []  # answered here, no writer asked
        await joined(h, conn, pipe, 5)
        conn.feed_message(encode_frame(RoomLeave(room_id=ROOM), 6))
        await wait_until(lambda: any(f.header.request_id == 6 for f in pipe.frames))
        ack = next(f.body for f in pipe.frames if f.header.request_id == 6)
        assert isinstance(ack, RoomBatch) and ack.events == ()
        assert ack.latest_room_seq == compose_room_seq(1, 2)
        await wait_until(lambda: any(isinstance(r, RoomTargetRequest) for r in room_requests(h)))
        [gone] = [r for r in room_requests(h) if isinstance(r, RoomTargetRequest)]
        assert not gone.present  # the shard's last member left: deregistered


async def test_a_closed_connection_leaves_every_room() -> None:
    async with harness(**ROOMS) as h:
        conn, pipe = await h.online()
        await joined(h, conn, pipe)
        rooms = h.router.rooms
        assert rooms is not None
        conn.apply(conn.session.peer_closed(0))
        await wait_until(lambda: not rooms.members.has_members(("t1", ROOM)))
        await wait_until(lambda: any(isinstance(r, RoomTargetRequest) for r in room_requests(h)))


async def test_more_rooms_than_max_rooms_per_connection_is_rate_limited() -> None:
    async with harness(**ROOMS) as h:
        conn, pipe = await h.online()
        for i in range(21):
            conn.feed_message(encode_frame(RoomJoin(room_id=f"r:{i}"), 100 + i))
        await wait_until(lambda: any(isinstance(b, Error) for b in pipe.bodies()))
        [error] = [b for b in pipe.bodies() if isinstance(b, Error)]
        assert error.code == int(ErrorCode.RATE_LIMITED) and error.request_id == 120
        assert error.detail == "max_rooms_per_connection"
        assert len(room_requests(h)) == 20


ROOM_FRAMES = sorted(n for n in FRAMES_BY_NAME if n.startswith("ROOM_") and n != "ROOM_BATCH")


@pytest.mark.parametrize("name", ROOM_FRAMES)
async def test_room_frames_are_served_not_answered_as_not_offered(name: str) -> None:
    model = FRAMES_BY_NAME[name].model_sent_by(Role.CLIENT)
    assert model is not None
    async with harness(**ROOMS) as h:
        conn, pipe = await h.online()
        conn.feed_message(encode_frame(model(room_id=ROOM), 77))
        await wait_until(
            lambda: any(f.header.request_id == 77 for f in pipe.frames) or bool(room_requests(h))
        )
        for frame in pipe.frames:
            if isinstance(frame, Frame) and isinstance(frame.body, Error):
                assert "not offered" not in frame.body.detail
