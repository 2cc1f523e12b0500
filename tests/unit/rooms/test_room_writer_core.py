"""The RoomWriter's decisions (spec 14.1-14.5) and the SDK's gap detection (14.3), pure."""

from __future__ import annotations

from itertools import count
from typing import Any

from qim.client.rooms import RoomTracker
from qim.core.rooms.writer import RoomConfig, RoomWriterCore
from qim.schemas.frames import Error, ErrorCode, RoomBatch, SendAck, SendMessage
from qim.schemas.frames.room import RoomEvent
from qim.schemas.records.requests import AdminReplyTo
from qim.schemas.records.rooms import (
    RoomDefinition,
    RoomJoinRequest,
    RoomPromoteRequest,
    RoomReplayRequest,
    RoomSendRequest,
    RoomTargetRequest,
)
from qim.schemas.seqs import compose_room_seq

T, R = "t", "r:live"


def core(**cfg: Any) -> RoomWriterCore:
    defs = {
        (T, R): RoomDefinition(tenant_id=T, room_id=R, banned_users=("mallory",)),
        (T, "r:vip"): RoomDefinition(tenant_id=T, room_id="r:vip", allowed_users=("vip",)),
    }
    ids = count(1)
    return RoomWriterCore(RoomConfig(**cfg), defs, lambda room, now: next(ids))


def who(user: str = "alice", shard: int = 3, rid: int = 1, room: str = R) -> dict[str, Any]:
    return {
        "tenant_id": T, "user_id": user, "device_id": "d", "session_epoch": 1,
        "connection_shard": shard, "conn_id": f"c-{user}-{shard}", "request_id": rid,
        "room_id": room,
    }  # fmt: skip


def send(user: str = "alice", cmid: str = "", shard: int = 3, rid: int = 1) -> RoomSendRequest:
    msg = SendMessage(client_message_id=cmid, conversation_id=R, payload=b"p")
    return RoomSendRequest(**who(user, shard, rid), message=msg)


def test_missing_and_forbidden_rooms_get_the_same_denial() -> None:
    c = core()
    out = c.handle(
        [
            RoomJoinRequest(**who(room="r:nope", rid=1)),
            RoomJoinRequest(**who(room="r:vip", rid=1)),
            RoomJoinRequest(**who(user="mallory", rid=1)),
        ],
        0,
    )
    bodies = [r.body for r in out.replies]
    assert bodies == [Error(code=int(ErrorCode.PERMISSION_DENIED), request_id=1)] * 3
    assert c.targets.rooms() == []  # nobody was registered


def test_a_join_registers_the_shard_and_answers_the_positions() -> None:
    c = core()
    c.next_epoch[(T, R)] = 4  # the room's last epoch in the log was 3
    out = c.handle([RoomJoinRequest(**who(shard=9))], 0)
    [reply] = out.replies
    assert reply.action == "join" and isinstance(reply.body, RoomBatch)
    assert reply.body.room_epoch == 4
    assert reply.body.latest_room_seq == compose_room_seq(4, 0)
    assert c.targets.shards((T, R), 1) == (9,)


def test_sends_of_one_fetch_are_broadcast_once_per_target_shard() -> None:
    c = core()
    c.handle([RoomJoinRequest(**who("a", 1)), RoomJoinRequest(**who("b", 1)),
              RoomJoinRequest(**who("c", 2))], 0)  # fmt: skip
    out = c.handle([send("a", shard=1), send("a", shard=1), send("c", shard=2)], 10)
    assert len(out.records) == 3
    assert [b.connection_shard for b in out.broadcasts] == [1, 2]  # not one per connection
    for cast in out.broadcasts:
        assert [e.room_seq for e in cast.events] == [compose_room_seq(1, n) for n in (1, 2, 3)]
        assert cast.latest_room_seq == compose_room_seq(1, 3)
    acks = [r.body for r in out.replies]
    assert all(isinstance(a, SendAck) and a.conversation_seq == 0 for a in acks)


def test_a_retried_send_gets_its_first_ack_and_no_second_message() -> None:
    c = core()
    first = c.handle([send(cmid="m1")], 0)
    again = c.handle([send(cmid="m1", rid=2)], 5)
    assert again.records == [] and again.broadcasts == []
    a, b = first.replies[0].body, again.replies[0].body
    assert isinstance(a, SendAck) and isinstance(b, SendAck) and a.message_id == b.message_id


def test_the_rate_refusal_is_up_front_and_says_when_to_retry() -> None:
    c = core(msg_rate_count=2, msg_rate_period_ms=1000)
    out = c.handle([send(rid=1), send(rid=2), send(rid=3)], 100)
    assert len(out.records) == 2
    error = out.replies[2].body
    assert isinstance(error, Error) and error.code == int(ErrorCode.RATE_LIMITED)
    assert error.retry_after_ms == 1000 and error.request_id == 3
    assert out.rate_limited == [(T, R)]


def test_replay_inside_and_outside_the_window() -> None:
    c = core(max_records=3)
    c.handle([send(rid=i) for i in range(6)], 0)
    inside = c.handle([RoomReplayRequest(**who(), after_room_seq=compose_room_seq(1, 4))], 1)
    batch = inside.replies[0].body
    assert isinstance(batch, RoomBatch) and not batch.replay_truncated
    assert [e.room_seq for e in batch.events] == [compose_room_seq(1, 5), compose_room_seq(1, 6)]
    outside = c.handle([RoomReplayRequest(**who(), after_room_seq=compose_room_seq(1, 1))], 1)
    batch = outside.replies[0].body
    assert isinstance(batch, RoomBatch) and batch.replay_truncated and batch.events == ()
    assert batch.latest_room_seq == compose_room_seq(1, 6)
    assert batch.earliest_replay_room_seq == compose_room_seq(1, 3)
    assert (outside.replays, outside.truncated_replays) == (1, 1)


def test_a_deregistered_or_expired_target_gets_no_broadcast() -> None:
    c = core(target_ttl_ms=100)
    c.handle([RoomJoinRequest(**who("a", 1)), RoomJoinRequest(**who("b", 2))], 0)
    c.handle([RoomTargetRequest(tenant_id=T, room_id=R, connection_shard=1, present=False)], 1)
    assert [b.connection_shard for b in c.handle([send()], 50).broadcasts] == [2]
    assert c.handle([send(rid=2)], 150).broadcasts == []  # shard 2 was never renewed


def ev(counter: int, epoch: int = 1) -> RoomEvent:
    return RoomEvent(room_seq=compose_room_seq(epoch, counter), message_id=bytes([counter]) * 16)


def live(
    *events: RoomEvent, epoch: int = 1, latest: int | None = None, replay_truncated: bool = False
) -> RoomBatch:
    top = max([e.room_seq for e in events], default=compose_room_seq(epoch, 0))
    return RoomBatch(
        room_id=R,
        room_epoch=epoch,
        events=events,
        latest_room_seq=top if latest is None else latest,
        replay_truncated=replay_truncated,
    )


def test_the_tracker_delivers_in_order_holds_behind_a_gap_and_fills_it() -> None:
    t = RoomTracker()
    t.joined(RoomBatch(room_id=R, room_epoch=1, latest_room_seq=compose_room_seq(1, 2)))
    got = t.apply(live(ev(3)))
    assert [e.room_seq for e in got.events] == [ev(3).room_seq] and not got.gap
    gapped = t.apply(live(ev(6)))
    assert gapped.events == () and gapped.gap  # 4 and 5 are missing: 6 is held
    filled = t.replayed(live(ev(4), ev(5), latest=ev(6).room_seq))
    assert [e.room_seq for e in filled.events] == [ev(n).room_seq for n in (4, 5, 6)]
    assert not filled.gap and t.applied(R) == ev(6).room_seq


def test_the_tracker_jumps_on_truncation_and_on_another_epoch() -> None:
    t = RoomTracker()
    t.joined(RoomBatch(room_id=R, room_epoch=1, latest_room_seq=compose_room_seq(1, 0)))
    assert t.apply(live(ev(5))).gap
    jumped = t.replayed(live(latest=ev(9).room_seq, replay_truncated=True))
    assert jumped.lost and [e.room_seq for e in jumped.events] == [ev(5).room_seq]
    assert t.applied(R) == ev(9).room_seq
    moved = t.apply(live(ev(1, epoch=2), epoch=2))
    assert moved.lost and [e.room_seq for e in moved.events] == [ev(1, 2).room_seq]
    assert t.apply(live(ev(1, epoch=2), epoch=2)).events == ()  # a duplicate is dropped


def test_promotion_answers_the_online_members_and_stops_allocation() -> None:
    c = core()
    c.handle([RoomJoinRequest(**who("a", 1)), RoomJoinRequest(**who("b", 2)),
              RoomJoinRequest(**who("c", 2))], 0)  # fmt: skip
    leave = RoomTargetRequest(tenant_id=T, room_id=R, connection_shard=2, user_ids=("b",))
    to = AdminReplyTo(node_id="admin-1", correlation_id="x")
    out = c.handle(
        [leave, RoomPromoteRequest(tenant_id=T, room_id=R, group_id="g:x", reply_to=to)], 5
    )
    [reply] = out.admin_replies
    assert reply.member_ids == ("a", "b") and reply.correlation_id == "x" and reply.error is None
    refused = c.handle([send("a", shard=1)], 6)
    assert refused.records == [] and isinstance(refused.replies[0].body, Error)
    missing = c.handle([RoomPromoteRequest(tenant_id=T, room_id="r:nope", group_id="g:y",
                                           reply_to=to)], 7)  # fmt: skip
    assert missing.admin_replies[0].error is not None


def test_the_rate_is_judged_at_the_gateways_read_time_not_at_arrival() -> None:
    c = core(msg_rate_count=2, msg_rate_period_ms=1000)
    paced = [
        RoomSendRequest(**who(rid=i), message=SendMessage(conversation_id=R), received_at_ms=t)
        for i, t in enumerate((1, 600, 1200))
    ]
    out = c.handle(paced, 1500)  # one clump at arrival, 600 ms apart at the client
    assert len(out.records) == 3 and out.rate_limited == []
