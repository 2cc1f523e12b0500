"""MailboxRequests: login sync's user requests to the MailboxNode and its replies back (§9.3).

One path for every read (direction.md §3, §4.1): a request is produced to ``qim.user-requests``
at partition = the user's MailboxShard, so the worker the mailbox group gave that shard answers
it, and its :class:`MailboxReply` comes back on ``qim.to-gateway`` at this session's
ConnectionShard, read by the router's reader (read_committed, like the writer's replies).

* AUTH: :meth:`MailboxRequests.sync_auth` produces a SyncAuthRequest and waits, at most
  ``mailbox_sync_timeout_ms``, for the reply carrying its correlation id. No reply in time, or a
  request Kafka would not take: the user's MailboxShard cannot be reached from here, which is
  what SHARD_MOVED{retry_after_ms} says (the MailboxNode answers the same while a lane catches up
  after a takeover, direction.md §4.1); the client backs off and reconnects. AUTH_OK is never
  sent without the sync fields: an AUTH_OK with a made-up ``sync_to_seq`` would split the
  device's events at the wrong place (I-19, I-20).
* PULL_MAILBOX: :meth:`MailboxRequests.pull` produces a PullMailboxRequest and returns; the reply
  goes to the connection whose ``session_epoch`` it names (§15.2.2) through its
  :class:`~qim.gateway.sync_barrier.LoginBarrier`, which records the served range. The request's
  ``after_seq`` rides in the correlation id, so the node keeps no per-pull state: nothing grows
  with pulls in flight and a reply needs no lookup.
* SYNC_COMPLETE is answered by the session itself (``sync_barrier``).
* Every request with a reply (PULL_MAILBOX, PULL_SESSION_LIST) has a deadline,
  ``mailbox_request_timeout_ms`` after it was handed to the forwarder: no MailboxReply by then
  (the MailboxNode is down, or its shard is being taken over) and it is answered
  ERROR{SHARD_MOVED, retry_after_ms} -- the same answer as a request Kafka would not take,
  never silence (issue 15.3). A reply that comes after that answer is dropped (counted
  ``late``): the client already has an answer for that ``request_id`` and retries the pull.
  MARK_READ and CONVERSATION_STATE have no reply, so no deadline: the log holds them once
  produced, and the MailboxNode applies them when it is back.

Correlation ids: ``auth:<node>:<boot>:<n>`` (a waiting login) and ``pull:<after_seq>``.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count
from typing import TYPE_CHECKING, Final

import msgspec
from prometheus_client import CollectorRegistry, Counter, Histogram

from qim.gateway.actions import Action, Send
from qim.gateway.devices import DeviceRegistry
from qim.gateway.logins import jittered
from qim.gateway.ports import AuthGrant
from qim.gateway.routing.forwarder import RequestForwarder
from qim.gateway.routing.replies import ReplyVerdict
from qim.gateway.session_requests import LIST_CORRELATION, SessionListRequests, UserRecord
from qim.gateway.sync_barrier import reply_error
from qim.schemas.frames import Error, ErrorCode, Frame, MailboxBatch, MailboxCursor, PullMailbox
from qim.schemas.frames.history import SessionListBatch
from qim.schemas.records.user_requests import (
    AuthSyncResult,
    MailboxReply,
    PullMailboxRequest,
    SyncAuthRequest,
    decode_mailbox_reply,
    mailbox_partition,
)

if TYPE_CHECKING:
    from qim.gateway.transport.connection import Connection

__all__ = ["MailboxRequests", "pull_after_seq", "pull_correlation"]

_PULL: Final = "pull:"
_AUTH: Final = "auth:"
_Identity = tuple[str, str, str, int]  # tenant, user, device, session_epoch
_RequestKey = tuple[str, str, str, int, int]  # ... and request_id
_MAX_EXPIRED: Final = 10_000  # answered-by-deadline requests remembered to drop late replies


def pull_correlation(after_seq: int) -> str:
    return f"{_PULL}{after_seq}"


def pull_after_seq(correlation_id: str) -> int | None:
    """The ``after_seq`` a pull's correlation id carries; None when it is not one of ours."""
    if not correlation_id.startswith(_PULL):
        return None
    digits = correlation_id[len(_PULL) :]
    return int(digits) if digits.isdigit() else None


@dataclass(frozen=True, slots=True)
class _Waiter:
    identity: _Identity
    future: asyncio.Future[AuthSyncResult | Error]


class MailboxRequests(SessionListRequests):
    """User requests out through the router's forwarder, MailboxReplies in from its reader."""

    def __init__(
        self,
        forwarder: RequestForwarder,
        registry: DeviceRegistry[Connection],
        shard_of: Callable[[str, str], int],
        metrics_registry: CollectorRegistry,
        *,
        topic: str,
        virtual_bucket_count: int,
        mailbox_shard_count: int,
        node_id: str,
        timeout_ms: int = 5_000,
        request_timeout_ms: int = 10_000,
        retry_after_ms: int = 1_000,
        clock_ms: Callable[[], int],
    ) -> None:
        self.topic = topic
        self._forwarder = forwarder
        self._registry = registry
        self._shard_of = shard_of
        self._buckets = virtual_bucket_count
        self._shards = mailbox_shard_count
        self._timeout_s = timeout_ms / 1000
        self._request_timeout_s = request_timeout_ms / 1000
        self._deadlines: dict[_RequestKey, asyncio.TimerHandle] = {}
        self._expired: OrderedDict[_RequestKey, None] = OrderedDict()
        self._retry_after_ms = retry_after_ms
        self._clock_ms = clock_ms
        self._prefix = f"{_AUTH}{node_id}:{secrets.token_hex(4)}:"
        self._ids = count(1)
        self._waiters: dict[str, _Waiter] = {}
        r = metrics_registry
        self.requests = Counter(
            "qim_gateway_mailbox_requests_total",
            "user requests to the MailboxNode by kind and outcome", ["kind", "result"],
            registry=r,
        )  # fmt: skip
        self.sync_latency = Histogram(
            "qim_gateway_sync_auth_latency_seconds",
            "SyncAuthRequest produced -> MailboxReply read (the sync part of AUTH -> AUTH_OK)",
            registry=r, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )  # fmt: skip

    @property
    def waiting(self) -> int:
        """Logins waiting for their MailboxReply."""
        return len(self._waiters)

    def mailbox_shard(self, tenant_id: str, user_id: str) -> int:
        return mailbox_partition(
            tenant_id, user_id, virtual_bucket_count=self._buckets, mailbox_shard_count=self._shards
        )

    # -- AUTH ---------------------------------------------------------------------------------

    async def sync_auth(
        self,
        grant: AuthGrant,
        cursor: MailboxCursor | None,
        *,
        connection_shard: int,
        request_id: int = 0,
    ) -> AuthSyncResult | Error:
        """The MailboxNode's verdict on this login's cursor: AUTH_OK's sync fields or an ERROR
        (CURSOR_INVALID / _EXPIRED / _REBASED, or SHARD_MOVED when it cannot be had in time)."""
        correlation = f"{self._prefix}{next(self._ids)}"
        request = SyncAuthRequest(
            tenant_id=grant.tenant_id,
            user_id=grant.user_id,
            device_id=grant.device_id,
            session_epoch=grant.session_epoch,
            connection_shard=connection_shard,
            request_id=request_id,
            correlation_id=correlation,
            cursor=cursor,
        )
        shard = self.mailbox_shard(grant.tenant_id, grant.user_id)
        future: asyncio.Future[AuthSyncResult | Error] = asyncio.get_running_loop().create_future()
        identity = (grant.tenant_id, grant.user_id, grant.device_id, grant.session_epoch)
        self._waiters[correlation] = _Waiter(identity, future)
        started = self._clock_ms()

        def produced(exc: BaseException | None) -> None:
            if exc is not None and not future.done():
                future.set_result(self._unreachable(shard, "kafka"))

        try:
            if not self._forwarder.submit(UserRecord(request, shard), produced, topic=self.topic):
                return self._unreachable(shard, "queue_full")
            try:
                async with asyncio.timeout(self._timeout_s):
                    outcome = await future
            except TimeoutError:
                return self._unreachable(shard, "timeout")
        finally:
            self._waiters.pop(correlation, None)
        if isinstance(outcome, AuthSyncResult):
            self.requests.labels(kind="sync_auth", result="ok").inc()
            self.sync_latency.observe((self._clock_ms() - started) / 1000)
        return outcome

    def _unreachable(self, shard: int, reason: str) -> Error:
        self.requests.labels(kind="sync_auth", result=reason).inc()
        return Error(
            code=int(ErrorCode.SHARD_MOVED),
            retry_after_ms=jittered(self._retry_after_ms),
            detail=f"mailbox shard {shard} unreachable ({reason})",
        )

    # -- PULL_MAILBOX -------------------------------------------------------------------------

    def pull(self, conn: Connection, frame: Frame) -> None:
        """Forward one PULL_MAILBOX of an online session; never blocks the connection."""
        grant, body = conn.session.grant, frame.body
        if grant is None or conn.closing or not isinstance(body, PullMailbox):
            return
        rid = frame.header.request_id
        request = PullMailboxRequest(
            tenant_id=grant.tenant_id,
            user_id=grant.user_id,
            device_id=grant.device_id,
            session_epoch=grant.session_epoch,
            connection_shard=self._shard_of(grant.tenant_id, grant.user_id),
            request_id=rid,
            correlation_id=pull_correlation(body.after_seq),
            message=body,
        )
        shard = self.mailbox_shard(grant.tenant_id, grant.user_id)
        key = self._track(conn, rid, shard, "pull_mailbox")

        def produced(exc: BaseException | None) -> None:
            if exc is None:
                self.requests.labels(kind="pull_mailbox", result="forwarded").inc()
            elif self._untrack(key):
                self._pull_failed(conn, rid, shard, "kafka")

        if not self._forwarder.submit(UserRecord(request, shard), produced, topic=self.topic):
            self._untrack(key)
            self._pull_failed(conn, rid, shard, "queue_full")

    # -- deadlines ----------------------------------------------------------------------------

    @property
    def awaiting(self) -> int:
        """Requests with a reply that is still due (each has its deadline timer)."""
        return len(self._deadlines)

    def _track(self, conn: Connection, request_id: int, shard: int, kind: str) -> _RequestKey:
        """Start the request's deadline: SHARD_MOVED when no reply came in time."""
        grant = conn.session.grant
        assert grant is not None
        key = (grant.tenant_id, grant.user_id, grant.device_id, grant.session_epoch, request_id)
        old = self._deadlines.pop(key, None)
        if old is not None:  # the same request id again: the newer request's deadline counts
            old.cancel()
        self._deadlines[key] = asyncio.get_running_loop().call_later(
            self._request_timeout_s, self._expire, key, conn, shard, kind
        )
        return key

    def _untrack(self, key: _RequestKey) -> bool:
        """Stop the deadline; False when it already passed (the client has its answer)."""
        handle = self._deadlines.pop(key, None)
        if handle is None:
            return False
        handle.cancel()
        return True

    def _expire(self, key: _RequestKey, conn: Connection, shard: int, kind: str) -> None:
        if self._deadlines.pop(key, None) is None:
            return
        self._expired[key] = None
        while len(self._expired) > _MAX_EXPIRED:
            self._expired.popitem(last=False)
        self._pull_failed(conn, key[-1], shard, "timeout", kind)

    def _answered(self, reply: MailboxReply) -> bool:
        """A reply to a request with a deadline: False when the deadline already answered it."""
        key = (
            reply.tenant_id, reply.user_id, reply.device_id, reply.session_epoch, reply.request_id
        )  # fmt: skip
        if self._untrack(key):
            return True
        if key in self._expired:
            del self._expired[key]
            return False
        return True  # not ours to judge (sent before this node started): deliver it

    def _pull_failed(
        self,
        conn: Connection,
        request_id: int,
        shard: int,
        reason: str,
        kind: str = "pull_mailbox",
    ) -> None:
        """The pull never left: SHARD_MOVED{retry_after_ms} for that request, link kept."""
        self.requests.labels(kind=kind, result=reason).inc()
        if conn.closing or conn.session.closed:
            return
        error = Error(
            code=int(ErrorCode.SHARD_MOVED),
            retry_after_ms=jittered(self._retry_after_ms),
            detail=f"mailbox shard {shard} unreachable ({reason})",
            request_id=request_id,
        )
        conn.apply([Send(error, request_id=request_id, version=conn.session.version)])

    # -- replies ------------------------------------------------------------------------------

    def deliver(self, value: bytes) -> ReplyVerdict:
        """One ``kind="mailbox_reply"`` record of the to-gateway topic (never raises)."""
        try:
            reply = decode_mailbox_reply(value)
        except (msgspec.DecodeError, ValueError):
            return ReplyVerdict.MALFORMED
        identity = (reply.tenant_id, reply.user_id, reply.device_id, reply.session_epoch)
        if reply.correlation_id.startswith(_AUTH):
            return self._auth_reply(reply, identity)
        if not self._answered(reply):
            self.requests.labels(kind="reply", result="late").inc()
            return ReplyVerdict.NO_SESSION
        slot = self._registry.current(reply.tenant_id, reply.user_id, reply.device_id)
        if slot is None:
            return ReplyVerdict.NO_SESSION
        if slot.session_epoch != reply.session_epoch:
            return ReplyVerdict.STALE_EPOCH
        conn = slot.conn
        if conn.closing or conn.session.closed:
            return ReplyVerdict.NO_SESSION
        conn.apply(self._frames(conn, reply))
        return ReplyVerdict.DELIVER

    def _auth_reply(self, reply: MailboxReply, identity: _Identity) -> ReplyVerdict:
        waiter = self._waiters.get(reply.correlation_id)
        if waiter is None:  # timed out, closed, or another node's login
            return ReplyVerdict.NO_SESSION
        if waiter.identity != identity:
            return ReplyVerdict.STALE_EPOCH
        body = reply.body
        if isinstance(body, MailboxBatch | SessionListBatch):  # a read's answer: not a login's
            return ReplyVerdict.MALFORMED
        if not waiter.future.done():
            waiter.future.set_result(body)
        return ReplyVerdict.DELIVER

    @staticmethod
    def _frames(conn: Connection, reply: MailboxReply) -> list[Action]:
        session, rid = conn.session, reply.request_id
        body = reply.body
        if reply.correlation_id == LIST_CORRELATION or isinstance(body, SessionListBatch):
            if isinstance(body, Error):  # PULL_SESSION_LIST's answer, whatever the sync
                return [Send(reply_error(body, rid), request_id=rid, version=session.version)]
            if isinstance(body, SessionListBatch):
                return [Send(body, request_id=rid, version=session.version)]
            return []
        after_seq = pull_after_seq(reply.correlation_id)
        if session.sync is not None:
            return session.sync.served(rid, after_seq, body, session.version)
        # a session that was never synced (renewed across a config change)
        if isinstance(body, Error):
            return [Send(reply_error(body, rid), request_id=rid, version=session.version)]
        if isinstance(body, MailboxBatch):
            return [Send(body, request_id=rid, version=session.version)]
        return []
