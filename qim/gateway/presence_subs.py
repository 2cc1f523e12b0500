"""PRESENCE_SUB on the ConnectionNode (spec 13.2, AT-52/53): a thin shell over the core.

Per connection a :class:`~qim.core.transient.PresenceSubscription` (soft state, dropped when
the connection closes); a watch index ``(tenant, user) -> connections`` so a presence record
of the node's :class:`~qim.gateway.presence_directory.PresenceDirectory` reaches only the
connections that watch that user. Rules:

* targets are ``user_ids[]`` of the subscriber's own tenant (identity from the session: a
  subscriber can never name another tenant's user) OR one group ``conversation_id``, whose
  members the ConversationWriter lists (a PULL_MEMBERS of one page of
  ``presence_sub_max_targets``, only for a member; a non-member gets its PERMISSION_DENIED).
  Both at once, or an unknown action: ``ERROR{PERMISSION_DENIED}`` naming why (AT-53);
* over ``presence_sub_max_targets``: ``ERROR{RATE_LIMITED, retry_after_ms=RETRY_AFTER_NEVER_MS}``
  and nothing changed (never a partial subscription): waiting cannot make the set fit, so the
  hint is the "do not retry" marker (20.4.1 rule 2 keeps a hint on every RATE_LIMITED), as the
  codec answers 201 targets in one frame, and the detail says to unsubscribe or replace;
* ``subscribe`` / ``replace`` are answered by ``PRESENCE_SUB{entries}`` with the request's
  request_id, a full snapshot of every target; ``unsubscribe`` by an empty one;
  increments go out with request_id 0, merged per connection over
  ``presence_sub_merge_window``; a DEGRADED connection's increment is held, not queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from qim.core.push import FlowState
from qim.core.transient import ACTIONS, PresenceState, PresenceSubscription
from qim.gateway.actions import Send
from qim.gateway.presence_directory import PresenceDirectory
from qim.schemas.frames import Error, ErrorCode, Frame
from qim.schemas.frames.control import PresenceEntry, PresenceSub, PresenceSubDown
from qim.schemas.frames.errors import RETRY_AFTER_NEVER_MS
from qim.schemas.frames.members import MemberListBatch

if TYPE_CHECKING:
    from qim.gateway.transport.connection import Connection

__all__ = ["PresenceSubscriptions", "over_limit"]

log = logging.getLogger(__name__)

UserKey = tuple[str, str]


def over_limit(request_id: int, limit: int) -> Error:
    """RATE_LIMITED with the "do not retry" hint: the same request will never fit (13.2)."""
    return Error(
        code=int(ErrorCode.RATE_LIMITED),
        retry_after_ms=RETRY_AFTER_NEVER_MS,
        request_id=request_id,
        detail=(
            f"more than presence_sub_max_targets {limit} targets: nothing subscribed; "
            "do not retry, unsubscribe or replace"
        ),
    )


def _denied(request_id: int, detail: str) -> Error:
    return Error(code=int(ErrorCode.PERMISSION_DENIED), request_id=request_id, detail=detail)


class PresenceSubscriptions:
    """Every connection's PRESENCE_SUB state on this node."""

    def __init__(
        self,
        directory: PresenceDirectory,
        *,
        max_targets: int,
        merge_window_ms: int,
        clock_ms: Callable[[], int],
    ) -> None:
        self.directory = directory
        self.max_targets = max_targets
        self.merge_window_ms = merge_window_ms
        self._clock_ms = clock_ms
        self._subs: dict[str, PresenceSubscription] = {}
        self._conns: dict[str, Connection] = {}
        self._watch: dict[UserKey, set[str]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._waiting: set[asyncio.Task[None]] = set()
        self.ready_wait_s = 5.0  # how long a first snapshot waits for the view to catch up
        self.members_of: Callable[[Connection, Frame, str], None] | None = None
        """Asks the writer for a conversation's members (set by the router)."""
        directory.on_change = self.changed
        directory.on_tick = self.tick

    # -- requests -------------------------------------------------------------------------------

    def handle(self, conn: Connection, frame: Frame) -> None:
        body = frame.body
        assert isinstance(body, PresenceSub)
        rid = frame.header.request_id
        if body.action not in ACTIONS:
            self._send(conn, _denied(rid, f"PRESENCE_SUB action {body.action!r} is unknown"), rid)
            return
        if body.conversation_id and body.targets:
            detail = "PRESENCE_SUB takes conversation_id or user_ids, never both"
            self._send(conn, _denied(rid, detail), rid)
            return
        if body.conversation_id:
            if self.members_of is None:
                self._send(conn, _denied(rid, "PRESENCE_SUB by conversation is not offered"), rid)
                return
            self.members_of(conn, frame, body.conversation_id)
            return
        self.apply(conn, rid, body.action, body.targets)

    def members(self, conn: Connection, frame: Frame, batch: MemberListBatch) -> None:
        """The writer's member page for a PRESENCE_SUB{conversation_id}: its users, but the
        subscriber, are the request's targets (more than one page: over the limit)."""
        body = frame.body
        assert isinstance(body, PresenceSub)
        rid = frame.header.request_id
        grant = conn.session.grant
        if grant is None:
            return
        if batch.has_more:
            self._send(conn, over_limit(rid, self.max_targets), rid)
            return
        users = [m.user_id for m in batch.members if m.user_id != grant.user_id]
        self.apply(conn, rid, body.action, users)

    def apply(self, conn: Connection, rid: int, action: str, users: Iterable[str]) -> None:
        grant = conn.session.grant
        if grant is None or conn.closing:
            return
        sub = self._subs.get(conn.conn_id)
        if sub is None:
            sub = PresenceSubscription(self.max_targets, self.merge_window_ms)
        change = sub.update(action, users)
        if change is None:
            self._send(conn, over_limit(rid, self.max_targets), rid)
            return
        self._subs[conn.conn_id] = sub
        self._conns[conn.conn_id] = conn
        tenant = grant.tenant_id
        for user in change.added:
            self._watch.setdefault((tenant, user), set()).add(conn.conn_id)
        for user in change.removed:
            self._unwatch((tenant, user), conn.conn_id)
        if self.directory.ready.is_set() or not change.snapshot:
            self._snapshot(conn, rid, sub, change.snapshot)
            return

        async def later() -> None:
            """A view still catching up is waited for a while, then answered anyway (it is
            approximate UI state; never silence)."""
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.directory.ready.wait(), self.ready_wait_s)
            if not conn.closing and self._subs.get(conn.conn_id) is sub:
                self._snapshot(conn, rid, sub, change.snapshot)

        task = asyncio.get_running_loop().create_task(later(), name=f"presence-snapshot-{rid}")
        self._waiting.add(task)  # a reference, or the loop may drop it
        task.add_done_callback(self._waiting.discard)

    def closed(self, conn: Connection) -> None:
        """The connection is gone: its subscriptions with it (13.2 soft state)."""
        sub = self._subs.pop(conn.conn_id, None)
        self._conns.pop(conn.conn_id, None)
        timer = self._timers.pop(conn.conn_id, None)
        if timer is not None:
            timer.cancel()
        grant = conn.session.grant
        if sub is None or grant is None:
            return
        for user in sub.targets:
            self._unwatch((grant.tenant_id, user), conn.conn_id)

    @property
    def connections(self) -> int:
        return len(self._subs)

    # -- presence changes -----------------------------------------------------------------------

    def changed(self, tenant_id: str, user_id: str) -> None:
        watchers = self._watch.get((tenant_id, user_id))
        if not watchers:
            return
        now = self._clock_ms()
        for conn_id in list(watchers):
            sub = self._subs.get(conn_id)
            if sub is None:
                continue
            due = sub.changed(user_id, now)
            if due is not None:
                self._schedule(conn_id, due, now)

    def tick(self, now_ms: int) -> None:
        """Leases run out without a record: look at every watched user again."""
        for tenant, user in list(self._watch):
            self.changed(tenant, user)

    # -- internals ------------------------------------------------------------------------------

    def _states(self, tenant: str, users: Iterable[str], now: int) -> Mapping[str, PresenceState]:
        view = self.directory.view
        return {u: view.state(tenant, u, now) for u in users}

    def _snapshot(
        self, conn: Connection, rid: int, sub: PresenceSubscription, users: tuple[str, ...]
    ) -> None:
        grant = conn.session.grant
        if grant is None:
            return
        now = self._clock_ms()
        shown = sub.snapshot(users, self._states(grant.tenant_id, users, now))
        self._send(conn, PresenceSubDown(entries=_entries(shown)), rid)

    def _schedule(self, conn_id: str, due_ms: int, now_ms: int) -> None:
        if conn_id in self._timers:
            return  # one flush is already pending; it takes every dirty user
        loop = asyncio.get_running_loop()
        delay = max(0, due_ms - now_ms) / 1000
        self._timers[conn_id] = loop.call_later(delay, self._flush, conn_id)

    def _flush(self, conn_id: str) -> None:
        self._timers.pop(conn_id, None)
        sub, conn = self._subs.get(conn_id), self._conns.get(conn_id)
        grant = None if conn is None else conn.session.grant
        if sub is None or conn is None or grant is None or conn.closing:
            return
        now = self._clock_ms()
        if conn.session.flow_state is FlowState.DEGRADED:  # 11.3: transient first; look later
            self._schedule(conn_id, now + self.merge_window_ms, now)
            return
        due = sub.due_ms(now)
        if due is not None and due > now:
            self._schedule(conn_id, due, now)
            return
        changed = sub.flush(now, self._states(grant.tenant_id, sub.dirty, now))
        if changed:
            self._send(conn, PresenceSubDown(entries=_entries(changed)), 0)

    def _unwatch(self, key: UserKey, conn_id: str) -> None:
        watchers = self._watch.get(key)
        if watchers is None:
            return
        watchers.discard(conn_id)
        if not watchers:
            del self._watch[key]

    @staticmethod
    def _send(conn: Connection, body: Error | PresenceSubDown, rid: int) -> None:
        if conn.closing or conn.session.closed:
            return
        conn.apply([Send(body, request_id=rid, version=conn.session.version)])


def _entries(shown: Iterable[tuple[str, PresenceState]]) -> tuple[PresenceEntry, ...]:
    return tuple(
        PresenceEntry(user_id=user, state=state.state, last_active_at=state.last_active_at)
        for user, state in shown
    )
