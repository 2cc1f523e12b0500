"""A tiny in-process stand-in for a ConnectionNode, for the SDK's unit tests only.

Built on the codec and a :class:`~qim.client.Transport` (any of them), never on qim.gateway:
the first frame must be AUTH, answered by ``verdict`` (AUTH_OK by default; an ERROR or a
REDIRECT closes the connection after it); PING is answered with PONG; every other request goes
to ``on_request``, which may answer, hold, reorder or close. Tests push server-initiated frames
through :meth:`FakeSession.send`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from qim.client import FramedConnection, Transport, TransportClosed, route_token_of
from qim.schemas.frames import (
    Auth,
    AuthOk,
    Body,
    Frame,
    Ping,
    Pong,
    ProtocolError,
    Role,
    UnknownFrame,
)

SERVER_TIME = 1_700_000_000_000
WAIT_S = 2.0  # hard upper bound of every wait in these tests; none is reached when green
DEFAULT_AUTH_OK = AuthOk(
    session_epoch=7,
    lane_id=3,
    lane_watermark=120,
    trim_watermark=5,
    sync_to_seq=120,
    has_offline=True,
    total_unread=4,
    next_ping_interval_ms=30_000,
)

Verdict = Callable[[Auth, bytes], Body]
RequestHandler = Callable[["FakeSession", Frame], Awaitable[None]]


def frame_bytes_of(frame: Frame) -> bytes:
    """The exact wire bytes of a decoded (unfragmented) frame."""
    return frame.header.pack() + frame.raw_body


@dataclass
class FakeSession:
    """One authenticated connection on the fake server."""

    conn: FramedConnection
    auth: Auth
    route_token: bytes
    received: list[Frame] = field(default_factory=list)

    async def send(self, body: Body, request_id: int = 0) -> None:
        await self.conn.send(body, request_id=request_id)

    async def close(self) -> None:
        await self.conn.close()


class FakeServer:
    """Configurable fake; ``sessions`` fills as clients authenticate."""

    def __init__(
        self,
        *,
        verdict: Verdict | None = None,
        on_request: RequestHandler | None = None,
        answer_pings: bool = True,
        last_pushed_user_seq: int = 0,
        mailbox_dirty: bool = False,
        next_ping_interval_ms: int = 30_000,
    ) -> None:
        self.verdict: Verdict = verdict or (lambda auth, token: DEFAULT_AUTH_OK)
        self.on_request = on_request
        self.answer_pings = answer_pings
        self.last_pushed_user_seq = last_pushed_user_seq
        self.mailbox_dirty = mailbox_dirty
        self.next_ping_interval_ms = next_ping_interval_ms
        self.auth_frames: list[Frame] = []
        self.sessions: list[FakeSession] = []
        self._session_added = asyncio.Event()
        self._frame_seen = asyncio.Condition()

    async def session(self, index: int = 0) -> FakeSession:
        """Wait (at most WAIT_S) until session ``index`` exists."""
        async with asyncio.timeout(WAIT_S):
            while len(self.sessions) <= index:
                self._session_added.clear()
                await self._session_added.wait()
        return self.sessions[index]

    async def wait_received(
        self, predicate: Callable[[list[Frame]], bool], index: int = 0
    ) -> list[Frame]:
        """Wait (at most WAIT_S) until session ``index``'s frames satisfy ``predicate``."""
        session = await self.session(index)
        async with asyncio.timeout(WAIT_S), self._frame_seen:
            await self._frame_seen.wait_for(lambda: predicate(session.received))
        return session.received

    async def handle(self, transport: Transport) -> None:
        """Serve one connection until it closes."""
        conn = FramedConnection(transport, Role.SERVER)
        try:
            await self._serve(conn)
        except (TransportClosed, ProtocolError):
            pass
        finally:
            with contextlib.suppress(Exception):
                await conn.close()

    async def _serve(self, conn: FramedConnection) -> None:
        first = await conn.recv()
        if isinstance(first, UnknownFrame) or not isinstance(first.body, Auth):
            return
        self.auth_frames.append(first)
        token = route_token_of(first)
        reply = self.verdict(first.body, token)
        await conn.send(reply, request_id=first.header.request_id)
        if not isinstance(reply, AuthOk):
            return
        session = FakeSession(conn, first.body, token)
        self.sessions.append(session)
        self._session_added.set()
        while True:
            frame = await conn.recv()
            if isinstance(frame, UnknownFrame):
                continue
            session.received.append(frame)
            async with self._frame_seen:
                self._frame_seen.notify_all()
            body = frame.body
            if isinstance(body, Ping):
                if self.answer_pings:
                    await session.send(self.pong_for(body), frame.header.request_id)
            elif self.on_request is not None:
                await self.on_request(session, frame)

    def pong_for(self, ping: Ping) -> Pong:
        return Pong(
            ping_id=ping.ping_id,
            server_time=SERVER_TIME,
            echo_client_time=ping.client_time,
            last_pushed_user_seq=self.last_pushed_user_seq,
            mailbox_dirty=self.mailbox_dirty,
            next_ping_interval_ms=self.next_ping_interval_ms,
            idle_timeout_ms=self.next_ping_interval_ms * 2 + 10_000,
        )
