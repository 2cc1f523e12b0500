"""QimClient against the in-process fake server over MemoryTransport (no gateway needed)."""

from __future__ import annotations

import asyncio

import pytest

from qim.client import (
    ClientState,
    ConnectionClosedError,
    HeartbeatConfig,
    IllegalTransition,
    MemoryNetwork,
    MemoryTransport,
    QimClient,
    QimError,
    RequestTimeout,
    TooManyRedirects,
    TransportClosed,
    UnexpectedFrame,
)
from qim.schemas.frames import (
    Auth,
    AuthOk,
    Body,
    ClientAction,
    CreateGroup,
    Error,
    ErrorCode,
    Frame,
    HistoryBatch,
    Kicked,
    LeaveGroup,
    MailboxBatch,
    MailboxCursor,
    MemberListBatch,
    OnlineReady,
    Ping,
    PullHistory,
    PullMailbox,
    PullMembers,
    PushEvents,
    Redirect,
    SendAck,
    SendMessage,
    SessionDelta,
    SyncComplete,
    SyncEntry,
    encode_frame,
    frame_bytes,
)

from .fake_server import DEFAULT_AUTH_OK, FakeServer, FakeSession

NOW_MS = 1_700_000_000_500


def make_client(network: MemoryNetwork, **options: object) -> QimClient:
    settings: dict[str, object] = {
        "heartbeat": HeartbeatConfig(enabled=False),
        "connect_timeout": 2.0,
        "request_timeout": 2.0,
    }
    settings.update(options)
    return QimClient(dial=network.dial, clock_ms=lambda: NOW_MS, **settings)  # type: ignore[arg-type]


async def connect(client: QimClient, url: str, **options: object) -> AuthOk:
    return await client.connect(url, "token-1", "phone-1", **options)  # type: ignore[arg-type]


def state_of(client: QimClient) -> ClientState:
    return client.state  # a call, so mypy does not keep an earlier narrowing


def pings(frames: list[Frame]) -> list[Ping]:
    return [f.body for f in frames if isinstance(f.body, Ping)]


# -- AUTH ------------------------------------------------------------------------------------


async def test_auth_ok_is_returned_and_auth_carries_a3_1_fields(network: MemoryNetwork) -> None:
    server = FakeServer()
    url = network.listen("a", server.handle)
    cursor = MailboxCursor(token=b"signed", last_applied_mailbox_seq=40)
    async with make_client(network) as client:
        auth_ok = await connect(client, url, capabilities=0x03, cursor=cursor)
        assert auth_ok == DEFAULT_AUTH_OK
        assert client.state is ClientState.AUTHENTICATED
        assert client.heartbeat.next_ping_interval_ms == DEFAULT_AUTH_OK.next_ping_interval_ms
        session = await server.session()
    assert session.auth == Auth(
        access_token="token-1",
        device_id="phone-1",
        client_version="qim-py/0.1.0",
        capabilities=3,
        mailbox_cursor=cursor,
    )
    assert session.route_token == b""
    assert state_of(client) is ClientState.CLOSED


async def test_auth_error_raises_typed_qim_error_and_closes(network: MemoryNetwork) -> None:
    server = FakeServer(verdict=lambda a, t: Error(code=ErrorCode.TOKEN_EXPIRED, detail="old"))
    url = network.listen("a", server.handle)
    client = make_client(network)
    with pytest.raises(QimError) as info:
        await connect(client, url)
    assert info.value.code is ErrorCode.TOKEN_EXPIRED
    assert info.value.action is ClientAction.REFRESH_TOKEN_RECONNECT
    assert info.value.detail == "old"
    assert client.state is ClientState.CLOSED


async def test_unknown_error_code_is_tolerated_27_1_2(network: MemoryNetwork) -> None:
    server = FakeServer(verdict=lambda a, t: Error(code=999, retry_after_ms=50))
    client = make_client(network)
    with pytest.raises(QimError) as info:
        await connect(client, network.listen("a", server.handle))
    assert (info.value.code, info.value.name, info.value.retry_after_ms) == (999, "UNKNOWN_999", 50)


def redirect_to(hint: str) -> Redirect:
    return Redirect(
        route_token=b"rt-1", connection_shard=9, endpoint_hint=hint, exp=NOW_MS + 60_000
    )


async def test_redirect_is_followed_once_presenting_the_route_token_5_3_2(
    network: MemoryNetwork,
) -> None:
    owner = FakeServer(
        verdict=lambda a, token: DEFAULT_AUTH_OK if token == b"rt-1" else redirect_to("x")
    )
    first = FakeServer(verdict=lambda a, t: redirect_to("memory://owner"))
    url = network.listen("first", first.handle)
    network.listen("owner", owner.handle)
    async with make_client(network) as client:
        assert await connect(client, url) == DEFAULT_AUTH_OK
        assert (client.url, client.redirects) == ("memory://owner", 1)
        assert (await owner.session()).route_token == b"rt-1"
    assert first.sessions == [] and len(first.auth_frames) == 1


async def test_second_redirect_is_refused_5_3_2(network: MemoryNetwork) -> None:
    a = FakeServer(verdict=lambda a, t: redirect_to("memory://b"))
    b = FakeServer(verdict=lambda a, t: redirect_to("memory://a"))
    url = network.listen("a", a.handle)
    network.listen("b", b.handle)
    client = make_client(network)
    with pytest.raises(TooManyRedirects):
        await connect(client, url)
    assert client.state is ClientState.CLOSED


async def test_shard_moved_after_redirect_exposes_retry_after_ms_5_3_2(
    network: MemoryNetwork,
) -> None:
    a = FakeServer(verdict=lambda a, t: redirect_to("memory://b"))
    b = FakeServer(verdict=lambda a, t: Error(code=ErrorCode.SHARD_MOVED, retry_after_ms=1500))
    url = network.listen("a", a.handle)
    network.listen("b", b.handle)
    client = make_client(network)
    with pytest.raises(QimError) as info:
        await connect(client, url)
    assert info.value.code is ErrorCode.SHARD_MOVED
    assert info.value.retry_after_ms == 1500
    assert info.value.extras == {"retry_after_ms": 1500}


async def test_no_auth_verdict_times_out_and_closes(network: MemoryNetwork) -> None:
    async def silent(transport: MemoryTransport) -> None:
        await transport.recv()
        await asyncio.Event().wait()

    client = make_client(network, connect_timeout=0.05)
    with pytest.raises(RequestTimeout) as info:
        await connect(client, network.listen("a", silent))
    assert info.value.frame == "AUTH" and isinstance(info.value, TimeoutError)
    assert client.state is ClientState.CLOSED


async def test_server_closing_during_auth_is_a_clear_error(network: MemoryNetwork) -> None:
    async def hang_up(transport: MemoryTransport) -> None:
        await transport.recv()
        await transport.close()

    client = make_client(network)
    with pytest.raises(ConnectionClosedError, match="during AUTH"):
        await connect(client, network.listen("a", hang_up))


async def test_calls_outside_authenticated_state_raise(network: MemoryNetwork) -> None:
    url = network.listen("a", FakeServer().handle)
    client = make_client(network)
    with pytest.raises(IllegalTransition):
        await client.ping()
    await connect(client, url)
    with pytest.raises(IllegalTransition):
        await connect(client, url)
    await client.close()
    await client.close()  # idempotent
    with pytest.raises(ConnectionClosedError):
        await client.ping()


# -- PING / heartbeat -------------------------------------------------------------------------


async def test_ping_returns_pong_and_tracks_it_15_1(network: MemoryNetwork) -> None:
    server = FakeServer(last_pushed_user_seq=77, mailbox_dirty=True, next_ping_interval_ms=45_000)
    async with make_client(network) as client:
        await connect(client, network.listen("a", server.handle))
        client.last_applied_mailbox_seq = 12
        pong = await client.ping()
        assert (pong.ping_id, pong.echo_client_time) == (1, NOW_MS)
        assert client.heartbeat.last_pushed_user_seq == 77
        assert client.heartbeat.mailbox_dirty is True
        assert client.heartbeat.next_ping_interval_ms == 45_000
        assert client.heartbeat.last_rtt_ms == 0
        sent = pings((await server.session()).received)
    assert sent == [Ping(ping_id=1, client_time=NOW_MS, last_applied_mailbox_seq=12)]


async def test_heartbeat_pings_every_interval(network: MemoryNetwork) -> None:
    server = FakeServer()
    heartbeat = HeartbeatConfig(interval_s=0.005, network_type="wifi")
    async with make_client(network, heartbeat=heartbeat) as client:
        await connect(client, network.listen("a", server.handle))
        frames = await server.wait_received(lambda fs: len(pings(fs)) >= 3)
    sent = pings(frames)
    assert [p.ping_id for p in sent[:3]] == [1, 2, 3]
    assert all(p.network_type == "wifi" and not p.probe for p in sent)


async def test_heartbeat_probes_then_declares_the_link_dead_15_1_2(network: MemoryNetwork) -> None:
    server = FakeServer(answer_pings=False)
    heartbeat = HeartbeatConfig(interval_s=0.005, pong_timeout_s=0.02)
    client = make_client(network, heartbeat=heartbeat)
    await connect(client, network.listen("a", server.handle))
    async with asyncio.timeout(2):
        with pytest.raises(ConnectionClosedError, match="no PONG"):
            await client.next_event()
    assert [p.probe for p in pings(server.sessions[0].received)] == [False, True]
    assert client.state is ClientState.CLOSED


# -- requests --------------------------------------------------------------------------------


async def test_out_of_order_replies_reach_their_own_requests(network: MemoryNetwork) -> None:
    held: list[Frame] = []

    async def reverse(session: FakeSession, frame: Frame) -> None:
        held.append(frame)
        if len(held) == 3:
            for f in reversed(held):
                assert isinstance(f.body, PullHistory)
                seq = f.body.anchor_conversation_seq
                await session.send(HistoryBatch(latest_conversation_seq=seq), f.header.request_id)

    server = FakeServer(on_request=reverse)
    async with make_client(network) as client:
        await connect(client, network.listen("a", server.handle))
        batches = await asyncio.gather(
            *(client.pull_history("c1", anchor_conversation_seq=s) for s in (10, 20, 30))
        )
    assert [b.latest_conversation_seq for b in batches] == [10, 20, 30]


async def test_error_reply_fails_only_its_request(network: MemoryNetwork) -> None:
    async def answer(session: FakeSession, frame: Frame) -> None:
        body, rid = frame.body, frame.header.request_id
        assert isinstance(body, SendMessage) and body.request_id == rid  # A.3 #4 repeats it
        if body.conversation_id == "forbidden":
            error = Error(code=ErrorCode.PERMISSION_DENIED, request_id=rid)
            await session.send(error)  # header 0: the body's echo correlates (A.4 #21)
        else:
            await session.send(
                SendAck(request_id=rid, client_message_id=body.client_message_id), rid
            )

    server = FakeServer(on_request=answer)
    async with make_client(network) as client:
        await connect(client, network.listen("a", server.handle))
        ok, denied = await asyncio.gather(
            client.send_message("c1", b"hi", client_message_id="m1"),
            client.send_message("forbidden", b"hi"),
            return_exceptions=True,
        )
    assert isinstance(ok, SendAck) and ok.client_message_id == "m1"
    assert isinstance(denied, QimError) and denied.code is ErrorCode.PERMISSION_DENIED


async def test_server_close_mid_request_fails_pending_requests(network: MemoryNetwork) -> None:
    async def hang_up(session: FakeSession, frame: Frame) -> None:
        if isinstance(frame.body, SyncComplete):
            await session.close()

    server = FakeServer(on_request=hang_up)
    client = make_client(network, request_timeout=30.0)
    await connect(client, network.listen("a", server.handle))
    async with asyncio.timeout(2):  # proves no hang: the request timeout is 30 s
        pending = asyncio.create_task(client.pull_mailbox(0))
        await server.wait_received(lambda fs: len(fs) == 1)
        with pytest.raises(ConnectionClosedError, match="server closed"):
            await client.sync_complete(120)
        with pytest.raises(ConnectionClosedError):
            await pending
    assert client.state is ClientState.CLOSED
    with pytest.raises(ConnectionClosedError):
        await client.pull_mailbox(0)


async def test_request_timeout_releases_the_id_and_a_late_reply_is_dropped(
    network: MemoryNetwork,
) -> None:
    server = FakeServer(on_request=lambda session, frame: asyncio.sleep(0))
    async with make_client(network) as client:
        await connect(client, network.listen("a", server.handle))
        with pytest.raises(RequestTimeout) as info:
            await client.pull_mailbox(0, timeout=0.02)
        assert info.value.frame == "PULL_MAILBOX"
        session = await server.session()
        await session.send(MailboxBatch(), info.value.request_id)
        await client.ping()  # same connection, in order: the late reply has been read
        assert client.late_replies == 1
        with pytest.raises(TimeoutError):
            await client.next_event(timeout=0.01)


async def test_wrong_reply_type_is_unexpected_frame(network: MemoryNetwork) -> None:
    async def wrong(session: FakeSession, frame: Frame) -> None:
        await session.send(HistoryBatch(), frame.header.request_id)

    async with make_client(network) as client:
        await connect(client, network.listen("a", FakeServer(on_request=wrong).handle))
        with pytest.raises(UnexpectedFrame, match="HISTORY_BATCH is no reply to PULL_MAILBOX"):
            await client.pull_mailbox(0)


async def test_typed_calls_send_appendix_a_frames(network: MemoryNetwork) -> None:
    async def answer(session: FakeSession, frame: Frame) -> None:
        body, rid = frame.body, frame.header.request_id
        reply: Body
        if isinstance(body, SendMessage):
            reply = SendAck(request_id=rid, client_message_id=body.client_message_id)
        elif isinstance(body, PullMailbox):
            reply = MailboxBatch(covered_through_seq=body.up_to_seq, lane_watermark=120)
        elif isinstance(body, SyncComplete):
            reply, rid = OnlineReady(), 0  # ONLINE_READY may come without request_id (§9.3)
        elif isinstance(body, PullHistory):
            reply = HistoryBatch(latest_conversation_seq=9)
        else:
            reply = MemberListBatch(total_hint=2)
        await session.send(reply, rid)

    server = FakeServer(on_request=answer)
    async with make_client(network) as client:
        await connect(client, network.listen("a", server.handle))
        ack = await client.send_message(
            "g1", b"\x01", message_type=2, custom_type="card", mention_targets=("u2",)
        )
        batch = await client.pull_mailbox(40, up_to_seq=120, max_items=50, acked_seq=40)
        assert await client.sync_complete(120) == OnlineReady()
        history = await client.pull_history("g1", direction="newer", limit=20)
        created = await client.create_group("g2", ("u2", "u3"))
        left = await client.leave_group("g2")
        members = await client.pull_members("g1", filter="search", query="al", limit=10)
        with pytest.raises(ValueError, match="direction"):
            await client.pull_history("g1", direction="sideways")
    assert batch.covered_through_seq == 120 and history.latest_conversation_seq == 9
    assert created.total_hint == left.total_hint == members.total_hint == 2
    sent = [f.body for f in server.sessions[0].received]
    assert sent == [
        SendMessage(
            request_id=1,
            client_message_id=ack.client_message_id,
            conversation_id="g1",
            message_type=2,
            custom_type="card",
            payload=b"\x01",
            mention_targets=("u2",),
        ),
        PullMailbox(after_seq=40, up_to_seq=120, max_items=50, acked_seq=40),
        SyncComplete(sync_to_seq=120),
        PullHistory(conversation_id="g1", direction="newer", limit=20),
        CreateGroup(group_id="g2", member_ids=("u2", "u3")),
        LeaveGroup(group_id="g2"),
        PullMembers(conversation_id="g1", filter="search", query="al", limit=10),
    ]
    assert len(ack.client_message_id) == 32  # a fresh uuid4 per message


# -- server-initiated frames -------------------------------------------------------------------


async def test_pushes_arrive_in_order_on_the_event_iterator(network: MemoryNetwork) -> None:
    server = FakeServer()
    client = make_client(network)
    await connect(client, network.listen("a", server.handle))
    session = await server.session()
    for seq in (1, 2, 3):
        await session.send(
            PushEvents(events=(SyncEntry(mailbox_seq=seq),), last_pushed_user_seq=seq)
        )
    await session.send(SessionDelta(conversation_id="c1", unread_count=3))
    await session.close()
    async with asyncio.timeout(2):
        frames = [frame async for frame in client.events()]
    assert [f.name for f in frames] == ["PUSH_EVENTS"] * 3 + ["SESSION_DELTA"]
    assert [f.body.last_pushed_user_seq for f in frames[:3]] == [1, 2, 3]  # type: ignore[attr-defined]
    assert client.state is ClientState.CLOSED


async def test_kicked_is_delivered_and_named_in_the_close_a4_13(network: MemoryNetwork) -> None:
    server = FakeServer(on_request=lambda session, frame: asyncio.sleep(0))
    client = make_client(network)
    await connect(client, network.listen("a", server.handle))
    pending = asyncio.create_task(client.pull_mailbox(0))
    session = await server.session()
    await server.wait_received(lambda fs: len(fs) == 1)
    await session.send(Kicked(reason="replaced", replaced_by_device="tablet"))
    await session.close()
    async with asyncio.timeout(2):
        event = await client.next_event()
        assert event.body == Kicked(reason="replaced", replaced_by_device="tablet")
        with pytest.raises(ConnectionClosedError) as info:
            await pending
    assert info.value.kicked == client.kicked == event.body
    assert "kicked: replaced" in str(info.value)


async def test_connection_level_error_is_an_event_and_remembered(network: MemoryNetwork) -> None:
    server = FakeServer()
    async with make_client(network) as client:
        await connect(client, network.listen("a", server.handle))
        await (await server.session()).send(Error(code=ErrorCode.MAILBOX_DIRTY))
        event = await client.next_event(timeout=2)
        assert event.name == "ERROR"
        assert client.last_error is not None
        assert client.last_error.action is ClientAction.PULL_MAILBOX_AGAIN


async def test_unknown_opcodes_are_skipped_27_1_2(network: MemoryNetwork) -> None:
    server = FakeServer()
    async with make_client(network) as client:
        await connect(client, network.listen("a", server.handle))
        session = await server.session()
        await session.conn.send_raw(frame_bytes(0xF0AA, b"\x81\xa1x\x01"))
        await session.send(PushEvents(last_pushed_user_seq=5))
        event = await client.next_event(timeout=2)
        assert event.name == "PUSH_EVENTS" and client.unknown_frames == 1


async def test_byte_stream_keeps_frames_glued_to_auth_ok_and_reassembles_chunks() -> None:
    network = MemoryNetwork(message_framed=False, chunk_size=3)
    push = PushEvents(events=(SyncEntry(mailbox_seq=121, conversation_id="c1"),))

    async def glued(transport: MemoryTransport) -> None:
        await transport.recv()  # the start of AUTH is enough here
        await transport.send(encode_frame(DEFAULT_AUTH_OK, 1) + encode_frame(push))
        await asyncio.Event().wait()

    try:
        async with make_client(network) as client:
            assert await connect(client, network.listen("a", glued)) == DEFAULT_AUTH_OK
            assert (await client.next_event(timeout=2)).body == push
    finally:
        await network.close()


class BreakableTransport:
    """A MemoryTransport whose sends fail once ``broken`` is set (a socket that died)."""

    def __init__(self, inner: MemoryTransport) -> None:
        self.inner = inner
        self.broken = False
        self.message_framed = inner.message_framed

    async def send(self, data: bytes) -> None:
        if self.broken:
            raise TransportClosed("broken pipe")
        await self.inner.send(data)

    async def recv(self) -> bytes:
        return await self.inner.recv()

    async def close(self) -> None:
        await self.inner.close()


async def test_a_failed_send_closes_the_client_with_a_clear_error(network: MemoryNetwork) -> None:
    url = network.listen("a", FakeServer().handle)
    transports: list[BreakableTransport] = []

    async def dial(target: str) -> BreakableTransport:
        transports.append(BreakableTransport(await network.dial(target)))
        return transports[-1]

    client = QimClient(dial=dial, heartbeat=HeartbeatConfig(enabled=False))
    await connect(client, url)
    transports[0].broken = True
    with pytest.raises(ConnectionClosedError, match="send failed"):
        await client.pull_mailbox(0)
    assert client.state is ClientState.CLOSED
