"""Online-delivery harness (issue 6): live SDK devices, steady traffic, and what Kafka saw.

Shared by ``test_push_delivery``, ``test_online_delivery`` and ``test_online_gateway_kill``
on top of ``login_support`` (the real pipeline and a syncing gateway):

* :class:`Device`: an SDK device past ONLINE_READY that keeps every PUSH_EVENTS entry raw
  (``entries``: what the server wrote, duplicates included) and what the SDK delivered
  (``delivered``: the login's pulls, pushes deduplicated by ``(message_id, event_id)``, and
  :func:`~qim.client.catch_up` pulls), plus a KICKED and anything that came after it;
* :class:`Traffic`: a sender that keeps sending until stopped, remembering each SEND_ACK;
* :class:`PushWatch`: every PushBatch the MailboxNode produced to ``qim.to-gateway`` (read
  from the end offsets at start), to say who a message was planned for, or that it was not;
* :func:`presence_log`: one device's records in the compacted presence topic, in order;
* :func:`barrier`: the positive point a negative check waits for (see its docstring).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition

from qim.client import (
    DeviceCursor,
    Identity,
    MailboxSync,
    QimClient,
    SyncResult,
    catch_up,
    login_and_sync,
)
from qim.schemas.frames import Frame, Kicked, PushEvents, SendAck, SyncEntry
from qim.schemas.records.presence import PresenceEntry, PresenceKey, decode_presence
from qim.schemas.records.push import PushBatch, PushRecipient, decode_to_gateway
from qim.streams.topics import PRESENCE, TO_GATEWAY
from qim.streams.transit import load_transit_sealer
from tests.gateway_support import Gateway
from tests.integration.login_support import WAIT_S, new_client
from tests.integration.test_gateway_routing import SETTINGS

TRANSIT = load_transit_sealer()
"""Opens to-gateway values sealed for the gateway hop (topology.md decision 44)."""


class Device:
    """One online device; a background task reads its server-initiated frames."""

    def __init__(self, result: SyncResult) -> None:
        self.result = result
        self.entries: list[SyncEntry] = []  # every pushed entry, raw
        self.delivered: list[SyncEntry] = list(result.entries)  # what the SDK handed over
        self.frames = 0
        self.kicked: Kicked | None = None
        self.after_kick: list[Frame] = []
        self._task = asyncio.create_task(self._collect())

    async def _collect(self) -> None:
        async for frame in self.result.client.events():
            if self.kicked is not None:
                self.after_kick.append(frame)
            if isinstance(frame.body, PushEvents):
                self.frames += 1
                self.entries.extend(frame.body.events)
                self.delivered.extend(self.result.on_push(frame.body))
            elif isinstance(frame.body, Kicked):
                self.kicked = frame.body

    def of(self, message_id: bytes) -> list[SyncEntry]:
        """The raw pushes of one message."""
        return [e for e in self.entries if e.message_id == message_id]

    def got(self, message_id: bytes) -> list[SyncEntry]:
        """What the SDK delivered of one message (pulled or pushed, deduplicated)."""
        return [e for e in self.delivered if e.message_id == message_id]

    async def catch_up(self) -> None:
        """The device's PONG rule: pull ``(cursor, 0]`` if the server says it should."""
        self.delivered.extend(await catch_up(self.result))

    async def holds(self, message_ids: Collection[bytes], within: float = WAIT_S) -> None:
        """Wait until every message was delivered, following the PONG rule meanwhile (the
        rule allows a pull every ``client_resync_min_interval``, so this may take a while)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while missing := set(message_ids) - {e.message_id for e in self.delivered}:
            sync = self.result.sync
            assert loop.time() < deadline, (
                f"{len(missing)} messages never delivered; cursor "
                f"{sync.cursor.last_applied_mailbox_seq}, pushed up to {sync.last_pushed_user_seq}"
            )
            await self.catch_up()
            await asyncio.sleep(0.5)

    @property
    def cursor(self) -> DeviceCursor:
        return self.result.sync.cursor

    @property
    def closed(self) -> bool:
        return self._task.done()

    async def close(self) -> None:
        await self.result.client.close()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self._task, 5)


async def connect(
    url: str,
    token: str,
    identity: Identity,
    device_id: str,
    *,
    cursor: DeviceCursor | None = None,
    sync: MailboxSync | None = None,
    client: QimClient | None = None,
) -> Device:
    """``login_and_sync`` and a :class:`Device` on it; ``sync`` continues an earlier login's
    MailboxSync (its cursor and its dedup memory), as a reconnecting app does."""
    result = await login_and_sync(client or new_client(), url, token, device_id, cursor, sync=sync)
    result.client.identity = identity
    return Device(result)


@contextlib.asynccontextmanager
async def online(gw: Gateway, tenant: str, user: str, device: str) -> AsyncIterator[Device]:
    token = await gw.token(user, device, tenant)
    dev = await connect(gw.ws_url, token, Identity(tenant, user), device)
    try:
        yield dev
    finally:
        await dev.close()


async def until(check: Callable[[], bool], what: str, within: float = WAIT_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not check():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.1)


async def barrier(devices: Sequence[Device], *sends: Awaitable[SendAck]) -> list[bytes]:
    """Send later messages and wait until every device was pushed each of them; their ids.

    Why this proves that an earlier message can no longer be pushed (again) to a device: its
    user's MailboxNode folds the conversation's dispatch records in conversation_seq order,
    and plans and enqueues the PushBatches of each fetched run, in log order, right after the
    run's WriteBatch and before it folds the next run; the device's connection reads one
    to-gateway partition (its ConnectionShard) in log order and writes to the socket in that
    order. So any push of an
    earlier message of the same conversation -- a duplicate included -- reaches the socket
    before the later one. Pass one later message per conversation the check is about."""
    ids = [(await send).message_id for send in sends]
    await until(lambda: all(d.of(m) for d in devices for m in ids), "a barrier was not pushed")
    return ids


async def warm_up(send: Callable[[int], Awaitable[object]], receivers: Sequence[Device]) -> int:
    """Send until every receiver has been pushed something; returns how many were sent.

    Presence reaches the MailboxNode asynchronously, so a message sent right after a login
    may only be pulled; after this the message under test meets a warm presence cache."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    for i in range(1000):
        await send(i)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2):
                await until(lambda: all(d.entries for d in receivers), "warm-up")
            return i + 1
        assert loop.time() < deadline, "no device was ever pushed a message"
    raise AssertionError("warm-up never ended")


@dataclass(slots=True)
class Traffic:
    """Sends from ``client`` until :meth:`stop`: to ``group``, and to ``peer`` directly every
    other message when one is given; one message at a time, each acknowledged."""

    client: QimClient
    group: str
    peer: str | None = None
    tag: str = "t"
    acks: dict[bytes, tuple[str, SendAck]] = field(default_factory=dict)  # mid -> (payload, ack)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            payload = f"{self.tag}{i}"
            if self.peer is not None and i % 2:
                ack = await self.client.send_direct(
                    self.peer, payload.encode(), client_message_id=payload
                )
            else:
                ack = await self.client.send_message(
                    self.group, payload.encode(), client_message_id=payload
                )
            self.acks[ack.message_id] = (payload, ack)
            i += 1
            await asyncio.sleep(0.05)

    async def sent_more_than(self, count: int) -> None:
        await until(lambda: len(self.acks) > count, f"{self.tag}: {count} messages sent")

    async def stop(self) -> dict[bytes, tuple[str, SendAck]]:
        """Stop after the message in flight; every acknowledged message, by message_id."""
        self._stop.set()
        if self._task is not None:
            await self._task
        return self.acks


class PushWatch:
    """The PushBatches produced to ``qim.to-gateway`` since entry (async context manager)."""

    def __init__(self, bootstrap: str) -> None:
        self.batches: list[PushBatch] = []
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False
        )
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> PushWatch:
        await self._consumer.start()
        count = int(SETTINGS.connection_shard_count)
        tps = [TopicPartition(TO_GATEWAY.name, p) for p in range(count)]
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

    async def _read(self) -> None:
        while True:
            fetched = await self._consumer.getmany(timeout_ms=200)
            for records in fetched.values():
                for record in records:
                    with contextlib.suppress(msgspec.ValidationError, msgspec.DecodeError):
                        decoded = decode_to_gateway(TRANSIT.open(record.value))
                        if isinstance(decoded, PushBatch):
                            self.batches.append(decoded)

    async def caught_up(self, within: float = WAIT_S) -> None:
        """Wait until every partition was read up to its end offset as of now (a watermark:
        each PushBatch produced before this call is in :attr:`batches` afterwards)."""
        tps = list(self._consumer.assignment())
        ends = await self._consumer.end_offsets(tps)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        for tp, end in ends.items():
            while await self._consumer.position(tp) < end:
                assert loop.time() < deadline, f"{tp} never read up to {end}"
                await asyncio.sleep(0.1)

    def recipients(self, message_id: bytes) -> list[PushRecipient]:
        """Every device one message was planned for, across its batches."""
        return [r for b in self.batches if b.message_id == message_id for r in b.recipients]


async def presence_log(
    bootstrap: str, tenant: str, user: str, device: str
) -> list[PresenceEntry | None]:
    """The device's records in the presence topic, oldest first (None: a tombstone)."""
    key = PresenceKey(tenant, user, device)
    partition = key.partition(
        virtual_bucket_count=int(SETTINGS.virtual_bucket_count),
        mailbox_shard_count=int(SETTINGS.mailbox_shard_count),
    )
    tp = TopicPartition(PRESENCE.name, partition)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    out: list[PresenceEntry | None] = []
    try:
        consumer.assign([tp])
        begin = (await consumer.beginning_offsets([tp]))[tp]
        end = (await consumer.end_offsets([tp]))[tp]
        consumer.seek(tp, begin)
        while await consumer.position(tp) < end:
            fetched = await consumer.getmany(tp, timeout_ms=500)
            for record in fetched.get(tp, ()):
                if record.offset < end and record.key == key.encode():
                    out.append(decode_presence(record.value))
    finally:
        await consumer.stop()
    return out
