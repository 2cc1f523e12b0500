"""A Connection over a transport whose buffer the test drains by hand (spec 11.3 tests).

``HeldTransport`` behaves like an asyncio transport under a client that stopped reading: every
byte handed to ``send`` stays in its buffer until the test calls ``consume``; ``send`` blocks
while the buffer is above ``high`` (the websockets / StreamWriter drain). Frames are decoded
as the client would when they are *consumed*, so the test sees what really reached the peer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import msgspec

from qim.core.push import EntryFragment, FlowLimits, PendingPush
from qim.core.push.wire import personal_fragment
from qim.gateway.actions import Authenticate, CloseReason, Count
from qim.gateway.session import SessionConfig
from qim.gateway.transport.budget import NodeSendBudget
from qim.gateway.transport.connection import Connection
from qim.params.values import Watermark
from qim.schemas.frames import Body, Frame, FrameDecoder, Role
from qim.schemas.records.push import FramePriority, PushBody, PushRecipient
from tests.unit.gateway.session_support import CFG, T0, online

LIMITS = FlowLimits(
    soft=Watermark(bytes=40_000, items=1000),
    hard=Watermark(bytes=160_000, items=4000),
    low_bytes=10_000,
    low_items=250,
)
FLOW_CFG = SessionConfig(
    unauth_timeout_ms=CFG.unauth_timeout_ms,
    next_ping_interval_ms=CFG.next_ping_interval_ms,
    idle_timeout_ms=CFG.idle_timeout_ms,
    frag_assembly_timeout_ms=CFG.frag_assembly_timeout_ms,
    flow=LIMITS,
)


class HeldTransport:
    """Bytes stay buffered until ``consume``; ``send`` waits while above ``high``."""

    def __init__(self, high: int = 8_000) -> None:
        self.high = high
        self.held = bytearray()
        self.frames: list[Frame] = []
        self.closed = False
        self._decoder = FrameDecoder(Role.CLIENT)
        self._room = asyncio.Event()
        self._room.set()

    async def send(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            self.held += piece
        while len(self.held) > self.high:
            self._room.clear()
            await self._room.wait()

    def buffered_bytes(self) -> int:
        return len(self.held)

    def consume(self, n: int | None = None) -> None:
        """The peer reads ``n`` octets (all when None) and decodes the frames in them."""
        n = len(self.held) if n is None else min(n, len(self.held))
        data, self.held = bytes(self.held[:n]), self.held[n:]
        self._decoder.receive_data(data)
        while (frame := self._decoder.next_frame()) is not None:
            assert isinstance(frame, Frame)
            self.frames.append(frame)
        if len(self.held) <= self.high:
            self._room.set()

    def bodies(self) -> list[Body]:
        return [f.body for f in self.frames]

    async def close(self) -> None:
        self.closed = True


@dataclass
class Hooks:
    counts: list[tuple[str, str]] = field(default_factory=list)
    closed: list[CloseReason] = field(default_factory=list)
    pushed_seqs: list[int] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def authenticate(self, conn: Connection, action: Authenticate) -> None:
        raise AssertionError("already online")

    def forward(self, conn: Connection, frame: Frame) -> None:
        pass

    def count(self, conn: Connection, action: Count) -> None:
        self.counts.append((action.name, action.label))

    def activity(self, conn: Connection) -> None:
        pass

    def closing(self, conn: Connection, reason: CloseReason) -> None:
        self.closed.append(reason)

    def pushed(self, conn: Connection, mailbox_seq: int) -> None:
        self.pushed_seqs.append(mailbox_seq)

    def finished(self, conn: Connection) -> None:
        self.done.set()


@dataclass
class Live:
    conn: Connection
    transport: HeldTransport
    hooks: Hooks
    clock: list[int]


@contextlib.asynccontextmanager
async def live_connection(
    conn_id: str = "c1", budget: NodeSendBudget | None = None, high: int = 8_000
) -> AsyncIterator[Live]:
    """An online connection (pushes released at AUTH_OK) with its writer running."""
    clock = [T0]
    transport, hooks = HeldTransport(high), Hooks()
    session = online(FLOW_CFG)
    conn = Connection(
        conn_id, session, transport, hooks, clock_ms=lambda: clock[0],
        budget=budget, drain_poll_ms=2, close_flush_timeout_ms=200,
    )  # fmt: skip
    stop = asyncio.Event()

    async def read(_: Connection) -> None:
        await stop.wait()

    task = asyncio.create_task(conn.run(read))
    try:
        yield Live(conn, transport, hooks, clock)
    finally:
        stop.set()
        transport.consume()
        await asyncio.wait_for(task, 5)


def push(seq: int, payload: int = 1_000, priority: FramePriority = "direct") -> PendingPush:
    """A real one-event push (decodable by a client) with a ``payload``-octet body."""
    body = msgspec.msgpack.encode(PushBody(payload_or_ciphertext=b"p" * payload))
    recipient = PushRecipient(
        connection_id="c1", session_epoch=7, user_id="u1", device_id="d1",
        mailbox_seq=seq, event_id=seq,
    )  # fmt: skip
    return PendingPush(
        seq, EntryFragment.of_map(body), (personal_fragment(recipient),), priority=priority
    )
