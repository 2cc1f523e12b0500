"""The MailboxNode's online push against a real Kafka and a real mailbox worker (issue 6).

Presence is written the way the gateway writes it (PresenceEntry at the user's MailboxShard
partition of ``qim.presence``); dispatches the way the FanoutCoordinator does; PushBatches are
read from ``qim.to-gateway`` at the ConnectionShard partitions. Every wait is on readiness: the
worker's ``/mailbox`` page (presence applied, dispatch applied, push acknowledgements counted),
then a read of ``qim.to-gateway`` up to its end offsets.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import msgspec
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from qim.devstack.stack import Stack
from qim.schemas import dispatch_id
from qim.schemas.records.dispatch import GroupDispatch
from qim.schemas.records.membership import MemberSliceRecord
from qim.schemas.records.presence import PresenceEntry, PresenceKey, encode_presence
from qim.schemas.records.push import (
    STALE_UNKNOWN_CONNECTION,
    PresenceStale,
    PushBatch,
    decode_push_body,
    decode_to_gateway,
    encode_push_record,
)
from qim.streams.topics import PRESENCE, TO_GATEWAY, USER_REQUESTS
from qim.streams.transit import load_transit_sealer
from tests.integration.mailbox_support import (
    SETTINGS,
    SHARDS,
    TIMEOUT,
    Client,
    Node,
    direct_dispatches,
    eventually,
    group_records,
    message_id,
    shard_of,
)

pytestmark = pytest.mark.integration

LEASE_MS = 600_000

TRANSIT = load_transit_sealer()
"""Opens to-gateway values sealed for the gateway hop (topology.md decision 44)."""


def uid() -> str:
    return uuid.uuid4().hex[:8]


def entry(tenant: str, user: str, conn_shard: int) -> PresenceEntry:
    return PresenceEntry(
        tenant_id=tenant,
        user_id=user,
        device_id="d1",
        connection_id=f"c-{user}",
        node_id="gw-test",
        connection_shard=conn_shard,
        session_epoch=1,
        lease_expire_at=int(time.time() * 1000) + LEASE_MS,
    )


class Gateway:
    """Writes presence like the ConnectionNode, reads PushBatches from ``qim.to-gateway``."""

    def __init__(self, bootstrap: str) -> None:
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
        self._consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        self._tps = [
            TopicPartition(TO_GATEWAY.name, p) for p in range(SETTINGS.connection_shard_count)
        ]
        self.batches: list[tuple[int, PushBatch]] = []

    async def __aenter__(self) -> Gateway:
        await self._producer.start()
        await self._consumer.start()
        self._consumer.assign(self._tps)
        for tp, end in (await self._consumer.end_offsets(self._tps)).items():
            self._consumer.seek(tp, end)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()
        await self._producer.stop()

    async def presence(self, key: PresenceKey, value: PresenceEntry | None) -> tuple[int, int]:
        """Produce one presence record at the user's shard; returns (partition, offset)."""
        partition = shard_of(key.tenant_id, key.user_id)
        raw = None if value is None else encode_presence(value)
        meta = await self._producer.send_and_wait(
            PRESENCE.name, raw, key=key.encode(), partition=partition
        )
        return partition, int(meta.offset)

    async def stale(self, report: PresenceStale) -> None:
        """PRESENCE_STALE on user-requests at the batch's MailboxShard, as the gateway sends it."""
        await self._producer.send_and_wait(
            USER_REQUESTS.name,
            encode_push_record(report),
            key=report.key,
            partition=report.partition,
        )

    async def drain(self) -> None:
        """Read every to-gateway partition up to its current end, keeping the PushBatches."""
        ends = await self._consumer.end_offsets(self._tps)
        while True:
            behind = [tp for tp in self._tps if await self._consumer.position(tp) < ends[tp]]
            if not behind:
                return
            fetched = await self._consumer.getmany(*behind, timeout_ms=500)
            for tp, records in fetched.items():
                for record in records:
                    try:
                        decoded = decode_to_gateway(TRANSIT.open(record.value))
                    except (msgspec.ValidationError, msgspec.DecodeError):
                        continue
                    if isinstance(decoded, PushBatch):
                        self.batches.append((tp.partition, decoded))

    def of(self, message: bytes) -> list[tuple[int, PushBatch]]:
        return [(p, b) for p, b in self.batches if b.message_id == message]


@pytest.fixture(scope="module")
async def node(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Node]:
    workdir = Path(tmp_path_factory.mktemp("mailbox-push")) / "node"
    n = Node(stack, workdir, {"QIM_MAILBOX_RECONCILE_INTERVAL_S": "1"})
    await n.start()
    try:
        await n.serving()
        await eventually(
            lambda: _presence_ready(n), TIMEOUT, "presence caches rebuilt", n.worker.log_tail
        )
        yield n
    finally:
        await n.stop()


@pytest.fixture(scope="module")
async def client(stack: Stack) -> AsyncIterator[Client]:
    async with Client(stack.cfg.kafka.bootstrap) as c:
        yield c


@pytest.fixture
async def gateway(stack: Stack) -> AsyncIterator[Gateway]:
    async with Gateway(stack.cfg.kafka.bootstrap) as g:
        yield g


def _presence_ready(n: Node) -> bool:
    shards = n.status().get("presence", {})
    return len(shards) == SHARDS and all(s["ready"] for s in shards.values())


async def _presence_applied(n: Node, offsets: dict[int, int]) -> None:
    def check() -> bool:
        shards = n.status().get("presence", {})
        return all(
            int(shards.get(str(p), {}).get("next_offset", -1)) > o for p, o in offsets.items()
        )

    await eventually(check, TIMEOUT, f"presence applied {offsets}", n.worker.log_tail)


async def _total_grows(n: Node, name: str, before: int, by: int) -> None:
    total: Callable[[], int] = lambda: int(n.totals().get(name, 0))  # noqa: E731
    await eventually(lambda: total() - before >= by, TIMEOUT, f"{name} +{by}", n.worker.log_tail)


async def test_online_peer_gets_one_push_batch_and_a_tombstone_stops_it(
    node: Node, client: Client, gateway: Gateway
) -> None:
    """11.1.2, I-19, 5.4.2: after the entry is durable, ONE PushBatch reaches B's
    ConnectionShard with B's device and the body; after B's tombstone the next dispatch
    pushes nothing for B."""
    tenant, a, b, conn = f"t-{uid()}", "alice", "bob", 17
    b_key = PresenceKey(tenant, b, "d1")
    partition, offset = await gateway.presence(b_key, entry(tenant, b, conn))
    await _presence_applied(node, {partition: offset})

    acked = int(node.totals().get("push_acknowledged_total", 0))
    records = direct_dispatches(tenant, a, b, b"hello bob")
    for record, at in zip(records, await client.dispatch(records), strict=True):
        await node.applied(record.target_mailbox_shard, at)
    await _total_grows(node, "push_acknowledged_total", acked, 1)
    await gateway.drain()
    ((part, batch),) = gateway.of(records[0].message_id)
    assert part == batch.connection_shard == conn
    assert batch.mailbox_shard == shard_of(tenant, b) and batch.priority == "direct"
    assert [(r.user_id, r.device_id, r.connection_id) for r in batch.recipients] == [
        (b, "d1", f"c-{b}")
    ]
    assert decode_push_body(batch.common_encoded_body).payload_or_ciphertext == b"hello bob"

    partition, offset = await gateway.presence(b_key, None)
    await _presence_applied(node, {partition: offset})
    offline = int(node.totals().get("push_offline_users_total", 0))
    records = direct_dispatches(tenant, a, b, b"are you there")
    for record, at in zip(records, await client.dispatch(records), strict=True):
        await node.applied(record.target_mailbox_shard, at)
    await _total_grows(node, "push_offline_users_total", offline, len(records))
    await gateway.drain()
    assert gateway.of(records[0].message_id) == []


async def test_thousand_member_group_is_one_batch_per_connection_shard_per_mailbox_shard(
    node: Node, client: Client, gateway: Gateway
) -> None:
    """I-19 / 26 #23: a 1,000-member group over every MailboxShard, 200 members online on 8
    ConnectionShards: each MailboxShard sends exactly one PushBatch per ConnectionShard that
    has an online member of it, and every online member is a recipient exactly once."""
    tenant, group = f"t-{uid()}", f"g:{uid()}"
    members = [f"m{i}" for i in range(1000)]
    online = {u: i % 8 for i, u in enumerate(members[::5])}
    assert len(online) == 200
    applied: dict[int, int] = {}
    for user, conn in online.items():
        partition, offset = await gateway.presence(
            PresenceKey(tenant, user, "d1"), entry(tenant, user, conn)
        )
        applied[partition] = max(applied.get(partition, -1), offset)
    await _presence_applied(node, applied)

    by_shard: dict[int, list[str]] = {}
    for user in members:
        by_shard.setdefault(shard_of(tenant, user), []).append(user)
    mid = message_id()
    records: list[GroupDispatch | MemberSliceRecord] = []
    for shard, users in sorted(by_shard.items()):
        chunks, dispatch = group_records(tenant, group, users, shard, b"to everyone")
        dispatch = msgspec.structs.replace(
            dispatch,
            message_id=mid,
            last_activity_id=mid,
            dispatch_id=dispatch_id(int.from_bytes(mid, "big"), shard),
            sender_id=members[0],
        )
        records.extend([*chunks, dispatch])
    expected = {
        (shard, conn) for user, conn in online.items() for shard in [shard_of(tenant, user)]
    }
    acked = int(node.totals().get("push_acknowledged_total", 0))
    offsets = await client.dispatch(records)
    last: dict[int, int] = {}
    for record, at in zip(records, offsets, strict=True):
        last[record.partition] = at
    for shard, at in sorted(last.items()):
        await node.applied(shard, at)
    await _total_grows(node, "push_acknowledged_total", acked, len(expected))
    await gateway.drain()

    found = gateway.of(mid)
    pairs = Counter((b.mailbox_shard, b.connection_shard) for _, b in found)
    assert set(pairs) == expected and set(pairs.values()) == {1}
    assert all(part == b.connection_shard for part, b in found)
    recipients = Counter(r.user_id for _, b in found for r in b.recipients)
    assert set(recipients) == set(online) and set(recipients.values()) == {1}
    for _, b in found:
        assert {online[r.user_id] for r in b.recipients} == {b.connection_shard}


async def test_presence_stale_drops_the_device_and_reconcile_agrees_5_4_3(
    node: Node, client: Client, gateway: Gateway
) -> None:
    """5.4.3 (1)/(2): PRESENCE_STALE on user-requests removes the device from the cache (the
    next dispatch pushes nothing to it), and the 60 s (here 1 s) reconcile of every shard
    against a full read of its compacted partition finds no difference, before and after --
    the stale floor keeps the dead connection from coming back through the reconcile."""
    tenant, a, c = f"t-{uid()}", "amy", "cid"
    partition, offset = await gateway.presence(PresenceKey(tenant, c, "d1"), entry(tenant, c, 21))
    await _presence_applied(node, {partition: offset})
    rounds = int(node.totals().get("presence_reconciles_total", 0))
    await _total_grows(node, "presence_reconciles_total", rounds, SHARDS)
    assert int(node.totals().get("presence_reconcile_diff", 0)) == 0

    dropped = int(node.totals().get("presence_stale:dropped", 0))
    await gateway.stale(
        PresenceStale(
            tenant_id=tenant,
            user_id=c,
            device_id="d1",
            connection_id=f"c-{c}",
            observed_epoch=1,
            reason=STALE_UNKNOWN_CONNECTION,
            mailbox_shard=partition,
        )
    )
    await _total_grows(node, "presence_stale:dropped", dropped, 1)
    offline = int(node.totals().get("push_offline_users_total", 0))
    records = direct_dispatches(tenant, a, c, b"gone?")
    for record, at in zip(records, await client.dispatch(records), strict=True):
        await node.applied(record.target_mailbox_shard, at)
    await _total_grows(node, "push_offline_users_total", offline, len(records))
    await gateway.drain()
    assert gateway.of(records[0].message_id) == []

    rounds = int(node.totals().get("presence_reconciles_total", 0))
    await _total_grows(node, "presence_reconciles_total", rounds, SHARDS)
    assert int(node.totals().get("presence_reconcile_diff", 0)) == 0
