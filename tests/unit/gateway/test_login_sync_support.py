"""Fakes for the login-sync unit tests (no tests here; named so it sits with them).

:class:`FakeMailbox` runs the real sync core (``check_auth_cursor``, ``pull_mailbox``: signed
cursors, the 9.3.3 paging rules) over in-memory entries, one lane per user, so what reaches the
socket is what a MailboxNode would answer. :class:`SyncProducer` is the forwarder's producer:
user requests are answered by the fake through the router's ``deliver`` on the next loop tick,
as if the reply had come back on the to-gateway topic. :func:`sync_node` runs a real
ConnectionNode (loopback WebSocket, in-process authenticator, memory presence) around them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from qim.core.sync import (
    CursorIdentity,
    CursorKey,
    CursorKeyRing,
    PendingSummary,
    check_auth_cursor,
    pull_mailbox,
)
from qim.core.sync.paging import Group
from qim.gateway.auth_memory import MemoryAuthenticator
from qim.gateway.config import GatewayConfig
from qim.gateway.node import ConnectionNode, wall_clock_ms
from qim.gateway.ports import Ownership
from qim.gateway.presence_writer import MemoryPresence
from qim.gateway.routing.router import ConversationRouter
from qim.params import Settings
from qim.schemas.frames import Error, MailboxBatch, SyncEntry
from qim.schemas.records.user_requests import (
    AuthSyncResult,
    MailboxReply,
    PullMailboxRequest,
    SyncAuthRequest,
    decode_user_request,
    encode_user_record,
    mailbox_partition,
)
from qim.schemas.routing import lane_id
from qim.streams.topics import PUSH_TASKS, TO_GATEWAY, USER_REQUESTS
from tests.gateway_support import RawClient, WsClient

SETTINGS = Settings.load(env={})
SHARDS = int(SETTINGS.mailbox_shard_count)
KEYS = CursorKeyRing([CursorKey("u1", b"login-sync-unit-test-key-0123456789")])
TENANT = "t1"


def shard(user: str) -> int:
    return mailbox_partition(
        TENANT,
        user,
        virtual_bucket_count=int(SETTINGS.virtual_bucket_count),
        mailbox_shard_count=SHARDS,
    )


def entry(seq: int, user: str, sender: str = "alice") -> SyncEntry:
    return SyncEntry(
        mailbox_seq=seq,
        event_id=seq,
        message_id=seq.to_bytes(16, "big"),
        conversation_id="g:team",
        conversation_seq=seq,
        sender_id=sender,
        body_included=True,
        payload_or_ciphertext=f"m{seq}".encode(),
    )


@dataclass
class FakeMailbox:
    """One lane per user: W, the trim line and the entries; answers like ``mailbox_reads``."""

    watermark: dict[str, int] = field(default_factory=dict)
    trim: dict[str, int] = field(default_factory=dict)
    entries: dict[str, dict[int, SyncEntry]] = field(default_factory=dict)
    answering: bool = True
    refuse_auth: list[Error] = field(default_factory=list)  # answered first, one per AUTH
    after_pull: Callable[[PullMailboxRequest], None] | None = None
    requests: list[tuple[int, SyncAuthRequest | PullMailboxRequest]] = field(default_factory=list)

    def add(self, user: str, *seqs: int) -> None:
        for seq in seqs:
            self.entries.setdefault(user, {})[seq] = entry(seq, user)
            self.watermark[user] = max(self.watermark.get(user, 0), seq)

    def _groups(self, user: str, after: int, up_to: int) -> Iterator[Group]:
        for seq in sorted(self.entries.get(user, {})):
            if after < seq <= up_to:
                yield seq, [self.entries[user][seq]]

    def answer(self, partition: int, request: SyncAuthRequest | PullMailboxRequest) -> MailboxReply:
        user = request.user_id
        w, trim = self.watermark.get(user, 0), self.trim.get(user, 0)
        body: AuthSyncResult | MailboxBatch | Error
        if isinstance(request, SyncAuthRequest):
            body = self._auth(request, partition, w, trim)
        else:
            groups = lambda a, u: self._groups(user, a, u)  # noqa: E731
            body = pull_mailbox(groups, request.message, lane_watermark=w, trim_watermark=trim)
        fields: dict[str, Any] = {"auth_sync": None, "mailbox_batch": None, "error": None}
        key = {AuthSyncResult: "auth_sync", MailboxBatch: "mailbox_batch", Error: "error"}
        fields[key[type(body)]] = body
        return MailboxReply(
            tenant_id=request.tenant_id,
            user_id=user,
            device_id=request.device_id,
            session_epoch=request.session_epoch,
            connection_shard=request.connection_shard,
            request_id=request.request_id,
            correlation_id=request.correlation_id,
            mailbox_shard=partition,
            **fields,
        )

    def _auth(
        self, request: SyncAuthRequest, partition: int, w: int, trim: int
    ) -> AuthSyncResult | Error:
        if self.refuse_auth:
            return self.refuse_auth.pop(0)
        user = request.user_id
        lane = lane_id(TENANT, user, int(SETTINGS.lane_count))
        identity = CursorIdentity(TENANT, user, request.device_id, partition, lane, 1)

        def pending(after: int, up_to: int) -> PendingSummary:
            found = [e for _, group in self._groups(user, after, up_to) for e in group]
            return PendingSummary(bool(found), len(found), 100 * len(found))

        sync = check_auth_cursor(
            request.cursor,
            identity=identity,
            lane_watermark=w,
            trim_watermark=trim,
            keys=KEYS,
            now_ms=wall_clock_ms(),
            resolve_boundary=lambda claims, seq: None,
            pending=pending,
        )
        if isinstance(sync, Error):
            return sync
        return AuthSyncResult(
            kind=sync.kind.value,
            lane_id=sync.lane_id,
            lane_watermark=sync.lane_watermark,
            trim_watermark=sync.trim_watermark,
            sync_to_seq=sync.sync_to_seq,
            has_offline=sync.has_offline,
            pending_entry_count_hint=sync.pending_entry_count_hint,
            pending_bytes_hint=sync.pending_bytes_hint,
            start_seq=sync.start_seq,
            mailbox_cursor_token=sync.cursor_token,
            shard_epoch=1,
        )


@dataclass
class SyncProducer:
    """The forwarder's producer: conversation requests recorded, user requests answered by
    ``mailbox`` through ``deliver`` (the router's to-gateway entry point) on the next tick."""

    mailbox: FakeMailbox
    deliver: Callable[[bytes], object] | None = None
    fail_user_requests: bool = False
    user_request_partitions: int = SHARDS
    sent: list[tuple[str, bytes, bytes, int]] = field(default_factory=list)
    others: list[tuple[int, object]] = field(default_factory=list)

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def flush(self) -> None:
        pass

    async def partitions_for(self, topic: str) -> set[int]:
        count = self.user_request_partitions if topic == USER_REQUESTS.name else 16
        if topic == TO_GATEWAY.name:  # RTC's server cancels (13.5.3) go there too
            count = int(Settings.load(env={}).connection_shard_count)
        if topic == PUSH_TASKS.name:  # RTC: an offline callee's VoIP PushTask (13.5.2)
            count = int(Settings.load(env={}).mailbox_shard_count)
        return set(range(count))

    async def send(
        self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int = 0
    ) -> asyncio.Future[Any]:
        assert value is not None and key is not None
        self.sent.append((topic, key, value, partition))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if topic != USER_REQUESTS.name:
            future.set_result(None)
            return future
        if self.fail_user_requests:
            future.set_exception(ConnectionError("broker down"))
            return future
        future.set_result(None)
        request = decode_user_request(value)
        if not isinstance(request, SyncAuthRequest | PullMailboxRequest):
            self.others.append((partition, request))  # session list, user state, stale
            return future
        self.mailbox.requests.append((partition, request))
        if self.mailbox.answering and self.deliver is not None:
            reply = encode_user_record(self.mailbox.answer(partition, request))
            asyncio.get_running_loop().call_soon(self.deliver, reply)
            if isinstance(request, PullMailboxRequest) and self.mailbox.after_pull is not None:
                self.mailbox.after_pull(request)
        return future

    def user_requests(self) -> list[tuple[int, SyncAuthRequest | PullMailboxRequest]]:
        return list(self.mailbox.requests)


@dataclass
class SyncNode:
    node: ConnectionNode
    auth: MemoryAuthenticator
    producer: SyncProducer
    mailbox: FakeMailbox
    presence: MemoryPresence

    @property
    def router(self) -> ConversationRouter:
        assert self.node.router is not None
        return self.node.router

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.node.listeners.ws_port}/"

    def token(self, user: str, device: str = "phone") -> str:
        return self.auth.issue_token(TENANT, user, device, now_ms=wall_clock_ms(), ttl_ms=60_000)

    def sample(self, name: str, **labels: str) -> float:
        value = self.node.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


@asynccontextmanager
async def sync_node(
    mailbox: FakeMailbox | None = None, *, ownership: Ownership | None = None, **config: Any
) -> AsyncIterator[SyncNode]:
    mailbox = mailbox or FakeMailbox()
    producer = SyncProducer(mailbox)
    producer.fail_user_requests = config.pop("fail_user_requests", False)
    auth, presence = MemoryAuthenticator(), MemoryPresence()
    config.setdefault("mailbox_sync", True)
    cfg = GatewayConfig(
        node_id="gw-sync",
        kafka_bootstrap="127.0.0.1:9",  # never dialled: the producer is a double
        route_requests=True,
        settings=SETTINGS,
        **config,
    )
    node = ConnectionNode(
        cfg, auth, ownership=ownership, presence=presence, request_producer=producer
    )
    assert node.router is not None
    producer.deliver = node.router.deliver
    await node.start()
    try:
        yield SyncNode(node, auth, producer, mailbox, presence)
    finally:
        await node.stop()


async def login(h: SyncNode, user: str, device: str = "phone", **auth: Any) -> RawClient:
    client: RawClient = await WsClient.connect(h.url)
    await client.login(h.token(user, device), device, request_id=3, **auth)
    return client
