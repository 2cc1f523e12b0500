"""Test workers of the ConversationWriter: real `faust worker` processes, and one partition
run in-process on private topics (``PrivatePartition``) for tests that drive the shell directly.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import time
import urllib.error
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from qim.agents.writer.options import WriterOptions
from qim.agents.writer.requests import RequestContext
from qim.agents.writer.restore import restore_partition
from qim.agents.writer.txn import CrashHook, OwnedPartition, Topics
from qim.devstack import procs
from qim.devstack.stack import Stack, wait_topics_visible
from qim.params import Settings
from qim.schemas.records import ConversationRequest, MessageCommitted, encode_record
from qim.streams.topics import ADMIN_REPLIES, DISPATCH, TO_GATEWAY
from qim.tables.message_store import MessageStore
from tests.integration.workers import FaustWorker
from tests.integration.writer_support import BULK_TENANT, TIMEOUT, read_outbox

MODULE = "qim.apps.conversation"

WORKER_ENV = {
    "QIM_SHARD_LEASE_TTL": "6000",
    "QIM_WRITER_SELF_FENCE_DEADLINE": "4800",
    "QIM_WRITER_LEASE_RENEW_INTERVAL": "2000",
    "QIM_WRITER_CHECKPOINT_EVERY": "50",
    "QIM_TENANT_OVERRIDES": json.dumps(
        {
            BULK_TENANT: {
                "per_user_msg_rate": {"count": 100_000, "period_ms": 1000},
                "per_user_msg_rate_burst": 100_000,
                "per_conversation_msg_rate": {
                    "tiers": [{"max_members": None, "msgs_per_s": 100_000}]
                },
            }
        }
    ),
}
"""Every test worker: a 6 s lease (takeovers wait one session; the params validation wants
self-fence < lease and renew <= lease / 3), a checkpoint every 50 records (so restores read
one), and admission limits raised for ``BULK_TENANT`` only."""


@dataclass(frozen=True)
class Consumed:
    """The two fields of a consumer record ``OwnedPartition.process`` reads."""

    offset: int
    value: bytes


class PrivatePartition:
    """One writer partition run in-process on private topics (its own transactional id), so a
    test can take it over twice and call ``OwnedPartition.process`` directly."""

    def __init__(self, bootstrap: str, base: Path, run: str) -> None:
        self.bootstrap = bootstrap
        self.base = base
        self.run = run
        self.tenant = f"t-{run}"
        self.names = {kind: f"it-writer-{kind}-{run}" for kind in ("requests", "outbox", "snap")}
        self.options = WriterOptions.load(
            Settings.load(env={}), {}, bootstrap=bootstrap, datadir=base
        )
        self.owned: list[OwnedPartition] = []
        self._offset = itertools.count()

    @classmethod
    async def create(cls, bootstrap: str, base: Path) -> PrivatePartition:
        part = cls(bootstrap, base, uuid.uuid4().hex[:8])
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:  # in the loop, not in a thread: CPython 3.11's ast state is not thread-safe
            topics = [
                NewTopic(
                    name, 1, 1, topic_configs={"cleanup.policy": "compact"} if k == "snap" else {}
                )
                for k, name in part.names.items()
            ]
            await admin.create_topics(topics)
            await wait_topics_visible(admin, dict.fromkeys(part.names.values(), 1))
        finally:
            await admin.close()
        return part

    def store_path(self, name: str) -> Path:
        return self.base / name

    async def take_over(self, name: str, checkpoint_every: int = 1000) -> OwnedPartition:
        """Fence the previous owner and restore, as a worker does on assignment."""
        result = await restore_partition(
            0,
            bootstrap=self.bootstrap,
            outbox_topic=self.names["outbox"],
            snapshots_topic=self.names["snap"],
            store_path=self.store_path(name),
            open_store=MessageStore,
            dormant=None,
            config=self.options.config,
            region_id=0,
            mailbox_shard_count=self.options.mailbox_shard_count,
            transactional_id=f"it-writer-{self.run}-0",
            transaction_timeout_ms=60_000,
            client_id=f"it-{name}",
        )
        topics = Topics(
            requests=self.names["requests"],
            outbox=self.names["outbox"],
            snapshots=self.names["snap"],
            to_gateway=TO_GATEWAY.name,
            dispatch=DISPATCH.name,
            admin_replies=ADMIN_REPLIES.name,
            to_gateway_partitions=256,
        )
        owned = OwnedPartition(
            result.writer,
            result.producer,
            topics=topics,
            group_id=f"it-writers-{self.run}",
            ctx=RequestContext(config=self.options.config, partition_count=1, max_members=1000),
            checkpoint_every=checkpoint_every,
            checkpoint_interval_s=3600,
            lease_valid=lambda: True,
            crash=CrashHook(),
        )
        self.owned.append(owned)
        return owned

    async def process(self, owned: OwnedPartition, request: ConversationRequest) -> None:
        await owned.process([Consumed(next(self._offset), encode_record(request))])

    async def messages(self, conversation_id: str) -> list[tuple[str, int, int]]:
        """``(client_message_id, seq, fencing_epoch)`` of the committed messages."""
        records = await read_outbox(
            self.bootstrap, self.tenant, conversation_id, topic=self.names["outbox"], partitions=1
        )
        return [
            (r.client_message_id, r.conversation_seq, r.fencing_epoch)
            for r in records
            if isinstance(r, MessageCommitted)
        ]

    async def close(self) -> None:
        for owned in self.owned:
            await owned.close()
            owned.writer.close()


class Workers:
    """The running primary writer, replaced by the tests that kill or fence it."""

    def __init__(self, stack: Stack, base: Path) -> None:
        self.stack = stack
        self.base = base
        self.primary: Writer | None = None
        self.all: list[Writer] = []

    def new(self, env: dict[str, str] | None = None, workdir: Path | None = None) -> Writer:
        writer = Writer(self.stack, workdir or self.base / f"w{len(self.all) + 1}", env)
        self.all.append(writer)
        return writer

    async def ensure_primary(self) -> Writer:
        if self.primary is None or self.primary.pid is None:
            self.primary = self.new()
            await self.primary.start()
        await self.primary.serving()
        return self.primary

    async def stop_all(self) -> None:
        for writer in self.all:
            if writer.pid is not None:
                writer.signal(signal.SIGCONT)
            await writer.stop()


class Writer:
    """One ConversationWriter worker process with test controls."""

    def __init__(self, stack: Stack, workdir: Path, env: dict[str, str] | None = None) -> None:
        self.worker = FaustWorker(stack, MODULE, workdir, {**WORKER_ENV, **(env or {})})

    @property
    def pid(self) -> int | None:
        return procs.read_pid(self.worker.pid_file)

    async def start(self) -> None:
        await asyncio.to_thread(self.worker.start)

    async def stop(self) -> None:
        await asyncio.to_thread(self.worker.stop)

    def signal(self, sig: signal.Signals) -> None:
        pid = self.pid
        assert pid is not None, "worker is not running"
        os.kill(pid, sig)

    def status(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = self.worker.get("/writer")
        except (OSError, urllib.error.HTTPError):
            return {}
        return data

    async def serving(
        self, partitions: Iterable[int] = range(16), within: float = TIMEOUT
    ) -> float:
        """Wait until this worker serves ``partitions``; returns the seconds it took."""
        wanted = set(partitions)
        t0 = time.monotonic()
        await eventually(
            lambda: wanted <= set(self.status().get("serving", ())),
            within,
            f"serving {sorted(wanted)}",
            diagnose=self.worker.log_tail,
        )
        return time.monotonic() - t0

    async def exited(self, within: float = TIMEOUT) -> None:
        await eventually(lambda: self.pid is None, within, "worker exit")


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
