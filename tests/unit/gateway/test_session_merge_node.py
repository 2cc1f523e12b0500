"""``session_delta_merge_window`` in a real ConnectionNode (12.6.3), over a real WebSocket.

* two SessionPush records delivered back to back (no event-loop turn between them, so both
  land in one window whatever the machine's speed) reach the client as ONE SESSION_DELTA per
  conversation with the later absolute values, and one BADGE_UPDATE, the latest; READ_SYNC is
  not held; ``session_delta_merge_ratio`` counts the frames merged away;
* a session KICKED while frames are held: KICKED is the last frame, the held ones are dropped;
* window 0: every frame goes out as it comes (the behaviour before the window).
"""

from __future__ import annotations

from qim.gateway.routing.replies import ReplyVerdict
from qim.schemas.frames import AuthOk, Kicked, OnlineReady, SyncComplete
from qim.schemas.frames.control import ReadSync
from qim.schemas.frames.history import BadgeUpdate, SessionDelta
from qim.schemas.records.session_push import SessionPush, encode_session_push
from tests.gateway_support import RawClient
from tests.unit.gateway.test_login_sync_support import TENANT, SyncNode, login, sync_node


def push(epoch: int, *deltas: SessionDelta, badge: BadgeUpdate | None = None,
         reads: tuple[ReadSync, ...] = ()) -> bytes:  # fmt: skip
    return encode_session_push(
        SessionPush(
            tenant_id=TENANT,
            user_id="bob",
            device_id="phone",
            connection_id="x",
            session_epoch=epoch,
            connection_shard=0,
            deltas=deltas,
            badge=badge,
            read_syncs=reads,
        )
    )


def d(conv: str, version: int, unread: int) -> SessionDelta:
    return SessionDelta(conversation_id=conv, projection_mailbox_seq=version, unread_count=unread)


def b(version: int, unread: int) -> BadgeUpdate:
    return BadgeUpdate(total_unread=unread, badge_projection_mailbox_seq=version)


async def online(h: SyncNode) -> tuple[RawClient, int]:
    client = await login(h, "bob")
    ok = client.bodies()[-1]
    assert isinstance(ok, AuthOk)
    # session-list frames wait for the login barrier (12.8.3): pass it first
    await client.send(SyncComplete(sync_to_seq=ok.sync_to_seq), request_id=4)
    await client.expect(OnlineReady)
    return client, ok.session_epoch


async def test_deltas_of_one_window_are_merged_by_replacement() -> None:
    async with sync_node() as h:
        assert h.node.delta_merge is not None  # the default window is on
        client, epoch = await online(h)
        read = ReadSync(conversation_id="c9", read_conversation_seq=3)
        first = push(epoch, d("c1", 5, 1), d("c2", 6, 4), badge=b(6, 5), reads=(read,))
        second = push(epoch, d("c1", 8, 3), badge=b(8, 7))
        late = push(epoch, d("c2", 4, 9), badge=b(4, 99))  # a reordered older record
        for record in (first, second, late):
            assert h.router.deliver(record) is ReplyVerdict.DELIVER
        assert await client.expect(ReadSync) == read  # not held
        assert await client.expect(SessionDelta) == d("c1", 8, 3)  # 3, never 1 + 3
        assert await client.expect(SessionDelta) == d("c2", 6, 4)  # the older one lost
        assert await client.expect(BadgeUpdate) == b(8, 7)
        assert len(h.node.delta_merge.buffer) == 0
        assert [x for x in client.bodies() if isinstance(x, SessionDelta | BadgeUpdate)] == [
            d("c1", 8, 3),
            d("c2", 6, 4),
            b(8, 7),
        ]
        # 7 frames offered (3 deltas + 2 badges + 1 delta + 1 badge), 4 merged away
        assert h.sample("session_delta_merge_ratio") == 4 / 7
        await client.close()


async def test_nothing_held_follows_kicked() -> None:
    async with sync_node() as h:
        assert h.node.delta_merge is not None
        client, epoch = await online(h)
        assert h.router.deliver(push(epoch, d("c1", 5, 1), badge=b(5, 1))) is ReplyVerdict.DELIVER
        (conn,) = h.node.connections.values()
        assert h.node.delta_merge.buffer.held(conn) != ()
        conn.apply(conn.session.kick("replaced", "tablet", h.node.clock_ms()))
        assert h.node.delta_merge.buffer.held(conn) == ()
        bodies = await client.expect_closed()
        assert isinstance(bodies[-1], Kicked)
        assert not [x for x in bodies if isinstance(x, SessionDelta | BadgeUpdate)]


async def test_window_zero_sends_every_frame_at_once() -> None:
    async with sync_node(session_delta_merge_window_ms=0) as h:
        assert h.node.delta_merge is None
        client, epoch = await online(h)
        h.router.deliver(push(epoch, d("c1", 5, 1)))
        h.router.deliver(push(epoch, d("c1", 8, 3)))
        assert await client.expect(SessionDelta) == d("c1", 5, 1)
        assert await client.expect(SessionDelta) == d("c1", 8, 3)
        await client.close()
