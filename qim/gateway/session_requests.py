"""The session-list half of the gateway's user requests (spec 12.6-12.9, App. A).

PULL_SESSION_LIST, MARK_READ and CONVERSATION_STATE [ext] go to the user's MailboxShard on
``qim.user-requests`` the same way PULL_MAILBOX does (``mailbox_requests``): identity from the
session's grant, never from the frame. SESSION_LIST_BATCH comes back as a MailboxReply;
MARK_READ and CONVERSATION_STATE have no reply (the MailboxNode appends them to the shard log;
the other devices get READ_SYNC, the CONTROL entry and the session list). A ``SessionPush``
record of ``qim.to-gateway`` carries SESSION_DELTA / BADGE_UPDATE / READ_SYNC for one session
and is written to it only while that session (``session_epoch``) is the current one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypedDict

import msgspec
from prometheus_client import Counter

from qim.gateway.actions import Send
from qim.gateway.conversation_state import refused, state_fields
from qim.gateway.devices import DeviceRegistry
from qim.gateway.routing.forwarder import RequestForwarder
from qim.gateway.routing.replies import ReplyVerdict
from qim.gateway.session_push import SessionFrame
from qim.schemas.frames import Frame
from qim.schemas.frames.control import ConversationState, MarkRead
from qim.schemas.frames.history import PullSessionList
from qim.schemas.records.session_push import decode_session_push
from qim.schemas.records.user_requests import (
    PullMailboxRequest,
    PullSessionListRequest,
    SyncAuthRequest,
    UserStateRequest,
    encode_user_record,
)

if TYPE_CHECKING:
    from qim.gateway.transport.connection import Connection

__all__ = ["LIST_CORRELATION", "SessionListRequests", "UserRecord"]

LIST_CORRELATION: Final = "list:"
"""The correlation id of every PULL_SESSION_LIST: its answer (batch or ERROR) goes straight
to the session, never through the login barrier's pull bookkeeping."""


class _Origin(TypedDict):
    """The session fields every user request names (from the grant, never from the frame)."""

    tenant_id: str
    user_id: str
    device_id: str
    session_epoch: int
    connection_shard: int


@dataclass(frozen=True, slots=True)
class UserRecord:
    """A user request as the forwarder's ``Outgoing``."""

    request: SyncAuthRequest | PullMailboxRequest | PullSessionListRequest | UserStateRequest
    partition: int

    @property
    def key(self) -> bytes:
        return self.request.key

    @property
    def value(self) -> bytes:
        return encode_user_record(self.request)


class SessionListRequests:
    """Mixin of :class:`~qim.gateway.routing.mailbox_requests.MailboxRequests` (its forwarder,
    registry, topic and request counter)."""

    topic: str
    requests: Counter
    _forwarder: RequestForwarder
    _registry: DeviceRegistry[Connection]
    _shard_of: Callable[[str, str], int]

    def mailbox_shard(self, tenant_id: str, user_id: str) -> int:
        raise NotImplementedError

    def _pull_failed(
        self, conn: Connection, request_id: int, shard: int, reason: str, kind: str = ...
    ) -> None:
        raise NotImplementedError

    def _track(
        self, conn: Connection, request_id: int, shard: int, kind: str
    ) -> tuple[str, str, str, int, int]:
        raise NotImplementedError

    def _untrack(self, key: tuple[str, str, str, int, int]) -> bool:
        raise NotImplementedError

    def session_list(self, conn: Connection, frame: Frame) -> None:
        """Forward PULL_SESSION_LIST; SESSION_LIST_BATCH comes back as a MailboxReply."""
        grant, body = conn.session.grant, frame.body
        if grant is None or conn.closing or not isinstance(body, PullSessionList):
            return
        rid = frame.header.request_id
        request = PullSessionListRequest(
            **self._origin(conn), request_id=rid, correlation_id=LIST_CORRELATION, message=body
        )
        shard = self.mailbox_shard(grant.tenant_id, grant.user_id)
        key = self._track(conn, rid, shard, "pull_session_list")  # SHARD_MOVED when overdue

        def produced(exc: BaseException | None) -> None:
            if exc is None:
                self.requests.labels(kind="pull_session_list", result="forwarded").inc()
            elif self._untrack(key):
                self._pull_failed(conn, rid, shard, "kafka", "pull_session_list")

        if not self._forwarder.submit(UserRecord(request, shard), produced, topic=self.topic):
            self._untrack(key)
            self._pull_failed(conn, rid, shard, "queue_full", "pull_session_list")

    def mark_read(self, conn: Connection, frame: Frame) -> None:
        """Forward MARK_READ as a user-state request (no reply frame; the other devices get
        READ_SYNC). A request that never left is only counted: the client re-marks."""
        grant, body = conn.session.grant, frame.body
        if grant is None or conn.closing or not isinstance(body, MarkRead):
            return
        request = UserStateRequest(
            **self._origin(conn),
            request_id=frame.header.request_id,
            conversation_id=body.conversation_id,
            action="mark_read",
            read_conversation_seq=body.read_conversation_seq,
        )
        shard = self.mailbox_shard(grant.tenant_id, grant.user_id)

        def produced(exc: BaseException | None) -> None:
            result = "forwarded" if exc is None else "kafka"
            self.requests.labels(kind="mark_read", result=result).inc()

        if not self._forwarder.submit(UserRecord(request, shard), produced, topic=self.topic):
            self.requests.labels(kind="mark_read", result="queue_full").inc()

    def conversation_state(self, conn: Connection, frame: Frame) -> None:
        """Forward CONVERSATION_STATE [ext] as a user-state request, like MARK_READ (no reply;
        the other devices learn it from the CONTROL entry and the session list). A refused
        frame is answered ERROR{PERMISSION_DENIED} and never leaves."""
        grant, body = conn.session.grant, frame.body
        if grant is None or conn.closing or not isinstance(body, ConversationState):
            return
        rid = frame.header.request_id
        fields = state_fields(body)
        if isinstance(fields, str):
            self.requests.labels(kind="conversation_state", result="refused").inc()
            conn.apply([Send(refused(fields, rid), request_id=rid, version=conn.session.version)])
            return
        request = UserStateRequest(**self._origin(conn), request_id=rid, **fields)
        shard = self.mailbox_shard(grant.tenant_id, grant.user_id)

        def produced(exc: BaseException | None) -> None:
            result = "forwarded" if exc is None else "kafka"
            self.requests.labels(kind="conversation_state", result=result).inc()

        if not self._forwarder.submit(UserRecord(request, shard), produced, topic=self.topic):
            self.requests.labels(kind="conversation_state", result="queue_full").inc()

    def _origin(self, conn: Connection) -> _Origin:
        grant = conn.session.grant
        assert grant is not None
        return {
            "tenant_id": grant.tenant_id,
            "user_id": grant.user_id,
            "device_id": grant.device_id,
            "session_epoch": grant.session_epoch,
            "connection_shard": self._shard_of(grant.tenant_id, grant.user_id),
        }

    def session_push(self, value: bytes) -> ReplyVerdict:
        """One ``kind="session_push"`` record: its frames to the session it names."""
        try:
            push = decode_session_push(value)
        except (msgspec.DecodeError, ValueError):
            return ReplyVerdict.MALFORMED
        slot = self._registry.current(push.tenant_id, push.user_id, push.device_id)
        if slot is None:
            return ReplyVerdict.NO_SESSION
        if slot.session_epoch != push.session_epoch:
            return ReplyVerdict.STALE_EPOCH
        conn = slot.conn
        if conn.closing or conn.session.closed:
            return ReplyVerdict.NO_SESSION
        badge = (push.badge,) if push.badge else ()
        bodies: tuple[SessionFrame, ...] = (*push.read_syncs, *push.deltas, *badge)
        conn.apply(conn.session.session_frames(bodies))  # held behind the login barrier
        return ReplyVerdict.DELIVER
