"""One live connection: a Session, its OutboundQueue, and the writer task over a Transport.

The drivers (``ws.py``, ``tcp.py``) only read bytes and call ``feed_message`` / ``feed_data``;
everything the session decides is performed by ``apply``. Node-level work (authentication,
device registry, presence, metrics) goes through :class:`ConnectionHooks`.

Closing: a Close action marks the connection closing and wakes the writer, which writes what
is queued (the ERROR / KICKED / REDIRECT that explains the close) for at most
``close_flush_timeout_ms``, then closes the transport; the driver's read loop then ends.

Flow control (11.3): a PUSH_EVENTS stays on the session's ledger until the writer *measures*
that its last byte left the transport's buffer (:class:`~qim.gateway.transport.sendbuf.InFlight`),
so a client that stops reading drives the level to the soft watermark (DEGRADED: the queued push
frames are purged, MAILBOX_DIRTY is signalled) and, with no consumption for ``idle_timeout``,
to CLOSING. While pushes are pending the writer re-measures every ``drain_poll_ms``, also
while a ``send`` is blocked on a full buffer. Stream 0 keeps strict priority in the queue and
the purge never touches it (I-25). Each change of the buffered octets is reported to the
node's :class:`~qim.gateway.transport.budget.NodeSendBudget` (11.3.3). With a ``merge`` (the node's
``session_delta_merge_window``, 12.6.3) SESSION_DELTA / BADGE_UPDATE sends are held there and
come back through :meth:`Connection.deliver_merged`; a close discards them.

DEGRADED drops the *whole* pending real-time queue (11.3.1): the queued PUSH_EVENTS and the
queued notices (every server-initiated stream-1 frame: SESSION_DELTA, BADGE_UPDATE, READ_SYNC
are absolute values that the mailbox and the session list repair, 12.6; a relayed TYPING is
ephemeral), also those still in the merge window; while DEGRADED no new
notice is queued either (a drop after the degradation's ERROR{MAILBOX_DIRTY} sets the PONG's
``mailbox_dirty``). Replies on stream 1 (SEND_ACK, ONLINE_READY) are never dropped;
``qim_gateway_degraded_drops_total{frame}`` counts the drops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from qim.core.push import ConnectionLoad, FlowState
from qim.gateway.actions import (
    Action,
    Authenticate,
    Close,
    CloseReason,
    Count,
    Forward,
    Send,
    SendPush,
)
from qim.gateway.push.delta_merge import SessionFrameMerge
from qim.gateway.session import Session
from qim.gateway.transport.budget import NodeSendBudget
from qim.gateway.transport.outbound import OutboundQueue, PushTag
from qim.gateway.transport.sendbuf import InFlight, push_pieces
from qim.schemas.frames import DEFAULT_CHUNK_BYTES, Frame, Stream, encode_fragments, spec_for_model
from qim.schemas.frames.history import BadgeUpdate, SessionDelta

__all__ = ["Connection", "ConnectionHooks", "Transport"]

log = logging.getLogger(__name__)
DEFAULT_DRAIN_POLL_MS = 50


def _notice(send: Send) -> str:
    """The frame name when ``send`` is a notice, else "": a server-initiated stream-1 frame
    (request_id 0: SESSION_DELTA, BADGE_UPDATE, READ_SYNC, a relayed TYPING, ...), which
    DEGRADED drops (absolute values a pull repairs, 12.6; ephemeral ones are only lost). A
    frame with a request_id answers a request (SEND_ACK, ONLINE_READY) and is never dropped."""
    if send.request_id:
        return ""
    spec = spec_for_model(type(send.body))
    stream = spec.stream if send.stream is None else send.stream
    return spec.name if stream == Stream.REALTIME else ""


class Transport(Protocol):
    """A byte pipe: WebSocket (one frame piece per message) or TLS/TCP (a byte stream)."""

    async def send(self, pieces: list[bytes]) -> None: ...

    def buffered_bytes(self) -> int:
        """Octets handed to ``send`` that are still in the transport's own buffer."""
        ...

    async def close(self) -> None: ...


class ConnectionHooks(Protocol):
    """What a connection asks of its node."""

    def authenticate(self, conn: Connection, action: Authenticate) -> None: ...

    def forward(self, conn: Connection, frame: Frame) -> None: ...

    def count(self, conn: Connection, action: Count) -> None: ...

    def activity(self, conn: Connection) -> None: ...

    def closing(self, conn: Connection, reason: CloseReason) -> None: ...

    def pushed(self, conn: Connection, mailbox_seq: int) -> None: ...

    def finished(self, conn: Connection) -> None: ...


class Connection:
    """Session + outbound queue + writer task; identity ``conn_id`` is unique per node boot."""

    def __init__(
        self,
        conn_id: str,
        session: Session,
        transport: Transport,
        hooks: ConnectionHooks,
        *,
        clock_ms: Callable[[], int],
        peer_ip: str = "",
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        hard_watermark_bytes: int = 4 * 1024 * 1024,
        close_flush_timeout_ms: int = 2_000,
        budget: NodeSendBudget | None = None,
        drain_poll_ms: int = DEFAULT_DRAIN_POLL_MS,
        merge: SessionFrameMerge | None = None,
    ) -> None:
        self.conn_id = conn_id
        self.session = session
        self.transport = transport
        self.peer_ip = peer_ip
        self.on_authenticated: Callable[[], None] | None = None  # set by the driver
        self.outbound = OutboundQueue()
        self.inflight = InFlight()
        self.scheduled_ms: int | None = None  # the timing-wheel deadline it sits at
        self._hooks = hooks
        self._clock_ms = clock_ms
        self._chunk = chunk_bytes
        self._hard = hard_watermark_bytes
        self._flush_timeout = close_flush_timeout_ms / 1000
        self._poll = drain_poll_ms / 1000
        self._budget = budget
        self._merge = merge
        self._wakeup = asyncio.Event()
        self._closing = False
        self._writer: asyncio.Task[None] | None = None
        self._flow_seen: FlowState | None = None
        self._consumed_ms = clock_ms()  # last time the socket took bytes (or had none)
        self.pushed_seq = 0  # 16.1.2 PUSHED: the largest mailbox_seq whose frame left the buffer
        self.delivered_seq = 0  # ... and whose bytes the peer's kernel acknowledged

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def buffered_bytes(self) -> int:
        """Everything not yet out of the transport: queued pieces + its buffer (11.3.3)."""
        return self.outbound.buffered_bytes + self.inflight.buffered

    def __repr__(self) -> str:
        return f"<Connection {self.conn_id} {self.session.state.name} {self.peer_ip}>"

    # -- driver side ----------------------------------------------------------------------------

    def authenticated(self) -> None:
        """AUTH_OK was decided: the driver may now accept full-size messages (before it,
        ``on_authenticated`` keeps its own inbound limit at one AUTH frame, issue 15.2)."""
        hook, self.on_authenticated = self.on_authenticated, None
        if hook is not None:
            hook()

    def feed_message(self, message: bytes) -> None:
        self.apply(self.session.receive_message(message, self._clock_ms()))

    def feed_data(self, data: bytes) -> None:
        self.apply(self.session.receive_data(data, self._clock_ms()))

    async def run(self, read_loop: Callable[[Connection], Awaitable[None]]) -> None:
        """Drive the connection until both directions are done; never raises for I/O."""
        self._writer = asyncio.create_task(self._write_loop(), name=f"write-{self.conn_id}")
        try:
            await read_loop(self)
        except (ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
            log.debug("%r read ended: %r", self, exc)
        finally:
            self.apply(self.session.peer_closed(self._clock_ms()))
            await self._writer

    # -- actions --------------------------------------------------------------------------------

    def apply(self, actions: list[Action]) -> None:
        """Perform the session's actions in order."""
        for action in actions:
            if isinstance(action, SendPush):
                self._enqueue_push(action)
            elif isinstance(action, Send):
                if self._dropped_notice(action):
                    continue
                if self._merge is not None and isinstance(action.body, SessionDelta | BadgeUpdate):
                    if not self._closing:
                        self._merge.hold(self, action.body)
                else:
                    self._enqueue(action)
            elif isinstance(action, Close):
                self._begin_close(action.reason)
            elif isinstance(action, Authenticate):
                self._hooks.authenticate(self, action)
            elif isinstance(action, Forward):
                self._hooks.forward(self, action.frame)
            else:
                self._hooks.count(self, action)
        self._check_flow()
        if actions and not self.session.closed:
            self._hooks.activity(self)

    def deliver_merged(self, frames: tuple[SessionDelta | BadgeUpdate, ...]) -> None:
        """The merge window ended: its frames go out now, at the session's current version."""
        for body in frames:
            if self._closing or self.session.closed:
                return
            self._enqueue(Send(body, version=self.session.version))
        self._check_flow()

    def _dropped_notice(self, send: Send) -> bool:
        """A notice while DEGRADED is not queued (nor held for merging): only a flag is kept."""
        if self.session.flow_state not in (FlowState.DEGRADED, FlowState.CLOSING):
            return False
        name = _notice(send)
        if not name:
            return False
        self._hooks.count(self, Count("degraded_drop", name))
        self.session.notice_dropped()  # the next PONG says mailbox_dirty
        return True

    def _enqueue(self, send: Send) -> None:
        if self._dropped_notice(send):
            return
        spec = spec_for_model(type(send.body))
        stream = spec.stream if send.stream is None else send.stream
        pieces = encode_fragments(
            send.body,
            send.request_id,
            stream,
            version=send.version,
            chunk_bytes=self._chunk,
            max_frame_bytes=self.session.config.limits.max_frame_bytes,
        )
        self.outbound.push(pieces, stream, notice=_notice(send))
        self._queued()
        if stream != Stream.CONTROL and self.buffered_bytes > self._hard:
            self.apply(self.session.shutdown(CloseReason.SLOW_CONSUMER, self._clock_ms()))

    def _enqueue_push(self, push: SendPush) -> None:
        """The spliced body as is, behind this socket's own header (10.3)."""
        pieces = push_pieces(
            push.body,
            version=push.version,
            chunk_bytes=self._chunk,
            max_frame_bytes=self.session.config.limits.max_frame_bytes,
        )
        wire = sum(len(p) for p in pieces)
        tag = PushTag(push.ledger_bytes, wire, push.priority, push.mailbox_seq)
        if not self._pushes_pending():  # the no-consumption clock starts with a backlog
            self._consumed_ms = self._clock_ms()
        self.outbound.push(pieces, Stream.REALTIME, tag)
        self._queued()

    def _queued(self) -> None:
        self._wakeup.set()
        self._report_load()

    def _begin_close(self, reason: CloseReason) -> None:
        if self._closing:
            return
        self._closing = True
        self.outbound.purge_pushes()  # the next session's sync covers them (11.3.1)
        self.outbound.purge_stream(Stream.REALTIME)  # session frames too: nothing after KICKED
        if self._merge is not None:
            self._merge.discard(self)  # and the ones still in the merge window
        self._wakeup.set()
        self._hooks.closing(self, reason)

    # -- flow control (11.3) ------------------------------------------------------------------

    def _check_flow(self) -> None:
        """React once to each flow-state change, however deeply ``apply`` nested."""
        state, before = self.session.flow_state, self._flow_seen
        if state is before:
            return
        self._flow_seen = state
        if state is None or before is None:  # AUTH_OK: NORMAL is where it starts
            return
        self._hooks.count(self, Count("flow", state.value))
        if state is FlowState.DEGRADED:  # drop the pending real-time queue, keep a flag
            self.outbound.purge_stream(Stream.ROOM)  # and room frames first of all (11.3.2)
            tags = self.outbound.purge_pushes()
            self.session.push_purged(sum(t.ledger_bytes for t in tags), len(tags))
            for _ in tags:
                self._hooks.count(self, Count("degraded_drop", "PUSH_EVENTS"))
            self._purge_notices()
            self._report_load()

    def _purge_notices(self) -> None:
        """The queued notices go with the pushes; the degradation's MAILBOX_DIRTY covers them."""
        for name in self.outbound.purge_notices():
            self._hooks.count(self, Count("degraded_drop", name))
        if self._merge is not None:
            self._merge.discard(self)

    def _measure(self) -> None:
        """Read the transport's buffer: drain the frames that left, or detect a stall."""
        before = self.inflight.left
        gone = self.inflight.measure(self.transport.buffered_bytes())
        now = self._clock_ms()
        if self.inflight.left > before or not self._pushes_pending():
            self._consumed_ms = now
        if gone:
            self.pushed_seq = max(self.pushed_seq, *(t.mailbox_seq for t in gone))
            self._hooks.pushed(self, self.pushed_seq)  # 16.1.2 PUSHED
            ledger = sum(t.ledger_bytes for t in gone)
            self.apply(self.session.push_drained(ledger, len(gone), now))
        elif now - self._consumed_ms >= self.session.config.idle_timeout_ms:
            self.apply(self.session.push_idle(now))  # 11.3.1: no consumption -> CLOSING
        self._report_load()

    def peer_acked(self) -> bool:
        """Whether every byte handed to the kernel so far was acknowledged by the peer's TCP
        (16.1.2: data of a live connection reaches the peer kernel; a silently dead or
        stalled peer's does not). A transport that cannot tell (a test double) says yes."""
        probe = getattr(self.transport, "unacked_bytes", None)
        unacked = probe() if probe is not None else 0
        return unacked == 0

    def _pushes_pending(self) -> bool:
        return bool(self.inflight) or self.outbound.queued_pushes > 0

    def _report_load(self) -> None:
        if self._budget is not None:
            self._budget.update(self, self.buffered_bytes)

    # -- the node budget's side (BudgetMember) ---------------------------------------------------

    def send_load(self) -> ConnectionLoad:
        large = small = 0
        for tag in self.outbound.push_tags():
            if tag.priority == "large_group":
                large += tag.wire_bytes
            elif tag.priority == "small_group":
                small += tag.wire_bytes
        return ConnectionLoad(
            self.conn_id, self.buffered_bytes, large_group_bytes=large, small_group_bytes=small
        )

    def shed_pushes(self, classes: frozenset[str]) -> None:
        """11.3.3 steps 2-3: drop these classes' queued pushes and go DEGRADED + dirty."""
        tags = self.outbound.purge_pushes(lambda t: t.priority in classes)
        for tag in tags:
            self._hooks.count(self, Count("push_drop", tag.priority))
        ledger = sum(t.ledger_bytes for t in tags)
        if self.session.flow_state is FlowState.NORMAL:
            self._hooks.count(self, Count("flow", FlowState.DEGRADED.value))
        self._flow_seen = FlowState.DEGRADED  # already purged: no second purge
        self._purge_notices()
        self.apply(self.session.push_over_budget(ledger, len(tags), self._clock_ms()))
        self._report_load()

    def close_over_budget(self) -> None:
        """11.3.3 step 5: close, largest buffers first (the budget chose us)."""
        self._hooks.count(self, Count("slow_connection_closed", "node_send_buffer_budget"))
        now = self._clock_ms()
        self.apply(self.session.shutdown(CloseReason.SLOW_CONSUMER, now, "node budget"))

    # -- writer -----------------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        try:
            while True:
                batch = self.outbound.pop_written(self._chunk)
                if batch:
                    self.inflight.wrote(batch)
                    await self._send([piece for piece, _ in batch])
                    self._measure()
                    continue
                if self._closing:
                    break
                self._wakeup.clear()
                if self._pushes_pending():  # bytes in the transport: watch them leave
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wakeup.wait(), self._poll)
                    self._measure()
                else:
                    await self._wakeup.wait()
        except (ConnectionError, OSError, TimeoutError) as exc:
            log.debug("%r write ended: %r", self, exc)
            self.apply(self.session.peer_closed(self._clock_ms()))
        except Exception:
            log.exception("%r writer failed", self)
            self.apply(self.session.peer_closed(self._clock_ms()))
        finally:
            self.outbound.clear()
            if self._budget is not None:
                self._budget.remove(self)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.transport.close(), self._flush_timeout)
            self._hooks.finished(self)

    async def _send(self, pieces: list[bytes]) -> None:
        """``transport.send``, measuring while it waits for a full buffer to drain; once
        closing, bounded by ``close_flush_timeout_ms``."""
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(self.transport.send(pieces))
        deadline: float | None = None
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self._poll)
                if done:
                    task.result()
                    return
                self._measure()
                if self._closing:
                    deadline = deadline or loop.time() + self._flush_timeout
                    if loop.time() >= deadline:
                        raise TimeoutError("close flush timed out")
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
