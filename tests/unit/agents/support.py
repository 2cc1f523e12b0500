"""Builders for the ConversationWriter shell tests: a partition on a real RocksDB, requests,
and an in-memory stand-in for the transactional producer (the one I/O seam of ``writer_txn``)."""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qim.agents.writer.partition import PartitionWriter, Plan
from qim.agents.writer.requests import RequestContext, handle_request
from qim.agents.writer.snapshot import Checkpoint
from qim.agents.writer.txn import CrashHook, OwnedPartition, Topics
from qim.core.conversation import WriterConfig, direct_conversation_id
from qim.params import Settings
from qim.schemas.frames import CreateGroup, LeaveGroup, PullHistory, PullMembers, SendMessage
from qim.schemas.records import (
    AdminGroupRequest,
    AdminReplyTo,
    ConversationRequest,
    CreateGroupRequest,
    LeaveGroupRequest,
    OutboxRecord,
    PullHistoryRequest,
    PullMembersRequest,
    SendRequest,
    conversation_partition,
)
from qim.tables.message_store import MessageStore

TENANT = "acme"
PARTITIONS = 4
NOW = 1_790_000_000_000
SETTINGS = Settings.load(env={})
CONFIG = WriterConfig.from_settings(SETTINGS)
CTX = RequestContext(config=CONFIG, partition_count=PARTITIONS, max_members=1000)
TOPICS = Topics(
    requests="req",
    outbox="out",
    snapshots="snap",
    to_gateway="gw",
    dispatch="disp",
    admin_replies="admin",
    to_gateway_partitions=256,
)
_ids = itertools.count(1)


def partition_of(conversation_id: str, tenant: str = TENANT) -> int:
    return conversation_partition(tenant, conversation_id, PARTITIONS)


def group_on(partition: int, prefix: str = "g:team") -> str:
    """A group id whose conversation lives on ``partition``."""
    for n in itertools.count():
        group = f"{prefix}{n}"
        if partition_of(group) == partition:
            return group
    raise AssertionError("unreachable")


def new_writer(path: Path, partition: int, checkpoint: Checkpoint | None = None) -> PartitionWriter:
    return PartitionWriter.restored(
        partition,
        checkpoint,
        MessageStore(path),
        config=CONFIG,
        region_id=0,
        mailbox_shard_count=SETTINGS.mailbox_shard_count,
    )


def _session(user: str, tenant: str) -> dict[str, Any]:
    return {
        "tenant_id": tenant,
        "user_id": user,
        "device_id": "dev",
        "session_epoch": 1,
        "connection_shard": 7,
        "request_id": next(_ids),
    }


def send(
    user: str, conversation_id: str, cmid: str, *, tenant: str = TENANT, peer: str = ""
) -> SendRequest:
    rid = next(_ids)
    message = SendMessage(
        request_id=rid,
        client_message_id=cmid,
        conversation_id=conversation_id,
        message_type=1,
        payload=cmid.encode(),
    )
    return SendRequest(
        tenant_id=tenant,
        sender_id=user,
        sender_device_id="dev",
        session_epoch=1,
        connection_shard=7,
        request_id=rid,
        message=message,
        peer_user_id=peer,
    )


def direct(user: str, peer: str, cmid: str, *, tenant: str = TENANT) -> SendRequest:
    return send(user, direct_conversation_id(tenant, user, peer), cmid, tenant=tenant, peer=peer)


def create(user: str, group: str, members: tuple[str, ...], *, tenant: str = TENANT) -> Any:
    message = CreateGroup(group_id=group, member_ids=members)
    return CreateGroupRequest(**_session(user, tenant), message=message)


def leave(user: str, group: str, *, tenant: str = TENANT) -> LeaveGroupRequest:
    return LeaveGroupRequest(**_session(user, tenant), message=LeaveGroup(group_id=group))


def history(user: str, conversation_id: str, *, tenant: str = TENANT) -> PullHistoryRequest:
    message = PullHistory(conversation_id=conversation_id, direction="newer")
    return PullHistoryRequest(**_session(user, tenant), message=message)


def members(user: str, group: str, *, tenant: str = TENANT) -> PullMembersRequest:
    return PullMembersRequest(**_session(user, tenant), message=PullMembers(conversation_id=group))


def admin(action: str, group: str, targets: tuple[str, ...], *, reply: bool = True) -> Any:
    reply_to = AdminReplyTo(node_id="ops", correlation_id=f"c{next(_ids)}") if reply else None
    return AdminGroupRequest(
        tenant_id=TENANT,
        group_id=group,
        action=action,
        actor="ops",
        member_ids=targets,
        reply_to=reply_to,
    )


class Log:
    """Runs requests through the live path and numbers appended records like an outbox."""

    def __init__(self, writer: PartitionWriter) -> None:
        self.writer = writer
        self.records: list[tuple[OutboxRecord, int]] = []

    def run(self, *requests: ConversationRequest, now_ms: int = NOW) -> Plan:
        plan = Plan()
        for request in requests:
            handle_request(self.writer, CTX, request, now_ms, plan)
        appended = [(r, len(self.records) + i) for i, r in enumerate(plan.outbox)]
        self.records.extend(appended)
        self.writer.stored(appended)
        return plan


def store_items(store: MessageStore) -> list[tuple[bytes, bytes]]:
    return list(store.scan(b"", b"", False))


# -- an in-memory transactional producer --------------------------------------------------------


@dataclass
class Sent:
    topic: str
    partition: int
    key: bytes | None
    value: bytes
    offset: int


@dataclass
class RecordMetadata:
    offset: int


@dataclass
class FakeProducer:
    """Offsets are taken at send (aborted records keep theirs, as in Kafka); only committed
    records and offsets become visible in ``committed`` / ``group_offsets``."""

    fail_commit: bool = False
    committed: list[Sent] = field(default_factory=list)
    group_offsets: dict[Any, int] = field(default_factory=dict)
    transactions: int = 0
    aborted: int = 0
    _next: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    _open: list[Sent] | None = None
    _offsets: dict[Any, int] = field(default_factory=dict)

    async def begin_transaction(self) -> None:
        assert self._open is None, "nested transaction"
        self._open, self._offsets = [], {}

    async def send(
        self, topic: str, value: bytes, key: bytes | None = None, partition: int | None = None
    ) -> asyncio.Future[RecordMetadata]:
        assert self._open is not None and partition is not None
        offset = self._next[(topic, partition)]
        self._next[(topic, partition)] += 1
        self._open.append(Sent(topic, partition, key, value, offset))
        future: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        future.set_result(RecordMetadata(offset))
        return future

    async def send_offsets_to_transaction(self, offsets: dict[Any, Any], group_id: str) -> None:
        assert self._open is not None
        self._offsets = {tp: meta.offset for tp, meta in offsets.items()}

    async def commit_transaction(self) -> None:
        assert self._open is not None
        if self.fail_commit:
            raise RuntimeError("commit failed")
        self.committed.extend(self._open)
        self.group_offsets.update(self._offsets)
        self._open = None
        self.transactions += 1

    async def abort_transaction(self) -> None:
        self._open = None
        self.aborted += 1

    async def stop(self) -> None:
        return None

    def on(self, topic: str) -> list[Sent]:
        return [s for s in self.committed if s.topic == topic]


@dataclass
class Consumed:
    offset: int
    value: bytes


def consumed(requests: list[ConversationRequest], first: int = 0) -> list[Consumed]:
    from qim.schemas.records import encode_record

    return [Consumed(first + i, encode_record(r)) for i, r in enumerate(requests)]


def owned(
    writer: PartitionWriter,
    producer: FakeProducer,
    *,
    checkpoint_every: int = 1000,
    crash: CrashHook | None = None,
    lease: bool = True,
    reply_producer: Any = None,
    early_offsets: bool = True,
) -> OwnedPartition:
    return OwnedPartition(
        writer,
        producer,  # the in-memory double of AIOKafkaProducer (typed Any by aiokafka)
        topics=TOPICS,
        group_id="writers",
        ctx=CTX,
        checkpoint_every=checkpoint_every,
        checkpoint_interval_s=3600,
        lease_valid=lambda: lease,
        crash=crash or CrashHook(),
        reply_producer=reply_producer,
        early_offsets=early_offsets,
    )


def iter_seqs(records: list[tuple[OutboxRecord, int]]) -> Iterator[int]:
    for record, _ in records:
        yield record.conversation_seq
