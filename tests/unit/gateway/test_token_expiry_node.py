"""AT-93 / AT-94 against a real ConnectionNode over a real WebSocket, with a fake clock.

The node's clock is injected (``clock_ms``) and moved by the test, so the 5-minute grace is a
few fake seconds and nothing sleeps; the timing wheel still runs on its real (10 ms) tick and
reads the fake clock, as in production. A frame handler stands in for the router: it answers
PULL_MAILBOX with an empty MAILBOX_BATCH and SEND_MESSAGE with SEND_ACK, and records what it
was handed, which shows a refused write never left the gateway.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from qim.client import HeartbeatConfig, QimClient, QimError
from qim.gateway.actions import Send
from qim.gateway.auth_memory import MemoryAuthenticator
from qim.gateway.config import GatewayConfig
from qim.gateway.node import ConnectionNode, wall_clock_ms
from qim.gateway.transport.connection import Connection
from qim.params import Settings
from qim.schemas.frames import (
    AuthOk,
    Body,
    ClientAction,
    Error,
    ErrorCode,
    Frame,
    MailboxBatch,
    MarkRead,
    PullMailbox,
    SendAck,
    SendMessage,
)
from tests.gateway_support import Gateway, WsClient, memory_mint

GRACE = 5_000
TTL = 60_000
TE = int(ErrorCode.TOKEN_EXPIRED)


@dataclass
class Harness:
    auth: MemoryAuthenticator
    now: int = field(default_factory=wall_clock_ms)
    handled: list[Body] = field(default_factory=list)
    gateway: Gateway = field(init=False)

    def clock(self) -> int:
        return self.now

    def token(self, ttl_ms: int = TTL) -> str:
        return self.auth.issue_token("t1", "u1", "d1", now_ms=self.now, ttl_ms=ttl_ms)

    def handle(self, conn: Connection, frame: Frame) -> None:
        self.handled.append(frame.body)
        rid = frame.header.request_id
        if isinstance(frame.body, PullMailbox):
            conn.apply([Send(MailboxBatch(), request_id=rid)])
        elif isinstance(frame.body, SendMessage):
            ack = SendAck(request_id=rid, client_message_id=frame.body.client_message_id)
            conn.apply([Send(ack, request_id=rid)])

    def expired(self, phase: str) -> float:
        registry = self.gateway.node.metrics.registry
        value = registry.get_sample_value("qim_gateway_token_expired_total", {"phase": phase})
        return value or 0.0


@contextlib.asynccontextmanager
async def harness() -> AsyncIterator[Harness]:
    auth = MemoryAuthenticator()
    settings = Settings.load(overrides={"token_expiry_grace": GRACE}, env={})
    config = GatewayConfig(node_id="gw-expiry", settings=settings, wheel_tick_ms=10)
    h = Harness(auth)
    node = ConnectionNode(config, auth, clock_ms=h.clock, frame_handler=h.handle)
    h.gateway = Gateway(node, memory_mint(auth))
    await node.start()
    try:
        yield h
    finally:
        await node.stop()


async def login(h: Harness, device: str = "d1") -> tuple[WsClient, AuthOk]:
    client = await h.gateway.ws()
    token = h.auth.issue_token("t1", "u1", device, now_ms=h.now, ttl_ms=TTL)
    frame = await client.login(token, device, client_version="1.0")
    assert isinstance(frame, Frame) and isinstance(frame.body, AuthOk), frame
    return client, frame.body


async def test_at94_reads_pass_and_writes_get_token_expired_inside_the_grace() -> None:
    async with harness() as h:
        client, _ = await login(h)
        h.now += TTL + 10  # the token expired 10 ms ago: read-only grace
        assert (await client.ping(ping_id=2, request_id=20)).ping_id == 2
        await client.send(PullMailbox(), 21)
        await client.expect(MailboxBatch)
        await client.send(SendMessage(client_message_id="m1"), 22)
        error = await client.expect(Error)
        assert (error.code, error.request_id) == (TE, 22)
        await client.send(MarkRead(conversation_id="c1", read_conversation_seq=1), 23)
        error = await client.expect(Error)
        assert (error.code, error.request_id) == (TE, 23)
        assert [type(b) for b in h.handled] == [PullMailbox]  # the writes never left
        assert h.expired("grace_write") == 2
        await client.close()


async def test_at94_the_grace_ends_with_token_expired_and_close_for_an_idle_connection() -> None:
    async with harness() as h:
        idle, _ = await login(h)
        busy, _ = await login(h, "d2")
        h.now += TTL + GRACE + 1  # nobody sent anything during the grace
        bodies = await idle.expect_closed()
        assert [(b.code, b.request_id) for b in bodies if isinstance(b, Error)] == [(TE, 0)]
        with contextlib.suppress(Exception):  # the wheel may have closed it already
            await busy.send(PullMailbox(), 31)
        busy_bodies = await busy.expect_closed()
        assert [b.code for b in busy_bodies if isinstance(b, Error)] == [TE]
        assert not any(isinstance(b, MailboxBatch) for b in busy_bodies)
        assert h.expired("closed") == 2


async def test_at93_reauth_in_the_grace_keeps_the_epoch_and_writes_work_again() -> None:
    async with harness() as h:
        client, first = await login(h)
        h.now += TTL + 10
        await client.send(SendMessage(client_message_id="m1"), 40)
        assert (await client.expect(Error)).code == TE
        renewed = await client.login(h.token(ttl_ms=3_600_000), "d1", request_id=41)
        assert isinstance(renewed, Frame) and isinstance(renewed.body, AuthOk), renewed
        assert renewed.header.request_id == 41
        assert renewed.body.session_epoch == first.session_epoch
        await client.send(SendMessage(client_message_id="m2"), 42)
        ack = await client.expect(SendAck)
        assert ack.client_message_id == "m2"
        h.now += GRACE + 1  # past the old token's grace: the renewal moved the expiry
        assert (await client.ping(ping_id=5, request_id=43)).ping_id == 5
        assert h.expired("closed") == 0
        await client.close()


async def test_the_sdk_maps_token_expired_and_renews_on_the_same_connection() -> None:
    async with harness() as h:
        client = QimClient(heartbeat=HeartbeatConfig(enabled=False), request_timeout=5)
        first = await client.connect(h.gateway.ws_url, h.token(), "d1")
        try:
            h.now += TTL + 10
            with pytest.raises(QimError) as refused:
                await client.request(SendMessage(client_message_id="m1"))
            assert refused.value.code == ErrorCode.TOKEN_EXPIRED
            assert refused.value.action is ClientAction.REFRESH_TOKEN_RECONNECT
            renewed = await client.reauth(h.token(ttl_ms=3_600_000))
            assert renewed.session_epoch == first.session_epoch
            frame = await client.request(SendMessage(client_message_id="m2"))
            assert isinstance(frame.body, SendAck) and frame.body.client_message_id == "m2"
        finally:
            await client.close()
