"""PrekeyRequests: PREKEY_PUBLISH / PREKEY_FETCH to the key worker, its replies back (§22.2).

Same path as every other request (direction.md §4.1): the frame becomes a
:class:`~qim.schemas.records.prekeys.PrekeyPublishRequest` / ``PrekeyFetchRequest`` with the
session's identity (never the frame's), produced by the router's forwarder to
``qim.prekey-requests`` at the bundle **owner's** partition (the publisher, or the fetch's
target user), so one worker serialises every change of one user's bundles. The
``kind="prekey_reply"`` record comes back on this node's ConnectionShard and is written to the
session it names; ``session_epoch=0`` (the low-water notice, ``request_id=0``) goes to whichever
session the owner device has now. A request Kafka would not take is answered
``RATE_LIMITED{retry_after_ms}`` like the router's others. A fetch target that is not a
well-formed user id is ``PERMISSION_DENIED`` here, as the writer answers a malformed
conversation id.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
from prometheus_client import CollectorRegistry, Counter

from qim.gateway.actions import Send
from qim.gateway.devices import DeviceRegistry
from qim.gateway.logins import jittered
from qim.gateway.routing.forwarder import RequestForwarder
from qim.gateway.routing.replies import ReplyVerdict
from qim.schemas.frames import Error, ErrorCode, Frame, PrekeyFetch, PrekeyPublish
from qim.schemas.records.prekeys import (
    PrekeyFetchRequest,
    PrekeyPublishRequest,
    decode_prekey_reply,
    encode_prekey_record,
    prekey_partition,
)

if TYPE_CHECKING:
    from qim.gateway.transport.connection import Connection

__all__ = ["PREKEY_FRAMES", "PrekeyRequests"]

PREKEY_FRAMES = (PrekeyPublish, PrekeyFetch)


@dataclass(frozen=True, slots=True)
class _Outgoing:
    request: PrekeyPublishRequest | PrekeyFetchRequest
    partition: int

    @property
    def key(self) -> bytes:
        return self.request.owner_key

    @property
    def value(self) -> bytes:
        return encode_prekey_record(self.request)


class PrekeyRequests:
    """Prekey frames out through the router's forwarder, PrekeyReplies in from its reader."""

    def __init__(
        self,
        forwarder: RequestForwarder,
        registry: DeviceRegistry[Connection],
        shard_of: Callable[[str, str], int],
        metrics_registry: CollectorRegistry,
        *,
        topic: str,
        partition_count: int,
        retry_after_ms: int = 2_000,
    ) -> None:
        self.topic = topic
        self.partition_count = partition_count
        self._forwarder = forwarder
        self._registry = registry
        self._shard_of = shard_of
        self._retry_after_ms = retry_after_ms
        self.requests = Counter(
            "qim_gateway_prekey_requests_total",
            "PREKEY_PUBLISH / PREKEY_FETCH forwarded to the key worker, by kind and outcome",
            ["kind", "result"],
            registry=metrics_registry,
        )

    def handle(self, conn: Connection, frame: Frame) -> None:
        """Forward one prekey frame of an online session; never blocks the connection."""
        grant, body = conn.session.grant, frame.body
        if grant is None or conn.closing:
            return
        rid = frame.header.request_id
        shard = self._shard_of(grant.tenant_id, grant.user_id)
        request: PrekeyPublishRequest | PrekeyFetchRequest
        if isinstance(body, PrekeyPublish):
            kind = "publish"
            request = PrekeyPublishRequest(
                tenant_id=grant.tenant_id, user_id=grant.user_id, device_id=grant.device_id,
                session_epoch=grant.session_epoch, connection_shard=shard, request_id=rid,
                message=body,
            )  # fmt: skip
        elif isinstance(body, PrekeyFetch):
            kind = "fetch"
            request = PrekeyFetchRequest(
                tenant_id=grant.tenant_id, user_id=grant.user_id, device_id=grant.device_id,
                session_epoch=grant.session_epoch, connection_shard=shard, request_id=rid,
                message=body,
            )  # fmt: skip
        else:
            return
        try:
            partition = prekey_partition(grant.tenant_id, _owner(request), self.partition_count)
        except ValueError:  # a target id the key encoding refuses: no such user
            self.requests.labels(kind=kind, result="denied").inc()
            error = Error(code=int(ErrorCode.PERMISSION_DENIED), request_id=rid)
            conn.apply([Send(error, request_id=rid, version=conn.session.version)])
            return

        def produced(exc: BaseException | None) -> None:
            if exc is None:
                self.requests.labels(kind=kind, result="forwarded").inc()
            else:
                self._failed(conn, rid, kind, "kafka")

        if not self._forwarder.submit(_Outgoing(request, partition), produced, topic=self.topic):
            self._failed(conn, rid, kind, "queue_full")

    def _failed(self, conn: Connection, request_id: int, kind: str, reason: str) -> None:
        self.requests.labels(kind=kind, result=reason).inc()
        if conn.closing or conn.session.closed:
            return
        error = Error(
            code=int(ErrorCode.RATE_LIMITED),
            retry_after_ms=jittered(self._retry_after_ms),
            detail=f"key request not forwarded ({reason})",
            request_id=request_id,
        )
        conn.apply([Send(error, request_id=request_id, version=conn.session.version)])

    def deliver(self, value: bytes) -> ReplyVerdict:
        """One ``kind="prekey_reply"`` record of the to-gateway topic (never raises)."""
        try:
            reply = decode_prekey_reply(value)
        except (msgspec.DecodeError, ValueError):
            return ReplyVerdict.MALFORMED
        slot = self._registry.current(reply.tenant_id, reply.user_id, reply.device_id)
        if slot is None:
            return ReplyVerdict.NO_SESSION
        if reply.session_epoch and slot.session_epoch != reply.session_epoch:
            return ReplyVerdict.STALE_EPOCH
        conn = slot.conn
        if conn.closing or conn.session.closed:
            return ReplyVerdict.NO_SESSION
        rid = reply.request_id
        conn.apply([Send(reply.body, request_id=rid, version=conn.session.version)])
        return ReplyVerdict.DELIVER


def _owner(request: PrekeyPublishRequest | PrekeyFetchRequest) -> str:
    if isinstance(request, PrekeyFetchRequest):
        return request.message.target_user_id
    return request.user_id
