"""Test harness of the MailboxNode: dispatch records and user requests in, replies out.

Dispatch records (GroupDispatch, MemberSliceRecord) are produced straight to ``qim.dispatch`` at
explicit partitions, the way the FanoutCoordinator does; requests go to ``qim.user-requests`` at
the user's MailboxShard, the way the gateway does; replies are read from ``qim.to-gateway`` (from
the end offsets at harness start). Workers are real ``faust -A qim.apps.mailbox worker``
subprocesses (``tests/integration/workers.py``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from qim.core.mailbox.keys import parse_entry_key, user_entry_prefix
from qim.core.membership import bitmap_bytes
from qim.devstack import procs
from qim.devstack.stack import Stack
from qim.params import Settings
from qim.schemas import dispatch_id, hash_input
from qim.schemas.frames import ErrorCode, MailboxCursor, PullMailbox, SyncEntry
from qim.schemas.frames.history import PullSessionList, SessionEntry
from qim.schemas.records.dispatch import GroupDispatch, encode_dispatch_record
from qim.schemas.records.membership import MemberSliceRecord, encode_membership_record
from qim.schemas.records.user_requests import (
    MailboxReply,
    PullMailboxRequest,
    PullSessionListRequest,
    SyncAuthRequest,
    UserStateRequest,
    decode_mailbox_reply,
    encode_user_record,
    mailbox_partition,
)
from qim.streams.topics import DISPATCH, TO_GATEWAY, USER_REQUESTS
from qim.streams.transit import load_transit_sealer
from qim.tables.mailbox_store import MailboxStore
from tests.integration.workers import FaustWorker

MODULE = "qim.apps.mailbox"
TIMEOUT = 60.0
SHARDS = 64
CURSOR_KEYS = "it1:" + base64.b64encode(b"mailbox-node-integration-test-key").decode()
WORKER_ENV = {
    "QIM_SHARD_LEASE_TTL": "6000",
    "QIM_WRITER_SELF_FENCE_DEADLINE": "4800",
    "QIM_WRITER_LEASE_RENEW_INTERVAL": "2000",
    "QIM_CURSOR_KEYS": CURSOR_KEYS,
    "QIM_MAILBOX_SWEEP_INTERVAL_S": "1",
    "QIM_MAILBOX_MAX_RECORDS": "200",
}
"""A 6 s lease (a restart after kill -9 waits one session), the test cursor ring (so every
restart verifies the same tokens), a sweep every second (the CURSOR_EXPIRED test)."""

SETTINGS = Settings.load(env={})
_ids = itertools.count(1)
_now = int(time.time() * 1000)

TRANSIT = load_transit_sealer()
"""Opens to-gateway values sealed for the gateway hop (topology.md decision 44)."""


def shard_of(tenant: str, user: str) -> int:
    return mailbox_partition(
        tenant, user, virtual_bucket_count=SETTINGS.virtual_bucket_count, mailbox_shard_count=SHARDS
    )


def users_on(tenant: str, shard: int, count: int, prefix: str) -> list[str]:
    """``count`` user ids whose mailbox is ``shard``."""
    out = []
    for i in itertools.count():
        user = f"{prefix}{i}"
        if shard_of(tenant, user) == shard:
            out.append(user)
            if len(out) == count:
                return out
    raise AssertionError("unreachable")


def message_id() -> bytes:
    return ((_now << 16) | next(_ids)).to_bytes(16, "big")


def direct_dispatches(
    tenant: str, sender: str, peer: str, payload: bytes, *, committed_at: int | None = None
) -> list[GroupDispatch]:
    """One GroupDispatch per target shard of a one-to-one message, as the fanout emits them."""
    mid = message_id()
    shards = sorted({shard_of(tenant, sender), shard_of(tenant, peer)})
    return [
        GroupDispatch(
            tenant_id=tenant,
            dispatch_id=dispatch_id(int.from_bytes(mid, "big"), shard),
            message_id=mid,
            conversation_id=f"d:{sender}:{peer}",
            conversation_kind="direct",
            conversation_seq=next(_ids),
            last_activity_id=mid,
            sender_id=sender,
            origin_device_id="dev",
            participants=(sender, peer),
            target_mailbox_shard=shard,
            committed_at=_now if committed_at is None else committed_at,
            message_type=1,
            payload=payload,
        )
        for shard in shards
    ]


def group_records(
    tenant: str, group: str, members: Sequence[str], shard: int, payload: bytes
) -> tuple[list[MemberSliceRecord], GroupDispatch]:
    """Version 1's member slice of ``shard`` (chunks of 4096) and a dispatch pinned to it."""
    cuts = [members[i : i + 4096] for i in range(0, len(members), 4096)]
    chunks = [
        MemberSliceRecord(
            tenant_id=tenant,
            group_id=group,
            membership_version=1,
            mailbox_shard=shard,
            chunk_index=index,
            chunk_count=len(cuts),
            slot_bitmap=bitmap_bytes(range(index * 4096, index * 4096 + len(part))),
            user_ids=tuple(part),
            joined_at=(0,) * len(part),
            shard_member_count=len(members),
            member_count=len(members),
        )
        for index, part in enumerate(cuts)
    ]
    mid = message_id()
    dispatch = GroupDispatch(
        tenant_id=tenant,
        dispatch_id=dispatch_id(int.from_bytes(mid, "big"), shard),
        message_id=mid,
        conversation_id=group,
        conversation_kind="group",
        conversation_seq=1,
        last_activity_id=mid,
        sender_id=members[0],
        membership_version=1,
        target_mailbox_shard=shard,
        committed_at=_now,
        message_type=1,
        payload=payload,
    )
    return chunks, dispatch


class Node:
    """One mailbox worker process with test controls."""

    def __init__(self, stack: Stack, workdir: Path, env: dict[str, str] | None = None) -> None:
        self.worker = FaustWorker(stack, MODULE, workdir, {**WORKER_ENV, **(env or {})})

    @property
    def pid(self) -> int | None:
        return procs.read_pid(self.worker.pid_file)

    async def start(self) -> None:
        await asyncio.to_thread(self.worker.start)

    async def stop(self) -> None:
        await asyncio.to_thread(self.worker.stop)

    def status(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = self.worker.get("/mailbox")
        except (OSError, urllib.error.HTTPError):
            return {}
        return data

    async def serving(self, within: float = TIMEOUT) -> None:
        await eventually(
            lambda: len(self.status().get("serving", ())) == SHARDS,
            within,
            "all shards served",
            self.worker.log_tail,
        )

    async def applied(self, shard: int, offset: int, within: float = TIMEOUT) -> dict[str, Any]:
        """Wait until ``shard`` has folded ``offset``; returns the shard's status."""

        def check() -> bool:
            shard_status = self.status().get("shards", {}).get(str(shard), {})
            return int(shard_status.get("applied_offset", -1)) >= offset

        await eventually(check, within, f"shard {shard} at {offset}", self.worker.log_tail)
        return dict(self.status()["shards"][str(shard)])

    async def exited(self, within: float = TIMEOUT) -> None:
        await eventually(lambda: self.pid is None, within, "worker exit", self.worker.log_tail)

    def metrics_text(self) -> str:
        """The Prometheus exposition of ``/mailbox/metrics``."""
        url = f"http://127.0.0.1:{self.worker.web_port}/mailbox/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())

    def totals(self) -> dict[str, int]:
        return dict(self.status().get("totals", {}))

    def store_entries(self, tenant: str, users: Sequence[str], shard: int) -> dict[str, list[int]]:
        """Each user's entry mailbox_seqs, read from the live store (RocksDB secondary)."""
        path = self.worker.datadir / "mailbox" / f"shard-{shard}"
        with tempfile.TemporaryDirectory() as secondary:
            store = MailboxStore.secondary(path, Path(secondary))
            try:
                out = {}
                for user in users:
                    prefix = user_entry_prefix(tenant, user)
                    keys = [k for k, _ in store.scan(prefix, prefix, False)]
                    out[user] = [parse_entry_key(k).mailbox_seq for k in keys]
                return out
            finally:
                store.close()


class Client:
    """Produces dispatch records and user requests, collects MailboxReplies by correlation."""

    def __init__(self, bootstrap: str) -> None:
        self.replies: dict[str, list[MailboxReply]] = defaultdict(list)
        self._arrived = asyncio.Event()
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
        self._consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Client:
        await self._producer.start()
        await self._consumer.start()
        tps = [TopicPartition(TO_GATEWAY.name, p) for p in range(SETTINGS.connection_shard_count)]
        self._consumer.assign(tps)
        for tp, end in (await self._consumer.end_offsets(tps)).items():
            self._consumer.seek(tp, end)
        self._task = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._consumer.stop()
        await self._producer.stop()

    async def _read(self) -> None:
        while True:
            fetched = await self._consumer.getmany(timeout_ms=200)
            for records in fetched.values():
                for record in records:
                    with contextlib.suppress(ValueError):  # another kind of the topic
                        reply = decode_mailbox_reply(TRANSIT.open(record.value))
                        self.replies[reply.correlation_id].append(reply)
            if fetched:
                self._arrived.set()

    async def dispatch(self, records: Sequence[GroupDispatch | MemberSliceRecord]) -> list[int]:
        """Produce to each record's shard partition; returns the offsets, in order."""
        futures = []
        for r in records:
            if isinstance(r, GroupDispatch):
                key, value = r.key, encode_dispatch_record(r)
            else:
                key, value = hash_input(r.tenant_id, r.group_id), encode_membership_record(r)
            futures.append(
                await self._producer.send(DISPATCH.name, value, key=key, partition=r.partition)
            )
        return [m.offset for m in await asyncio.gather(*futures)]

    async def end_offset(self, shard: int) -> int:
        tp = TopicPartition(DISPATCH.name, shard)
        return int((await self._consumer.end_offsets([tp]))[tp])

    async def send(self, request: UserStateRequest) -> None:
        """A request without a reply (a user-state change), at the user's MailboxShard."""
        partition = shard_of(request.tenant_id, request.user_id)
        await self._producer.send_and_wait(
            USER_REQUESTS.name, encode_user_record(request), key=request.key, partition=partition
        )

    async def session_list(self, tenant: str, user: str, limit: int = 2) -> list[SessionEntry]:
        """Every page of PULL_SESSION_LIST (``limit`` rows each, keyset cursors) in order;
        a revision change mid-way restarts, as a client does (12.8.2)."""
        out: list[SessionEntry] = []
        message = PullSessionList(limit=limit)
        while True:
            reply = await self.call(
                PullSessionListRequest(**_session(tenant, user), message=message)
            )
            batch = reply.session_list
            assert batch is not None, reply
            if message.page_cursor and batch.snapshot_revision != message.snapshot_revision:
                out = []
            out.extend(batch.sessions)
            if not batch.has_more:
                return out
            message = PullSessionList(
                snapshot_revision=batch.snapshot_revision,
                page_cursor=batch.next_page_cursor,
                limit=limit,
            )

    async def call(
        self,
        request: SyncAuthRequest | PullMailboxRequest | PullSessionListRequest,
        within: float = TIMEOUT,
    ) -> MailboxReply:
        """Send and wait for the reply; SHARD_MOVED is retried after its retry_after_ms."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            correlation = uuid.uuid4().hex
            sent = _with_correlation(request, correlation)
            partition = shard_of(request.tenant_id, request.user_id)
            await self._producer.send_and_wait(
                USER_REQUESTS.name, encode_user_record(sent), key=sent.key, partition=partition
            )
            while not self.replies.get(correlation):
                assert loop.time() < deadline, f"no reply to {request!r}"
                self._arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), 0.5)
            reply = self.replies[correlation][0]
            error = reply.error
            if error is None or error.code != ErrorCode.SHARD_MOVED:
                return reply
            assert loop.time() < deadline, "SHARD_MOVED past the deadline"
            await asyncio.sleep((error.retry_after_ms or 500) / 1000)

    async def pull_all(self, tenant: str, user: str, after: int = 0) -> list[SyncEntry]:
        """Every entry above ``after``, paging PULL_MAILBOX until has_more is false."""
        out: list[SyncEntry] = []
        while True:
            reply = await self.call(pull(tenant, user, after))
            batch = reply.mailbox_batch
            assert batch is not None, reply
            out.extend(batch.entries)
            after = batch.covered_through_seq
            if not batch.has_more:
                return out


def _session(tenant: str, user: str) -> dict[str, Any]:
    return {
        "tenant_id": tenant,
        "user_id": user,
        "device_id": "dev",
        "session_epoch": 1,
        "connection_shard": sum(user.encode()) % SETTINGS.connection_shard_count,
        "request_id": next(_ids) % 2**32,
    }


def sync_auth(tenant: str, user: str, cursor: MailboxCursor | None = None) -> SyncAuthRequest:
    return SyncAuthRequest(**_session(tenant, user), cursor=cursor)


def pull(tenant: str, user: str, after: int = 0) -> PullMailboxRequest:
    return PullMailboxRequest(**_session(tenant, user), message=PullMailbox(after_seq=after))


def user_state(
    tenant: str, user: str, conversation: str, action: str, device: str = "dev", **fields: Any
) -> UserStateRequest:
    """A user-state change (MARK_READ, mark unread, delete...) as the gateway forwards it."""
    session = {**_session(tenant, user), "device_id": device}
    return UserStateRequest(**session, conversation_id=conversation, action=action, **fields)


def _with_correlation(
    request: SyncAuthRequest | PullMailboxRequest | PullSessionListRequest, correlation: str
) -> SyncAuthRequest | PullMailboxRequest | PullSessionListRequest:
    return msgspec.structs.replace(request, correlation_id=correlation)


async def eventually(
    check: Callable[[], bool],
    within: float,
    what: str,
    diagnose: Callable[[], str] | None = None,
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await asyncio.to_thread(check):
        if loop.time() > deadline:
            extra = f"\n{diagnose()}" if diagnose else ""
            raise AssertionError(f"timed out after {within}s waiting for {what}{extra}")
        await asyncio.sleep(0.2)


def crash_env(step: str, shard: int, offset: int) -> dict[str, str]:
    return {
        "QIM_MAILBOX_CRASH_AT": step,
        "QIM_MAILBOX_CRASH_SHARD": str(shard),
        "QIM_MAILBOX_CRASH_OFFSET": str(offset),
    }
