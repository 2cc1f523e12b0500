"""A DEGRADED connection sends no stale real-time frame and catches up from its mailbox
(spec 11.3.1, 12.6; issue 15.3).

The real pipeline, a syncing gateway with small watermarks (soft 256 KiB) and a long
``idle_timeout`` (the connection is not closed, it stays DEGRADED while its reader is stopped),
and two SDK devices: alice sends, bob's phone stops reading its socket (the slow client of
``test_slow_client``).

1. alice sends a burst of 8 KiB group messages: bob's backlog reaches soft, the gateway marks
   the connection DEGRADED and drops its pending real-time queue (PUSH_EVENTS and the
   SESSION_DELTA / BADGE_UPDATE notices), signalling MAILBOX_DIRTY;
2. still DEGRADED, alice sends more messages: nothing of them is queued for bob;
3. bob reads again: he receives what was already in the socket, the MAILBOX_DIRTY, and no
   PUSH_EVENTS or SESSION_DELTA about any message of step 2 -- ever (each of their pushes is
   counted as a degraded drop before he reads again: the positive barrier); once the connection
   is back to NORMAL a new message is pushed to him again;
4. bob's SDK pulls its mailbox (the PONG / ERROR rule) and holds every message exactly once,
   the same set the MailboxNode serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from websockets.asyncio.client import ClientConnection

from qim.client import HeartbeatConfig, Identity, QimClient, QimError
from qim.client.transport import Transport
from qim.core.push import FlowState
from qim.devstack.stack import CONVERSATION_PARTITION_COUNT, Stack
from qim.schemas.frames import (
    Error,
    ErrorCode,
    Frame,
    FrameDecoder,
    PushEvents,
    Role,
)
from qim.schemas.frames.history import SessionDelta
from tests.gateway_support import Gateway, owning_gateway
from tests.integration.login_support import from_alice, pipeline
from tests.integration.mailbox_support import Client as MailboxProbe
from tests.integration.online_support import connect, online, until, warm_up
from tests.integration.test_slow_client import (
    PAYLOAD,
    SETTINGS,
    StallDialer,
    StalledReader,
    keep_alive,
    metric,
    seen,
)

pytestmark = pytest.mark.integration

BURST = 100
WHILE_DEGRADED = 10


class RecordingReader(StalledReader):
    """A stalled reader that also decodes every frame it hands to the SDK, in wire order."""

    def __init__(self, ws: ClientConnection) -> None:
        super().__init__(ws)
        self.frames: list[Frame] = []
        self._decoder = FrameDecoder(Role.CLIENT)

    async def recv(self) -> bytes:
        data = await super().recv()
        frame = self._decoder.receive_message(data)
        if isinstance(frame, Frame):
            self.frames.append(frame)
        return data


class RecordingDialer(StallDialer):
    async def dial(self, url: str) -> Transport:
        await super().dial(url)
        assert self.transport is not None
        self.transport = recording = RecordingReader(self.transport.ws)
        return recording


@contextlib.asynccontextmanager
async def degrading_gateway(stack: Stack) -> AsyncIterator[Gateway]:
    async with owning_gateway(
        stack.cfg.kafka.bootstrap,
        f"qim-gw-degr-{uuid.uuid4().hex[:8]}",
        "ws://gw",
        settings=SETTINGS,
        node_id="gw-degraded",
        route_requests=True,
        mailbox_sync=True,
        conversation_partition_count=CONVERSATION_PARTITION_COUNT,
        idle_timeout_ms=600_000,  # stays DEGRADED while not reading: never closed here
        socket_send_buffer_bytes=8 * 1024,
    ) as gw:
        yield gw


async def mailbox_seq_of(probe: MailboxProbe, tenant: str, message_id: bytes) -> int:
    """The mailbox_seq of bob's entry for this message, once his MailboxNode materialized it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:
        entries = await probe.pull_all(tenant, "bob")
        seqs = [e.mailbox_seq for e in entries if e.message_id == message_id]
        if seqs:
            return max(seqs)
        assert loop.time() < deadline, "the message never reached bob's mailbox"
        await asyncio.sleep(0.1)


async def test_a_degraded_connection_gets_no_stale_realtime_frame_and_catches_up_from_the_mailbox(
    stack: Stack, tmp_path: Path
) -> None:
    tenant, group = f"t-degr-{uuid.uuid4().hex[:6]}", f"g:degr-{uuid.uuid4().hex[:8]}"
    dialer = RecordingDialer()
    async with (
        pipeline(stack, tmp_path),
        MailboxProbe(stack.cfg.kafka.bootstrap) as probe,
        degrading_gateway(stack) as gw,
        online(gw, tenant, "alice", "phone") as alice,
    ):
        client = QimClient(
            heartbeat=HeartbeatConfig(enabled=False), request_timeout=30, dial=dialer.dial
        )
        token = await gw.token("bob", "phone", tenant)
        bob = await connect(gw.ws_url, token, Identity(tenant, "bob"), "phone", client=client)
        reader = dialer.transport
        assert isinstance(reader, RecordingReader)
        pinger = asyncio.create_task(keep_alive([alice], dialer))
        try:
            sender = alice.result.client
            await sender.create_group(group, ("bob",))

            async def send(i: int, payload: bytes = b"w") -> bytes:
                while True:
                    try:
                        ack = await sender.send_message(
                            group, payload, client_message_id=f"m{i}-{len(payload)}"
                        )
                        return ack.message_id
                    except QimError as exc:
                        if exc.code != ErrorCode.RATE_LIMITED:
                            raise
                        await asyncio.sleep((exc.retry_after_ms or 500) / 1000)

            await warm_up(send, [bob])  # presence is warm: bob is really pushed to
            reader.reading.clear()  # bob stops reading his socket

            burst = [await send(1000 + i, PAYLOAD) for i in range(BURST)]
            await until(
                lambda: (
                    (seen(gw, "qim_gateway_flow_transitions_total", {"state": "DEGRADED"}) or 0)
                    >= 1
                ),
                "bob never became DEGRADED",
            )
            assert metric(gw, "mailbox_dirty_sent_total") >= 1
            late = [await send(5000 + i) for i in range(WHILE_DEGRADED)]
            (conn,) = [c for c in gw.node.connections.values() if c.session.grant
                       and c.session.grant.user_id == "bob"]  # fmt: skip
            # the barrier for "every late message was decided on": bob's connection was offered
            # the push of the last late message's mailbox entry while still DEGRADED
            last_seq = await mailbox_seq_of(probe, tenant, late[-1])
            pushes = conn.session.pushes
            assert pushes is not None
            await until(
                lambda: pushes.decided_seq >= last_seq,
                "the late pushes never reached the DEGRADED connection",
            )
            assert conn.session.flow_state is FlowState.DEGRADED
            # SESSION_DELTAs were dropped (purged at the degradation or refused while degraded)
            drops = {"frame": "SESSION_DELTA"}
            await until(
                lambda: (seen(gw, "qim_gateway_degraded_drops_total", drops) or 0) >= 1,
                "no SESSION_DELTA was dropped while DEGRADED",
            )
            assert conn.outbound.queued_notices == 0  # nothing real-time waits for bob
            assert conn.outbound.queued_pushes == 0

            reader.reading.set()  # bob reads again
            normal = {"state": "NORMAL"}
            await until(
                lambda: (seen(gw, "qim_gateway_flow_transitions_total", normal) or 0) >= 1,
                "bob's connection never recovered",
            )
            final = await send(9000)
            await until(lambda: bool(bob.of(final)), "no push after the recovery")

            late_ids = set(late)
            stale = [
                f.name
                for f in reader.frames
                if (isinstance(f.body, PushEvents)
                    and any(e.message_id in late_ids for e in f.body.events))
                or (isinstance(f.body, SessionDelta) and f.body.last_message_id in late_ids)
            ]  # fmt: skip
            assert stale == []  # nothing decided while DEGRADED reached bob
            dirty = [f for f in reader.frames if isinstance(f.body, Error)]
            assert [e.body.code for e in dirty if isinstance(e.body, Error)].count(
                ErrorCode.MAILBOX_DIRTY
            ) >= 1
            assert len([m for m in burst if bob.of(m)]) < BURST  # the burst's tail was dropped

            # catch up from the mailbox: every message, once
            everything = [*burst, *late, final]
            await bob.holds(everything)
            got = [e for e in from_alice(bob.delivered) if e.message_id in set(everything)]
            keys = [(e.message_id, e.event_id) for e in got]
            assert len(keys) == len(set(keys)) == len(everything)
            server = {
                e.message_id
                for e in await probe.pull_all(tenant, "bob")
                if e.message_id in set(everything)
            }
            assert server == set(everything)  # == the UserMailboxEntry set
        finally:
            pinger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pinger
            reader.reading.set()
            await bob.close()
