"""``qim audit dispatch``: read the outbox, the dispatch log and the live MailboxStores; judge.

The judgement is pure (``qim.core.audit.audit_dispatch``); this module only gathers its inputs
from a running installation, in the order spec 0.2 prescribes:

1. **Window.** Read the outbox ``read_committed`` (what the FanoutCoordinator sees: an aborted
   append is no commit) from each partition's start to its current end. Outbox retention must
   still hold the groups' creations (a whole-window audit at gate time; an always-on audit with
   a durable coverage cursor is not built).
2. **Fanout catch-up.** Wait until the ``qim-fanout`` group's committed offset of every outbox
   partition is past the window's last (in-scope) record: the coordinator commits only after
   every dispatch of a record is acknowledged, so everything the window requires is then in the
   dispatch log.
3. **Dispatch log.** Read every partition ``read_committed`` (member slices ride the writer's
   transactions) to its end.
4. **Tail.** Read the outbox again from the window's end: messages committed meanwhile are
   legitimately in the dispatch log and the stores already, and are skipped, not reported.
5. **Stores.** For each shard, open every candidate store (``<datadir>/mailbox/shard-<n>`` of
   each ``--datadir``) as a RocksDB *secondary* instance -- a running MailboxNode holds the
   primary's lock, and a secondary needs none and sees a consistent view as of its open -- and
   wait until one has folded its partition up to the last record read in step 3
   (``ShardMeta.applied_seq``). The store that folded furthest is the current owner's (a worker
   that lost the shard in a rebalance keeps a stale copy). Reading the live store, rather than
   rebuilding expected entries from the dispatch log, is the point: the rebuild is what
   ``qim replay mailbox`` compares, and this audit must catch a store that diverged from it.

A timeout in steps 2 or 5 is :class:`AuditIncomplete` (the CLI exits 2), never a silent pass.
The spec's "commit recovery index" has no counterpart here: the ConversationWriter appends to the
outbox inside its Kafka transaction, so a commit fact is exactly a committed outbox record.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from qim.agents.fanout.options import GROUP_ID as FANOUT_GROUP
from qim.core.audit import AuditFinding, DispatchAudit, audit_dispatch
from qim.core.fanout import FanoutConfig
from qim.core.mailbox import MailboxConfig
from qim.ops.audit_stores import LiveStores
from qim.schemas.records.dispatch import DispatchLogRecord, decode_dispatch_record
from qim.schemas.records.membership import MembershipCommitted
from qim.schemas.records.outbox import OutboxRecord, decode_outbox_record
from qim.streams.topics import DISPATCH, OUTBOX

__all__ = ["AuditIncomplete", "AuditOptions", "run_dispatch_audit"]

Say = Callable[[str], None]
_BAD = (msgspec.DecodeError, msgspec.ValidationError, TypeError)


class AuditIncomplete(RuntimeError):
    """The inputs could not be gathered in time: no verdict."""


@dataclass(frozen=True)
class AuditOptions:
    """Where to read and with which configuration (the live workers' own)."""

    bootstrap: str
    datadirs: tuple[Path, ...]
    fanout: FanoutConfig
    mailbox: MailboxConfig
    tenants: frozenset[str] | None = None
    timeout_s: float = 120.0
    shard_epoch: int = 1
    outbox_topic: str = OUTBOX.name
    dispatch_topic: str = DISPATCH.name
    fanout_group: str = FANOUT_GROUP
    poll_s: float = 0.5

    def in_scope(self, tenant: str) -> bool:
        return self.tenants is None or tenant in self.tenants


@dataclass
class _Read:
    """Decoded records of one topic, with what a caller waits on."""

    records: list[tuple[int, Any]] = field(default_factory=list)
    ends: dict[int, int] = field(default_factory=dict)
    last: dict[int, int] = field(default_factory=dict)
    """partition -> offset of its last in-scope record."""
    top: dict[int, int] = field(default_factory=dict)
    """partition -> offset of its last record of any tenant (what a MailboxNode folds)."""
    undecodable: int = 0


async def _partitions(options: AuditOptions, topic: str) -> list[int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=options.bootstrap, client_id="qim-audit")
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    found = [p["partition"] for d in described if d["topic"] == topic for p in d["partitions"]]
    if not found:
        raise AuditIncomplete(f"topic {topic} does not exist")
    return sorted(found)


async def _read(
    options: AuditOptions,
    topic: str,
    decode: Callable[[bytes], Any],
    deadline: float,
    starts: dict[int, int] | None = None,
) -> _Read:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=options.bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed",
        client_id="qim-audit",
    )
    loop = asyncio.get_running_loop()
    out = _Read()
    partitions = await _partitions(options, topic)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        begins = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        out.ends = {tp.partition: ends[tp] for tp in tps}
        for tp in tps:
            consumer.seek(tp, max(begins[tp], (starts or {}).get(tp.partition, 0)))
        todo = {tp for tp in tps if await consumer.position(tp) < ends[tp]}
        while todo:
            if loop.time() > deadline:
                raise AuditIncomplete(f"reading {topic} did not finish in time")
            fetched = await consumer.getmany(*todo, timeout_ms=500, max_records=5000)
            for tp, batch in fetched.items():
                for msg in batch:
                    if msg.offset >= ends[tp]:
                        break
                    out.top[tp.partition] = msg.offset
                    try:
                        record = decode(msg.value)
                    except _BAD:
                        out.undecodable += 1
                        continue
                    if options.in_scope(record.tenant_id):
                        out.records.append((tp.partition, record))
                        out.last[tp.partition] = msg.offset
            todo = {tp for tp in todo if await consumer.position(tp) < ends[tp]}
    finally:
        await consumer.stop()
    return out


async def _fanout_caught_up(
    options: AuditOptions, window: _Read, deadline: float, say: Say
) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=options.bootstrap, client_id="qim-audit")
    await admin.start()
    try:
        while True:
            committed = await admin.list_consumer_group_offsets(options.fanout_group)
            behind = {
                p: last
                for p, last in window.last.items()
                if (c := committed.get(TopicPartition(options.outbox_topic, p))) is None
                or c.offset <= last
            }
            if not behind:
                return
            if asyncio.get_running_loop().time() > deadline:
                raise AuditIncomplete(f"fanout is behind the outbox on partitions {sorted(behind)}")
            say(f"waiting for fanout: {len(behind)} outbox partitions behind")
            await asyncio.sleep(options.poll_s)
    finally:
        await admin.close()


def _later_ids(tail: _Read) -> set[tuple[str, bytes]]:
    out = set()
    for _, record in tail.records:
        if not isinstance(record, MembershipCommitted) or record.conversation_seq >= 1:
            out.add((record.tenant_id, record.message_id))
    return out


async def run_dispatch_audit(options: AuditOptions, say: Say | None = None) -> DispatchAudit:
    """Gather the inputs (module docstring) and return the pure audit's verdict."""
    say = say or (lambda _: None)
    deadline = asyncio.get_running_loop().time() + options.timeout_s
    window = await _read(options, options.outbox_topic, decode_outbox_record, deadline)
    say(f"outbox window: {len(window.records)} records")
    await _fanout_caught_up(options, window, deadline, say)
    log = await _read(options, options.dispatch_topic, decode_dispatch_record, deadline)
    tail = await _read(options, options.outbox_topic, decode_outbox_record, deadline, window.ends)
    say(
        f"dispatch log: {len(log.records)} records; committed since the window: {len(tail.records)}"
    )
    targets = log.top  # the store's applied_seq counts every record, of any tenant
    with tempfile.TemporaryDirectory(prefix="qim-audit-") as scratch:
        stores = LiveStores(options.datadirs, options.shard_epoch, Path(scratch))
        try:
            while lagging := await asyncio.to_thread(stores.refresh, targets):
                if asyncio.get_running_loop().time() > deadline:
                    raise AuditIncomplete(f"mailbox stores behind the dispatch log: {lagging}")
                say(f"waiting for {len(lagging)} mailbox shards to fold the dispatch log")
                await asyncio.sleep(options.poll_s)
            outbox: list[OutboxRecord] = [r for _, r in window.records + tail.records]
            dispatch: list[tuple[int, DispatchLogRecord]] = log.records
            report = await asyncio.to_thread(
                audit_dispatch,
                outbox,
                dispatch,
                dict(stores.open),
                fanout=options.fanout,
                mailbox=options.mailbox,
                tenants=options.tenants,
                later=_later_ids(tail),
            )
        finally:
            stores.close()
    _undecodable(options, report, window, log, tail, say)
    return report


def _undecodable(
    options: AuditOptions, report: DispatchAudit, window: _Read, log: _Read, tail: _Read, say: Say
) -> None:
    """Records no decoder of ours accepts: a finding of an unscoped audit (they may be anyone's
    commits or dispatches); with ``--tenant`` they cannot be attributed, so only said."""
    counts = {"outbox": window.undecodable + tail.undecodable, "dispatch": log.undecodable}
    for topic, count in counts.items():
        if not count:
            continue
        if options.tenants is None:
            detail = f"{count} undecodable records on the {topic} topic"
            report.findings.append(AuditFinding("undecodable", "", -1, "", detail))
        else:
            say(f"{count} undecodable records on the {topic} topic (not attributable to a tenant)")


def scope(tenants: Collection[str]) -> frozenset[str] | None:
    """The CLI's ``--tenant`` values as a scope (none given: every tenant)."""
    return frozenset(tenants) or None
