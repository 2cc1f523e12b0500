"""The push half of a :class:`~qim.gateway.session.Session`: ConnectionPush in, actions out.

Why a separate module: the session's protocol rules (AUTH, PING, deadlines) and its online
delivery (9.4, 11.1.1, 11.3) change for different reasons. This mixin holds the second:

* a WritePush becomes :class:`~qim.gateway.actions.SendPush` -- the spliced PUSH_EVENTS bytes
  as they are (10.3: the shared body was encoded once per batch; nothing here decodes or
  re-encodes it);
* the frame stays on the connection's ledger until the driver reports it *left the socket*
  (:meth:`SessionPushes.push_drained`), so a client that stops reading drives the level up to
  ``conn_send_soft_watermark`` (DEGRADED) -- the send buffer is what is really pending;
* SignalDirty is one ERROR{MAILBOX_DIRTY} on stream 0 (never behind push data, I-25),
  CloseConnection a SLOW_CONSUMER close;
* ``mailbox_dirty`` signals are counted (``Count("mailbox_dirty_sent")``), for the PONG path
  too;
* SESSION_DELTA / BADGE_UPDATE / READ_SYNC respect the login barrier like PUSH_EVENTS (12.8.3:
  "in the pull-only phase before ONLINE_READY no deltas arrive"; 9.4): while a synced login
  has not been released they are held, the latest per conversation (and one badge), and
  follow ONLINE_READY and the held pushes -- bounded by the user's conversations, never lost.

Pure like the session: time is an argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeAlias

from qim.core.push import (
    BarrierState,
    CloseConnection,
    ConnectionPush,
    DroppedWhileDegraded,
    FlowState,
    IllegalTransition,
    PendingPush,
    PushAction,
    SignalDirty,
)
from qim.gateway.actions import Action, CloseReason, Count, Send, SendPush
from qim.gateway.states import ConnState
from qim.gateway.sync_barrier import LoginBarrier
from qim.schemas.frames.control import ReadSync
from qim.schemas.frames.history import BadgeUpdate, SessionDelta

__all__ = ["SessionFrame", "SessionPushes"]

SessionFrame: TypeAlias = SessionDelta | BadgeUpdate | ReadSync

_ONLINE = (ConnState.ONLINE, ConnState.RENEWING)


class SessionPushes:
    """Mixin of Session: everything about ConnectionPush (module doc)."""

    _held_session_frames: dict[tuple[str, str], SessionFrame] | None = None
    """Session-list frames behind the login barrier, by (frame kind, conversation)."""

    if TYPE_CHECKING:  # provided by Session
        pushes: ConnectionPush | None
        sync: LoginBarrier | None
        version: int
        last_pushed_user_seq: int
        mailbox_dirty: bool
        last_active_ms: int

        @property
        def state(self) -> ConnState: ...
        @property
        def closed(self) -> bool: ...
        def shutdown(self, reason: CloseReason, now_ms: int, detail: str = "") -> list[Action]: ...

    @property
    def flow_state(self) -> FlowState | None:
        """NORMAL / DEGRADED / CLOSING (11.3.1) once online; None before AUTH_OK."""
        return None if self.pushes is None else self.pushes.flow.state

    def push(self, pending: PendingPush, now_ms: int) -> list[Action]:
        """One message's events for this connection (an expanded PushBatch delivery)."""
        pushes = self.pushes
        if pushes is None or self.closed or self.state not in _ONLINE:
            return []
        try:
            return self._push_actions(pushes.offer(pending), now_ms)
        except IllegalTransition:  # the push state already closed
            return []

    def push_drained(self, ledger_bytes: int, items: int, now_ms: int) -> list[Action]:
        """These SendPush frames have left the socket buffer (the driver measured it)."""
        pushes = self.pushes
        if pushes is None or self.closed or not items:
            return []
        return self._push_actions(pushes.drained(ledger_bytes, items), now_ms)

    def push_purged(self, ledger_bytes: int, items: int) -> None:
        """The degradation just signalled (its ERROR{MAILBOX_DIRTY} is queued on stream 0)
        dropped these SendPush frames before any byte was written: that ERROR covers them."""
        if self.pushes is not None and items:
            self.pushes.purged(ledger_bytes, items, reported=True)
            self.mailbox_dirty = self.pushes.mailbox_dirty

    def notice_dropped(self) -> None:
        """A SESSION_DELTA / BADGE_UPDATE / READ_SYNC was not queued: the connection is
        DEGRADED (11.3.1). The next PONG says ``mailbox_dirty`` so the client pulls."""
        if self.pushes is not None:
            self.pushes.dropped(1)
            self.mailbox_dirty = self.pushes.mailbox_dirty

    def push_idle(self, now_ms: int) -> list[Action]:
        """``idle_timeout`` passed with push frames pending and none consumed (11.3.1)."""
        pushes = self.pushes
        if pushes is None or self.closed:
            return []
        return self._push_actions(pushes.idle_timeout(), now_ms)

    def push_over_budget(self, ledger_bytes: int, items: int, now_ms: int) -> list[Action]:
        """The node budget (11.3.3 steps 2-3) purged these frames and degrades us."""
        pushes = self.pushes
        if pushes is None or self.closed:
            return []
        return self._push_actions(pushes.over_budget(ledger_bytes, items), now_ms)

    def _pong_fields(self) -> tuple[int, bool, list[Action]]:
        """``(last_pushed_user_seq, mailbox_dirty)`` for a PONG, and the count of a dirty one."""
        last_pushed, dirty = self.last_pushed_user_seq, self.mailbox_dirty
        if self.pushes is not None:
            last_pushed, dirty = self.pushes.pong()
            self.mailbox_dirty = False
        return last_pushed, dirty, [Count("mailbox_dirty_sent", "pong")] if dirty else []

    def session_frames(self, bodies: Sequence[SessionFrame]) -> list[Action]:
        """A SessionPush's frames for this session: sent, or held behind the login barrier."""
        if self.closed:
            return []
        if self.sync is not None and not self.sync.released:
            held = self._held_session_frames
            if held is None:
                held = self._held_session_frames = {}
            for body in bodies:
                key = (type(body).__name__, getattr(body, "conversation_id", ""))
                held.pop(key, None)  # the newest replaces (absolute values) and goes last
                held[key] = body
            return []
        return [Send(body, version=self.version) for body in bodies]

    def _release_pushes(self) -> list[Action]:
        """After ONLINE_READY went out: the pushes queued behind the barrier, in order, then
        the session-list frames held behind it."""
        if self.sync is None or not self.sync.released:
            return []
        actions: list[Action] = []
        pushes = self.pushes
        # a repeated SYNC_COMPLETE finds the barrier released already
        if pushes is not None and pushes.barrier.state is BarrierState.SYNCING:
            actions = self._push_actions(pushes.sync_complete(), self.last_active_ms)
        held, self._held_session_frames = self._held_session_frames, None
        if held:
            actions += [Send(body, version=self.version) for body in held.values()]
        return actions

    def _push_actions(self, pushed: list[PushAction], now_ms: int) -> list[Action]:
        pushes = self.pushes
        assert pushes is not None
        actions: list[Action] = []
        for action in pushed:
            if isinstance(action, SignalDirty):
                actions.append(Count("mailbox_dirty_sent", "error"))
                actions.append(Send(action.error, version=self.version))
            elif isinstance(action, CloseConnection):
                actions.append(Count("slow_connection_closed", action.reason))
                actions += self.shutdown(CloseReason.SLOW_CONSUMER, now_ms, action.reason)
            elif isinstance(action, DroppedWhileDegraded):
                actions.append(Count("degraded_drop", "PUSH_EVENTS"))
            else:
                self.last_pushed_user_seq = max(self.last_pushed_user_seq, action.mailbox_seq)
                actions.append(
                    SendPush(
                        action.body,
                        action.ledger_bytes,
                        action.priority,
                        action.mailbox_seq,
                        version=self.version,
                    )
                )
        self.mailbox_dirty = pushes.mailbox_dirty
        return actions
