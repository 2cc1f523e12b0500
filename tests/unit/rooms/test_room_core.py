"""The pure chatroom rules: admission, the room log and its replay window, targets, merging."""

from __future__ import annotations

from qim.core.rooms.admission import RoomAdmission
from qim.core.rooms.ids import is_room_id, room_partition
from qim.core.rooms.members import RoomMembers
from qim.core.rooms.merge import RoomMerge, RoomView
from qim.core.rooms.ring import RoomRing
from qim.core.rooms.targets import RoomTargets
from qim.schemas.frames.room import RoomEvent
from qim.schemas.seqs import compose_room_seq


def test_room_ids_have_the_prefix_and_a_stable_partition() -> None:
    assert is_room_id("r:live")
    assert not is_room_id("r:")
    assert not is_room_id("g:team")
    assert not is_room_id("r:" + "x" * 200)
    assert not is_room_id("r:a\x00b")
    parts = {room_partition("t", f"r:{i}", 8) for i in range(64)}
    assert parts <= set(range(8)) and len(parts) > 1
    assert room_partition("t", "r:live", 8) == room_partition("t", "r:live", 8)


def test_the_21st_message_within_a_second_is_refused_with_retry_after() -> None:
    gate = RoomAdmission(count=20, period_ms=1000)
    assert all(gate.admit(1000 + i) is None for i in range(20))
    retry = gate.admit(1500)
    assert retry == 1000 + 1000 - 1500  # the oldest leaves the window then
    assert gate.admit(1500 + retry) is None  # waiting that long is enough
    assert gate.admit(1500 + retry) is not None  # but only for one


def test_refusals_are_not_counted_as_accepted() -> None:
    gate = RoomAdmission(count=2, period_ms=1000)
    assert gate.admit(0) is None and gate.admit(1) is None
    for t in range(2, 900, 50):
        assert gate.admit(t) is not None
    assert gate.admit(1000) is None  # only the two accepted ones counted


def ring(**kw: int) -> RoomRing:
    return RoomRing(room_epoch=kw.get("epoch", 1), retention_ms=kw.get("ret", 60_000),
                    max_records=kw.get("cap", 100))  # fmt: skip


def add(r: RoomRing, n: int, now: int = 0, sender: str = "u") -> list[RoomEvent]:
    return [
        r.append(
            message_id=(i + 1).to_bytes(16, "big"),
            sender_id=sender,
            message_type=0,
            payload=b"p",
            created_at=now,
            now_ms=now,
        )
        for i in range(n)
    ]


def test_room_seq_is_contiguous_within_the_epoch() -> None:
    r = ring(epoch=3)
    assert r.latest_room_seq == compose_room_seq(3, 0) == r.earliest_replay_room_seq
    events = add(r, 5)
    assert [e.room_seq for e in events] == [compose_room_seq(3, c) for c in range(1, 6)]
    assert r.latest_room_seq == compose_room_seq(3, 5)
    assert r.earliest_replay_room_seq == compose_room_seq(3, 0)


def test_replay_inside_the_window_returns_what_follows() -> None:
    r = ring()
    add(r, 10)
    got = r.replay(compose_room_seq(1, 4), 0, limit=100)
    assert not got.truncated
    assert [e.room_seq for e in got.events] == [compose_room_seq(1, c) for c in range(5, 11)]
    limited = r.replay(compose_room_seq(1, 4), 0, limit=2)
    assert [e.room_seq for e in limited.events] == [compose_room_seq(1, 5), compose_room_seq(1, 6)]
    at_edge = r.replay(r.latest_room_seq, 0, limit=100)
    assert at_edge.events == () and not at_edge.truncated


def test_replay_below_the_count_cap_is_truncated_without_error() -> None:
    r = ring(cap=3)
    add(r, 10)
    assert r.earliest_replay_room_seq == compose_room_seq(1, 7)
    got = r.replay(compose_room_seq(1, 2), 0, limit=100)
    assert got.truncated and got.events == ()
    edge = r.replay(compose_room_seq(1, 7), 0, limit=100)
    assert not edge.truncated and len(edge.events) == 3


def test_replay_past_the_retention_time_or_of_another_epoch_is_truncated() -> None:
    r = ring(ret=1000)
    add(r, 3, now=0)
    add(r, 2, now=900)
    got = r.replay(compose_room_seq(1, 1), 1500, limit=100)  # the first three expired
    assert got.truncated
    assert r.earliest_replay_room_seq == compose_room_seq(1, 3)
    assert not r.replay(compose_room_seq(1, 3), 1500, limit=100).truncated
    assert r.replay(compose_room_seq(0, 4), 1500, limit=100).truncated  # older epoch
    assert r.replay(compose_room_seq(1, 99), 1500, limit=100).truncated  # beyond latest
    assert r.replay(1 << 63, 1500, limit=100).truncated  # not a room_seq at all


def test_a_retried_send_finds_its_record_while_it_is_retained() -> None:
    r = ring(cap=2)
    first = r.append(
        message_id=b"7" * 16,
        sender_id="a",
        message_type=0,
        payload=b"x",
        created_at=0,
        now_ms=0,
        client_message_id="c1",
    )
    assert r.duplicate("a", "c1") == first
    assert r.duplicate("b", "c1") is None
    add(r, 2)
    assert r.duplicate("a", "c1") is None  # left the window with its record


def test_targets_are_leases_in_shard_order() -> None:
    t: RoomTargets[str] = RoomTargets(ttl_ms=100)
    t.register("r", 5, 0)
    t.register("r", 2, 50)
    assert t.shards("r", 60) == (2, 5)
    assert t.shards("r", 100) == (2,)  # 5 was not renewed
    t.register("r", 2, 120)
    assert t.shards("r", 200) == (2,)
    t.deregister("r", 2)
    assert t.shards("r", 200) == ()


def view(epoch: int, latest: int) -> RoomView:
    return RoomView(epoch, compose_room_seq(epoch, latest), compose_room_seq(epoch, 0))


def ev(epoch: int, counter: int) -> RoomEvent:
    return RoomEvent(room_seq=compose_room_seq(epoch, counter))


def test_merge_holds_a_rooms_broadcasts_for_one_window() -> None:
    m: RoomMerge[str] = RoomMerge(window_ms=100)
    assert m.offer("r", view(1, 1), (ev(1, 1),), now_ms=0)
    assert m.offer("r", view(1, 3), (ev(1, 2), ev(1, 3)), now_ms=60)
    assert m.due(99) == []
    [(room, held)] = m.due(100)
    assert room == "r" and [e.room_seq for e in held.events] == [
        ev(1, c).room_seq for c in (1, 2, 3)
    ]
    assert held.view.latest_room_seq == compose_room_seq(1, 3)
    assert m.next_due_ms() is None


def test_merge_drops_an_older_epoch_and_a_newer_one_replaces() -> None:
    m: RoomMerge[str] = RoomMerge(window_ms=100)
    m.offer("r", view(2, 1), (ev(2, 1),), 0)
    assert not m.offer("r", view(1, 9), (ev(1, 9),), 10)
    assert m.offer("r", view(3, 1), (ev(3, 1),), 20)
    [(_, held)] = m.due(1000)
    assert [e.room_seq for e in held.events] == [ev(3, 1).room_seq]
    assert m.view("r") == view(3, 1)


def test_members_count_per_shard_and_a_close_leaves_every_room() -> None:
    mem: RoomMembers[str] = RoomMembers()
    assert mem.join("c1", "r1", 4, 0) is True
    assert mem.join("c1", "r1", 4, 5) is False  # idempotent, floor refreshed
    assert dict(mem.members("r1")) == {"c1": 5}
    assert mem.join("c2", "r1", 4, 0) is False  # the shard already has a member
    assert mem.join("c1", "r2", 4, 0) is True
    assert mem.rooms_of("c1") == 2
    assert mem.leave("c2", "r1") is None
    assert mem.leave("c2", "r1") is None  # not a member any more
    assert sorted(mem.close("c1")) == [("r1", 4), ("r2", 4)]
    assert not mem.has_members("r1") and mem.shards() == []
