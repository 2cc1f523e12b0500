"""Chatrooms on the real stack (spec 14): a RoomWriter worker and two `qim gateway` processes
sharing the ConnectionShards through Kafka's group protocol, SDK clients over WebSocket.

Proven here: every member connection, on either gateway, receives every message of a burst,
once and in room_seq order, in merged ROOM_BATCH frames (at most room_outbound_frame_rate of
them), and the RoomWriter broadcasts per ConnectionShard, not per connection; a message beyond
room_msg_rate is refused up front with RATE_LIMITED and retry_after_ms; "no such room" and "not
allowed" are the same PERMISSION_DENIED; a client that missed messages replays them inside the
window and gets replay_truncated outside it; a gateway kill leaves the other gateway's members
served and the killed one's users rejoin on the survivor; none of it writes a conversation
request, an outbox record or a dispatch (so no mailbox entry, session row, unread count or
push can exist); promotion (14.4) makes the online members a group whose history starts at 1.

The worker runs with ``room_msg_rate`` = 20 per **60 s** (the period, not the count, is
changed): "the 21st message within the window" is then independent of how fast this shared
machine runs the burst. The Room Log's count cap is 12, so "outside the window" is reached by
sending, not by waiting 30 minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, TopicPartition

from qim.admin.groups import GroupAdmin
from qim.admin.rooms import define_room
from qim.auth import AuthService, KeyRing, SigningKey
from qim.client import QimClient, QimError, TransportError
from qim.client.heartbeat import HeartbeatConfig
from qim.client.rooms import RoomDelivery
from qim.devstack.stack import CONVERSATION_PARTITION_COUNT, Stack
from qim.schemas.frames import ErrorCode, RoomBatch, SendAck
from qim.schemas.frames.room import RoomEvent, RoomReplay
from qim.schemas.records.rooms import RoomDefinition
from qim.schemas.seqs import split_room_seq
from qim.streams.topics import CONVERSATION_REQUESTS, DISPATCH, OUTBOX, USER_REQUESTS
from tests.integration.test_admin_groups import WRITER_ENV, writer_serving
from tests.integration.test_gateway_cluster import LEASE_MS, GatewayProc, start_gateway
from tests.integration.workers import FaustWorker

pytestmark = pytest.mark.integration

TENANT = f"t-rooms-{uuid.uuid4().hex[:6]}"
LOG_CAP = 12
WAIT_S = 60.0
WORKER_ENV = {
    "QIM_SHARD_LEASE_TTL": str(LEASE_MS),
    "QIM_WRITER_SELF_FENCE_DEADLINE": str(LEASE_MS * 4 // 5),
    "QIM_WRITER_LEASE_RENEW_INTERVAL": str(LEASE_MS // 3),
    "QIM_ROOM_LOG_MAX_RECORDS": str(LOG_CAP),
    "QIM_ROOM_MSG_RATE": '{"count": 20, "period_ms": 60000}',
}
ROOMS = ("r:burst", "r:rate", "r:replay", "r:kill", "r:promo")
PRIVATE = "r:private"
UNTOUCHED = (CONVERSATION_REQUESTS, OUTBOX, DISPATCH, USER_REQUESTS)


@dataclass
class RoomStack:
    worker: FaustWorker
    gateways: tuple[GatewayProc, GatewayProc]
    auth: AuthService
    offsets_before: dict[str, int]

    async def connect(self, user: str, device: str = "phone") -> QimClient:
        """Log in through the first gateway; the SDK follows the REDIRECT to the shard owner.
        While the two gateways are still settling the shards (SHARD_MOVED, a refused dial),
        try again: what a client does."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while True:
            token = await self.auth.issue_token(TENANT, user, device)
            client = QimClient(heartbeat=HeartbeatConfig(enabled=False), request_timeout=WAIT_S)
            try:
                await client.connect(self.gateways[0].url, token, device)
                return client
            except (QimError, TransportError) as exc:
                await client.close()
                retryable = isinstance(exc, TransportError) or exc.name == "SHARD_MOVED"
                if not retryable or loop.time() > deadline:
                    raise
                await asyncio.sleep(0.5)


async def end_offsets(stack: Stack) -> dict[str, int]:
    """The sum of the end offsets of each UNTOUCHED topic: how many records it ever got."""
    consumer = AIOKafkaConsumer(bootstrap_servers=stack.cfg.kafka.bootstrap, group_id=None)
    await consumer.start()
    try:
        sums = {}
        for spec in UNTOUCHED:
            count = spec.partitions(stack.cfg.partition_counts)
            tps = [TopicPartition(spec.name, p) for p in range(count)]
            ends = await consumer.end_offsets(tps)
            sums[spec.name] = sum(ends.values())
        return sums
    finally:
        await consumer.stop()


async def serving(worker: FaustWorker, partitions: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 120
    while True:
        try:
            if len(worker.get("/rooms").get("serving", ())) == partitions:
                return
        except OSError:
            pass
        assert loop.time() < deadline, f"RoomWriter not serving\n{worker.log_tail()}"
        await asyncio.sleep(0.2)


@pytest.fixture(scope="module")
async def rooms(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RoomStack]:
    bootstrap = stack.cfg.kafka.bootstrap
    workdir: Path = tmp_path_factory.mktemp("rooms")
    offsets_before = await end_offsets(stack)
    for room_id in ROOMS:
        await define_room(bootstrap, RoomDefinition(tenant_id=TENANT, room_id=room_id))
    await define_room(
        bootstrap, RoomDefinition(tenant_id=TENANT, room_id=PRIVATE, allowed_users=("owner",))
    )
    worker = FaustWorker(stack, "qim.apps.rooms", workdir / "rooms", WORKER_ENV)
    await asyncio.to_thread(worker.start)
    ring = KeyRing([SigningKey.generate("rooms-test")])
    redis_client = aioredis.Redis.from_url(stack.cfg.redis.url)
    group = f"qim-gw-rooms-{uuid.uuid4().hex[:6]}"
    gws: list[GatewayProc] = []
    try:
        await serving(worker, stack.cfg.partition_counts["room_partition_count"])
        env = {"QIM_ROOM_TARGET_RENEW_MS": "2000"}
        for name in ("gw-rooms-1", "gw-rooms-2"):
            gws.append(start_gateway(stack, workdir, name, group, ring.format(), env))
        yield RoomStack(worker, (gws[0], gws[1]), AuthService(redis_client, ring), offsets_before)
    finally:
        for gw in gws:
            gw.stop()
        await asyncio.to_thread(worker.stop)
        await redis_client.aclose()


CONNECT_CONCURRENCY = 25
"""Logins in flight at once: 200 connections log in concurrently, without a login storm."""


@contextlib.asynccontextmanager
async def clients(rs: RoomStack, who: list[tuple[str, str]]) -> AsyncIterator[list[QimClient]]:
    """Connections of ``who``, in its order, opened concurrently (CONNECT_CONCURRENCY)."""
    slots = asyncio.Semaphore(CONNECT_CONCURRENCY)
    opened: list[QimClient] = []

    async def one(user: str, device: str) -> QimClient:
        async with slots:
            client = await rs.connect(user, device)
            opened.append(client)
            return client

    try:
        yield list(await asyncio.gather(*(one(u, d) for u, d in who)))
    finally:
        await asyncio.gather(*(c.close() for c in opened), return_exceptions=True)


async def collect(client: QimClient, room_id: str, want: int) -> tuple[list[RoomEvent], int]:
    """Read live ROOM_BATCH frames of ``room_id`` until ``want`` events arrived (gaps are
    replayed by the SDK); returns the events and how many live frames carried them."""
    events: list[RoomEvent] = []
    frames = 0
    async with asyncio.timeout(WAIT_S):
        while len(events) < want:
            frame = await client.next_event()
            body = frame.body
            if isinstance(body, RoomBatch) and body.room_id == room_id:
                frames += 1
                got: RoomDelivery = await client.room_batch(body)
                assert not got.lost, "nothing may be lost in this burst"
                events.extend(got.events)
    return events, frames


async def test_every_member_on_both_gateways_gets_every_message_of_a_burst_in_merged_batches(
    rooms: RoomStack,
) -> None:
    users = [f"fan{i}" for i in range(50)]
    who = [(u, d) for u in users for d in ("phone", "pad", "web", "tv")]  # 200 connections
    async with clients(rooms, who) as members:
        assert len(members) == 200
        landed = {c.url for c in members}
        assert len(landed) == 2, f"all members landed on one gateway: {landed}"
        joins = await asyncio.gather(*(c.join_room("r:burst") for c in members))
        assert all(j.events == () for j in joins)
        before = rooms.worker.get("/rooms")["broadcasts"]
        sender = members[0]
        acks = await asyncio.gather(
            *(sender.send_room("r:burst", f"m{i}".encode()) for i in range(20))
        )
        assert all(isinstance(a, SendAck) and a.conversation_seq == 0 for a in acks)
        sent_ids = {a.message_id for a in acks}
        assert len(sent_ids) == 20
        results = await asyncio.gather(*(collect(c, "r:burst", 20) for c in members))
        for events, frames in results:
            assert {e.message_id for e in events} == sent_ids  # every message, once
            seqs = [e.room_seq for e in events]
            assert seqs == sorted(seqs)
            counters = [split_room_seq(s).counter for s in seqs]
            assert counters == list(range(counters[0], counters[0] + 20))  # no gap
            assert frames <= 10, "a 20-message burst must arrive merged (room_outbound_frame_rate)"
        broadcasts = rooms.worker.get("/rooms")["broadcasts"] - before
        # one broadcast per (fetch, ConnectionShard with a member): 4 devices of a user share a
        # shard, so per-connection fanout would be >= 20 x 40 records
        assert 0 < broadcasts <= 20 * len(users)


async def test_the_21st_message_in_the_window_is_refused_up_front_with_retry_after(
    rooms: RoomStack,
) -> None:
    async with clients(rooms, [("talker", "phone"), ("listener", "phone")]) as (talker, listener):
        await talker.join_room("r:rate")
        await listener.join_room("r:rate")
        outcomes = await asyncio.gather(
            *(talker.send_room("r:rate", b"x") for _ in range(21)), return_exceptions=True
        )
        acks = [o for o in outcomes if isinstance(o, SendAck)]
        refused = [o for o in outcomes if isinstance(o, QimError)]
        assert len(acks) == 20 and len(refused) == 1, outcomes
        assert refused[0].code == int(ErrorCode.RATE_LIMITED)
        assert refused[0].retry_after_ms is not None and refused[0].retry_after_ms > 0
        # refused up front: the listener gets the 20, and nothing more follows them
        events, _ = await collect(listener, "r:rate", 20)
        assert {e.message_id for e in events} == {a.message_id for a in acks}
        later = await talker.replay_room("r:rate", events[-1].room_seq)
        assert later.events == () and not later.lost


async def test_no_such_room_and_not_allowed_are_the_same_permission_denied(
    rooms: RoomStack,
) -> None:
    async with clients(rooms, [("stranger", "phone")]) as (stranger,):
        refusals = []
        for room_id in (PRIVATE, "r:never-defined"):
            with pytest.raises(QimError) as err:
                await stranger.join_room(room_id)
            refusals.append((err.value.code, err.value.detail))
        assert refusals[0] == refusals[1] == (int(ErrorCode.PERMISSION_DENIED), "")
        with pytest.raises(QimError) as err:  # a send into a room not joined
            await stranger.send_room("r:burst", b"x")
        assert (err.value.code, err.value.detail) == (int(ErrorCode.PERMISSION_DENIED), "")
        again = await stranger.join_room("r:burst")  # and the refusals left it usable
        assert again.events == ()


async def test_a_client_that_missed_messages_replays_inside_the_window_and_is_truncated_outside(
    rooms: RoomStack,
) -> None:
    async with clients(rooms, [("host", "phone")]) as (host,):
        await host.join_room("r:replay")
        async with clients(rooms, [("late", "phone")]) as (late,):
            await late.join_room("r:replay")
            first = [await host.send_room("r:replay", f"a{i}".encode()) for i in range(3)]
            seen, _ = await collect(late, "r:replay", 3)
            assert {e.message_id for e in seen} == {a.message_id for a in first}
        last_seen = seen[-1].room_seq  # then "late" is offline while three more are sent
        missed = [await host.send_room("r:replay", f"b{i}".encode()) for i in range(3)]
        async with clients(rooms, [("late", "phone")]) as (back,):
            await back.join_room("r:replay")  # a new connection joins again (14.5)
            assert (
                back.last_join is not None and back.last_join.earliest_replay_room_seq <= last_seen
            )
            inside = await back.replay_room("r:replay", last_seen)
            assert not inside.lost
            assert [e.message_id for e in inside.events] == [a.message_id for a in missed]
            for i in range(LOG_CAP):  # push the first messages out of the window
                await host.send_room("r:replay", f"c{i}".encode())
            outside = await back.replay_room("r:replay", last_seen)
            assert outside.lost and outside.events == ()
        # the answer itself: no ERROR, an empty batch, the watermark to jump to
        async with clients(rooms, [("late", "laptop")]) as (probe,):
            await probe.join_room("r:replay")
            watermark = probe.last_join
            assert watermark is not None
            assert watermark.earliest_replay_room_seq > last_seen
            replay = RoomReplay(room_id="r:replay", after_room_seq=last_seen)
            batch = await probe._call(replay, RoomBatch, None)  # the frame as the server sent it
            assert batch.replay_truncated and batch.events == ()
            assert batch.latest_room_seq == watermark.latest_room_seq


async def test_a_gateway_kill_leaves_the_other_gateways_members_served_and_rejoining_works(
    rooms: RoomStack,
) -> None:
    survivor_gw, doomed_gw = rooms.gateways
    who = [(f"k{i}", "phone") for i in range(8)]
    async with clients(rooms, who) as members:
        on_doomed = [c for c in members if c.url == doomed_gw.url]
        survivors = [c for c in members if c.url == survivor_gw.url]
        assert on_doomed and survivors, "the members must be spread over both gateways"
        for c in members:
            await c.join_room("r:kill")
        host = survivors[0]
        doomed_gw.kill()
        before = [await host.send_room("r:kill", f"k{i}".encode()) for i in range(3)]
        for c in survivors:  # unaffected: every message, in order
            events, _ = await collect(c, "r:kill", 3)
            assert [e.message_id for e in events] == [a.message_id for a in before]
        users = [c.identity.user_id for c in on_doomed if c.identity is not None]
        assert len(users) == len(on_doomed)
    # the killed gateway's users come back (the survivor takes their shards within the lease)
    async with clients(rooms, [(u, "phone") for u in users] + [("k-host", "phone")]) as back:
        *returned, host = back
        assert all(c.url == survivor_gw.url for c in back)
        for c in back:
            joined = await c.join_room("r:kill")  # nothing is restored: join again (14.5)
            assert not joined.lost
        for c in returned:  # what they missed while away is still in the window
            missed = await c.replay_room("r:kill", _first_seq(c))
            assert [e.message_id for e in missed.events] == [a.message_id for a in before]
        after = await host.send_room("r:kill", b"after")
        for c in returned:
            events, _ = await collect(c, "r:kill", 1)
            assert [e.message_id for e in events] == [after.message_id]


def _first_seq(client: QimClient) -> int:
    """The position just before the three messages sent while the gateway was down."""
    join = client.last_join
    assert join is not None
    return join.latest_room_seq - 3


async def test_rooms_wrote_nothing_towards_mailboxes_history_or_session_lists(
    rooms: RoomStack, stack: Stack
) -> None:
    assert rooms.worker.get("/rooms")["messages"] > 0  # the tests above did send
    after = await end_offsets(stack)
    assert after == rooms.offsets_before


async def test_promotion_makes_the_online_members_a_group_whose_history_starts_at_1(
    rooms: RoomStack, stack: Stack, tmp_path: Path
) -> None:
    """14.4 (runs last: a group create writes conversation records, which the test above
    proves rooms never do)."""
    writer = FaustWorker(stack, "qim.apps.conversation", tmp_path / "writer", WRITER_ENV)
    await asyncio.to_thread(writer.start)
    admin = GroupAdmin(
        stack.cfg.kafka.bootstrap, partition_count=CONVERSATION_PARTITION_COUNT, timeout_s=WAIT_S
    )
    await admin.start()
    group = f"g:promo-{uuid.uuid4().hex[:6]}"
    who = [(f"p{i}", "phone") for i in range(4)]
    try:
        await writer_serving(writer)
        async with clients(rooms, who) as (p0, p1, p2, p3):
            for c in (p0, p1, p2, p3):
                await c.join_room("r:promo")
            await p3.leave_room("r:promo")  # not online in the room any more
            await p0.send_room("r:promo", b"before promotion")
            created, online = await admin.promote_room(TENANT, "r:promo", group, "p0")
            assert online == ("p0", "p1", "p2")
            assert created.member_count == 3
            with pytest.raises(QimError) as err:  # room_seq allocation stopped
                await p1.send_room("r:promo", b"after")
            assert err.value.code == int(ErrorCode.PERMISSION_DENIED)
            members = await p1.pull_members(group)
            assert sorted(m.user_id for m in members.members) == ["p0", "p1", "p2"]
            assert {m.joined_at_conversation_seq for m in members.members} == {0}
            ack = await p1.send_message(group, b"first group message")
            history = await p2.pull_history(group, direction="older", limit=50)
            seqs = sorted(m.conversation_seq for m in history.messages)
            assert seqs[0] == 1 and ack.conversation_seq in seqs  # starts at 1
            payloads = {m.payload_or_ciphertext for m in history.messages}
            assert b"before promotion" not in payloads  # nothing back-filled
        async with clients(rooms, [("p1", "laptop")]) as (late,):
            with pytest.raises(QimError) as err:  # the room ended: as if it never existed
                await late.join_room("r:promo")
            assert (err.value.code, err.value.detail) == (int(ErrorCode.PERMISSION_DENIED), "")
    finally:
        await admin.stop()
        await asyncio.to_thread(writer.stop)
