"""Login-sync harness shared by test_login_sync and test_login_sync_26_2 (issue 5).

The real pipeline (``qim.apps.conversation`` = ConversationWriter + FanoutCoordinator, and
``qim.apps.mailbox`` = MailboxNode, as ``faust worker`` processes), an in-process syncing
ConnectionNode (routing and ``mailbox_sync`` on, owning every ConnectionShard), SDK clients,
and :class:`FrameRecorder`: a dialer that records every frame a client sends and receives, in
wire order, so a test can assert on runtime traffic (spec 26.2.1: "packet capture").
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from qim.client import HeartbeatConfig, QimClient
from qim.client.dial import open_transport
from qim.client.transport import Transport
from qim.devstack.stack import CONVERSATION_PARTITION_COUNT, Stack
from qim.schemas.frames import EventType, Frame, FrameDecoder, Role, SyncEntry, UnknownFrame
from tests.gateway_support import Gateway, owning_gateway
from tests.integration.mailbox_support import Client as MailboxProbe
from tests.integration.mailbox_support import Node as MailboxWorker
from tests.integration.test_admin_groups import WRITER_ENV, writer_serving
from tests.integration.test_gateway_routing import SETTINGS
from tests.integration.workers import FaustWorker

WAIT_S = 60.0
MESSAGE_TYPES = (EventType.MESSAGE, EventType.MENTION)


def new_client(recorder: FrameRecorder | None = None) -> QimClient:
    dial = recorder.dial if recorder is not None else None
    return QimClient(heartbeat=HeartbeatConfig(enabled=False), request_timeout=20, dial=dial)


@contextlib.asynccontextmanager
async def syncing_gateway(stack: Stack, name: str) -> AsyncIterator[Gateway]:
    """A routing node with login sync, owning every ConnectionShard through its own group."""
    async with owning_gateway(
        stack.cfg.kafka.bootstrap,
        f"qim-gw-sync-{uuid.uuid4().hex[:8]}",
        f"ws://{name}",
        settings=SETTINGS,
        node_id=name,
        route_requests=True,
        mailbox_sync=True,
        conversation_partition_count=CONVERSATION_PARTITION_COUNT,
    ) as gw:
        yield gw


@contextlib.asynccontextmanager
async def pipeline(
    stack: Stack, base: Path, writer_env: dict[str, str] | None = None
) -> AsyncIterator[MailboxWorker]:
    """The conversation and mailbox workers, started side by side; stopped on exit.
    ``writer_env`` adds to the writer's environment (e.g. ``QIM_CUSTOM_TYPES``)."""
    env = {**WRITER_ENV, **(writer_env or {})}
    writer = FaustWorker(stack, "qim.apps.conversation", base / "conversation", env)
    mailbox = MailboxWorker(stack, base / "mailbox")
    try:
        await asyncio.gather(asyncio.to_thread(writer.start), mailbox.start())
        await asyncio.gather(writer_serving(writer), mailbox.serving(WAIT_S))
        yield mailbox
    finally:
        await asyncio.gather(asyncio.to_thread(writer.stop), mailbox.stop(), return_exceptions=True)


def from_sender(entries: Sequence[SyncEntry], sender: str) -> list[SyncEntry]:
    return [e for e in entries if e.sender_id == sender and e.event_type in MESSAGE_TYPES]


def from_alice(entries: Sequence[SyncEntry]) -> list[SyncEntry]:
    return from_sender(entries, "alice")


async def materialized(
    probe: MailboxProbe, tenant: str, user: str, count: int, sender: str = "alice"
) -> None:
    """Wait until ``user``'s mailbox serves ``count`` messages of ``sender`` (asked of the
    MailboxNode directly), so a login's W[lane] snapshot is known to cover them."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while len(from_sender(await probe.pull_all(tenant, user), sender)) < count:
        assert loop.time() < deadline, f"{user}'s mailbox never held {count} messages"
        await asyncio.sleep(0.3)


@dataclass(frozen=True, slots=True)
class Recorded:
    """One frame on the wire: ``connection`` counts the recorder's dials from 0."""

    connection: int
    outbound: bool  # sent by the client
    frame: Frame | UnknownFrame

    @property
    def name(self) -> str:
        return self.frame.name if isinstance(self.frame, Frame) else "UNKNOWN"


@dataclass(slots=True)
class FrameRecorder:
    """A :data:`~qim.client.dial.Dialer` that tees every frame into ``frames``, in order.

    Frames are decoded with a private FrameDecoder per direction, so the SDK's own decoding
    is untouched; only message-framed transports (``ws://``) are supported."""

    frames: list[Recorded] = field(default_factory=list)
    dials: int = 0

    async def dial(self, url: str) -> Transport:
        inner = await open_transport(url)
        assert inner.message_framed, "the recorder decodes one frame per message"
        self.dials += 1
        return _Tee(inner, self, self.dials - 1)

    def received(self, connection: int | None = None) -> list[Frame | UnknownFrame]:
        return [
            r.frame
            for r in self.frames
            if not r.outbound and (connection is None or r.connection == connection)
        ]

    def sent(self, connection: int | None = None) -> list[Frame | UnknownFrame]:
        return [
            r.frame
            for r in self.frames
            if r.outbound and (connection is None or r.connection == connection)
        ]


class _Tee:
    def __init__(self, inner: Transport, recorder: FrameRecorder, connection: int) -> None:
        self._inner, self._recorder, self._connection = inner, recorder, connection
        self._in = FrameDecoder(Role.CLIENT)
        self._out = FrameDecoder(Role.SERVER)

    @property
    def message_framed(self) -> bool:
        return True

    def _record(self, data: bytes, outbound: bool) -> None:
        frame = (self._out if outbound else self._in).receive_message(data)
        if frame is not None:
            self._recorder.frames.append(Recorded(self._connection, outbound, frame))

    async def send(self, data: bytes) -> None:
        self._record(data, True)
        await self._inner.send(data)

    async def recv(self) -> bytes:
        data = await self._inner.recv()
        self._record(data, False)
        return data

    async def close(self) -> None:
        await self._inner.close()
