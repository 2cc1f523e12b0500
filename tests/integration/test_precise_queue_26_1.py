"""Spec 26.1 "precise personal queue" against the real mailbox worker (issue 5).

One test per case that runs on our stack (26.1.1-26.1.6), driven like the seed 003 cases
(``mailbox_support``): GroupDispatch / MemberSliceRecord records straight onto ``qim.dispatch``,
SyncAuthRequest / PullMailboxRequest on ``qim.user-requests``, MailboxReplies back from
``qim.to-gateway``. The storage observation points (26.0 table) are read from the worker's
``/mailbox/metrics``: ``storage_keys_examined`` / ``storage_rows_returned`` /
``tombstones_scanned`` / ``body_join_count`` are per-request histograms, so the ``_sum`` delta
around one request is that request's count (the ``_count`` delta proves it was one request).

Scaled down: mailbox_seqs are dispatch offsets (``compose_mailbox_seq(1, offset)``), so the
spec's 10001..10500 becomes a run of a few dozen records on a shard of its own, and the entry
cap of 26.1.6 is 100 (``QIM_MAX_MAILBOX_ENTRIES_PER_USER`` of this module's worker) instead of
1000. The assertions keep the spec's shape.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from qim.devstack.stack import Stack
from qim.schemas import compose_mailbox_seq
from qim.schemas.frames import ErrorCode, MailboxBatch, MailboxCursor, PullMailbox, SyncEntry
from qim.schemas.records.dispatch import GroupDispatch
from qim.schemas.records.membership import MemberSliceRecord
from qim.schemas.records.user_requests import MailboxReply, PullMailboxRequest
from tests.integration.mailbox_support import (
    SETTINGS,
    Client,
    Node,
    direct_dispatches,
    group_records,
    pull,
    sync_auth,
    users_on,
)

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000
CAP = 100
KEPT = int(CAP * SETTINGS.mailbox_entry_cap_hysteresis)
S1, S2, S3, S4, S5, S6 = 45, 49, 53, 57, 33, 61
"""One shard per case (none of the other mailbox modules' shards): 26.1.3 holds every lane
of its shard for a while, and each sweep trims only its own shard."""


def uid() -> str:
    return uuid.uuid4().hex[:8]


def seq(offset: int) -> int:
    return compose_mailbox_seq(1, offset)


@pytest.fixture(scope="module")
async def node(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Node]:
    env = {"QIM_MAX_MAILBOX_ENTRIES_PER_USER": str(CAP)}
    n = Node(stack, Path(tmp_path_factory.mktemp("precise-queue")) / "node", env)
    await n.start()
    try:
        await n.serving()
        yield n
    finally:
        if n.pid is not None:
            await n.stop()


@pytest.fixture(scope="module")
async def client(stack: Stack) -> AsyncIterator[Client]:
    async with Client(stack.cfg.kafka.bootstrap) as c:
        yield c


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(node: Node) -> Samples:
    """Every sample of ``/mailbox/metrics`` by (name, sorted labels)."""
    out = {}
    for family in text_string_to_metric_families(node.metrics_text()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(snapshot: Samples, name: str, **labels: str) -> float:
    return snapshot.get((name, tuple(sorted(labels.items()))), 0.0)


READS = ("storage_keys_examined", "storage_rows_returned", "tombstones_scanned", "body_join_count")


async def measured(
    node: Node, client: Client, request: PullMailboxRequest
) -> tuple[MailboxReply, dict[str, float]]:
    """``request``'s reply and its store reads (the histograms' ``_sum`` deltas)."""
    kind = {"kind": "pull_mailbox"}
    before = await asyncio.to_thread(samples, node)
    reply = await client.call(request)
    after = await asyncio.to_thread(samples, node)
    for name in READS:  # one observation each: one request, tombstones measured too
        count = value(after, f"{name}_count", **kind) - value(before, f"{name}_count", **kind)
        assert count == 1, f"{name}: expected exactly one pull answered, saw {count}"
    reads = {n: value(after, f"{n}_sum", **kind) - value(before, f"{n}_sum", **kind) for n in READS}
    return reply, reads


def ranged(
    tenant: str, user: str, after: int, up_to: int, max_items: int = 0
) -> PullMailboxRequest:
    request = pull(tenant, user, after)
    message = PullMailbox(after_seq=after, up_to_seq=up_to, max_items=max_items)
    return msgspec.structs.replace(request, message=message)


def batch_of(reply: MailboxReply) -> MailboxBatch:
    assert reply.error is None and reply.mailbox_batch is not None, reply
    return reply.mailbox_batch


def triples(entries: Sequence[SyncEntry]) -> list[tuple[int, int, int]]:
    return [(e.mailbox_seq, e.event_ordinal, e.event_id) for e in entries]


async def one(client: Client, records: Sequence[GroupDispatch]) -> int:
    (offset,) = await client.dispatch(records)
    return offset


async def trimmed_to(client: Client, tenant: str, user: str, line: int) -> int:
    """Wait for the sweep (every second) to raise ``user``'s trim line to ``line``."""
    for _ in range(240):
        reply = await client.call(ranged(tenant, user, 1, 0))
        error = reply.error
        if error is not None and error.code == ErrorCode.CURSOR_EXPIRED:
            assert error.trim_watermark is not None, error
            if error.trim_watermark >= line:
                return error.trim_watermark
        await asyncio.sleep(0.5)
    raise AssertionError(f"{user}'s trim line never reached {line}")


async def test_26_1_1_range_query_touches_only_this_users_keys(node: Node, client: Client) -> None:
    """26.1.1: 40 dispatch events on the shard, A has 3 of them, A's trim line below the
    range (two expired entries, swept). PULL(after=first seq of the range, up_to=last) reads
    exactly A's 3 keys: keys examined == rows returned == 3, tombstones scanned == 0, 3
    entries, covered_through == up_to, has_more false, answered by the one shard of A."""
    tenant = f"t-{uid()}"
    (a,) = users_on(tenant, S1, 1, "m")
    (old_sender,) = users_on(tenant, S1, 1, "b")  # the next test: a trimmed neighbour after A
    traffic = users_on(tenant, S1, 8, "x")
    (sender,) = users_on(tenant, S1, 1, "y")
    old = int(time.time() * 1000) - 40 * DAY_MS
    olds = [
        await one(client, direct_dispatches(tenant, old_sender, a, b"old%d" % i, committed_at=old))
        for i in range(2)
    ]
    mine = {7, 20, 34}
    records = [
        direct_dispatches(tenant, sender, a, b"a%d" % i)
        if i in mine
        else direct_dispatches(tenant, traffic[i % 8], traffic[(i + 1) % 8], b"x%d" % i)
        for i in range(40)
    ]
    offsets = await client.dispatch([d for r in records for d in r])
    await node.applied(S1, offsets[-1])
    trim = await trimmed_to(client, tenant, a, seq(olds[-1]))
    after, up_to = seq(offsets[0]), seq(offsets[-1])
    assert trim < after

    reply, reads = await measured(node, client, ranged(tenant, a, after, up_to))
    batch = batch_of(reply)
    print(f"\n26.1.1 reads: {reads}")
    assert reads["storage_keys_examined"] == 3
    assert reads["storage_rows_returned"] == 3
    assert reads["tombstones_scanned"] == 0
    assert [e.mailbox_seq for e in batch.entries] == [seq(offsets[i]) for i in sorted(mine)]
    assert [e.payload_or_ciphertext for e in batch.entries] == [b"a7", b"a20", b"a34"]
    assert batch.covered_through_seq == up_to
    assert not batch.has_more
    assert reply.mailbox_shard == S1  # one partition: A's (tenant, user) shard


async def test_26_1_1_tombstones_of_the_next_user_are_not_scanned(
    node: Node, client: Client
) -> None:
    """26.1.1's ``tombstones_scanned == 0`` when the user after A in key order has trimmed
    entries: A's scan ends by stepping onto the next key, which RocksDB finds only after
    skipping that user's tombstones -- unless the scan is bounded at A's prefix, as
    ``qim.tables.rocks.prefix_scan`` does."""
    tenant = f"t-{uid()}"
    (a,) = users_on(tenant, S1, 1, "m")
    (neighbour,) = users_on(tenant, S1, 1, "n")  # right after A in key order
    (sender,) = users_on(tenant, S1, 1, "b")
    old = int(time.time() * 1000) - 40 * DAY_MS
    olds = [
        await one(client, direct_dispatches(tenant, sender, neighbour, b"o", committed_at=old))
        for _ in range(3)
    ]
    offsets = await client.dispatch(
        [d for i in range(3) for d in direct_dispatches(tenant, sender, a, b"a%d" % i)]
    )
    await client.dispatch(direct_dispatches(tenant, sender, neighbour, b"live"))
    await node.applied(S1, offsets[-1])
    await trimmed_to(client, tenant, neighbour, seq(olds[-1]))
    reply, reads = await measured(node, client, ranged(tenant, a, 0, seq(offsets[-1])))
    assert len(batch_of(reply).entries) == 3
    print(f"\n26.1.1 (trimmed neighbour) reads: {reads}")
    assert reads["tombstones_scanned"] == 0


async def test_26_1_2_user_without_entries_advances_to_the_watermark_unless_trimmed(
    node: Node, client: Client
) -> None:
    """26.1.2: B has no entry in the range and a trim line below it: PULL returns no
    entries, covered_through == up_to, has_more false, 0 keys examined, no ERROR. Negative
    branch: B's trim line is raised above after_seq (a later expired entry is swept); the
    same PULL is CURSOR_EXPIRED{trim_watermark, rebuild_required} and no batch covers up_to."""
    tenant = f"t-{uid()}"
    (b,) = users_on(tenant, S2, 1, "m")
    (sender,) = users_on(tenant, S2, 1, "c")
    traffic = users_on(tenant, S2, 4, "x")
    old = int(time.time() * 1000) - 40 * DAY_MS
    for i in range(2):
        await one(client, direct_dispatches(tenant, sender, b, b"old%d" % i, committed_at=old))
    offsets = await client.dispatch(
        [
            d
            for i in range(20)
            for d in direct_dispatches(tenant, traffic[i % 4], traffic[(i + 1) % 4], b"x")
        ]
    )
    await node.applied(S2, offsets[-1])
    after, up_to = seq(offsets[0]), seq(offsets[-1])

    reply, reads = await measured(node, client, ranged(tenant, b, after, up_to))
    batch = batch_of(reply)
    assert batch.entries == ()
    assert batch.covered_through_seq == up_to  # the hole is skipped: the cursor may advance
    assert not batch.has_more
    assert reads["storage_keys_examined"] == 0
    assert reads["storage_rows_returned"] == 0

    # negative branch: an expired entry of B above after_seq raises B's trim line past it
    raised = await one(client, direct_dispatches(tenant, sender, b, b"old2", committed_at=old))
    await client.dispatch(direct_dispatches(tenant, traffic[0], traffic[1], b"now"))
    await node.applied(S2, raised)
    line = await trimmed_to(client, tenant, b, seq(raised))
    assert line == seq(raised) > after
    replay = await client.call(ranged(tenant, b, after, up_to))
    assert replay.mailbox_batch is None, "a trimmed range was reported as an empty hole"
    error = replay.error
    assert error is not None and error.code == ErrorCode.CURSOR_EXPIRED, replay
    assert error.trim_watermark == seq(raised)
    assert error.rebuild_required is True


async def test_26_1_3_no_watermark_above_an_unfinished_earlier_dispatch(
    node: Node, client: Client
) -> None:
    """26.1.3: a group dispatch at seq P waits for its member slice (the "blocked" task);
    U's one-to-one entries above P are already in the store. AUTH_OK and MAILBOX_BATCH show
    lane_watermark <= P-1, covered_through <= P-1, no entry above P-1 (a pull naming a bound
    above W is refused, not answered). Once the slice arrives a second pull fills P.. and the
    union of both pulls is the baseline without duplicates. Also: ``lane_watermark_advance``
    is on the metrics endpoint with observations."""
    tenant = f"t-{uid()}"
    members = users_on(tenant, S3, 3, "m")
    u = members[0]
    (sender,) = users_on(tenant, S3, 1, "s")
    first = await one(client, direct_dispatches(tenant, sender, u, b"before"))
    await node.applied(S3, first)
    cursor = seq(first)
    chunks, held = group_records(tenant, "g:held", members, S3, b"held")
    released = False
    try:
        p = await one(client, [held])
        later = await client.dispatch(
            [d for i in range(5) for d in direct_dispatches(tenant, sender, u, b"q%d" % i)]
        )
        await node.applied(S3, later[-1])
        stored = (await asyncio.to_thread(node.store_entries, tenant, [u], S3))[u]
        assert {seq(o) for o in later} <= set(stored), "U's later entries are not stored yet"

        login = await client.call(sync_auth(tenant, u))
        assert login.auth_sync is not None, login
        assert login.auth_sync.lane_watermark <= seq(p) - 1
        blocked = batch_of(await client.call(ranged(tenant, u, cursor, 0)))
        assert blocked.lane_watermark <= seq(p) - 1
        assert blocked.covered_through_seq <= seq(p) - 1
        assert [e for e in blocked.entries if e.mailbox_seq > seq(p) - 1] == []
        beyond = await client.call(ranged(tenant, u, cursor, seq(later[-1])))
        assert beyond.mailbox_batch is None and beyond.error is not None, beyond
        assert beyond.error.code == ErrorCode.CURSOR_INVALID
        await asyncio.sleep(2)  # the block lasts a while (no timing is asserted)

        await client.dispatch(chunks)
        released = True
        rest = await client.pull_all(tenant, u, after=blocked.covered_through_seq)
    finally:
        if not released:  # never leave the shard's lanes held for later tests
            await client.dispatch(chunks)
    union = triples([*blocked.entries, *rest])
    assert len(union) == len(set(union)), "an entry was returned twice"
    baseline = triples(await client.pull_all(tenant, u, after=cursor))
    assert sorted(union) == sorted(baseline)
    assert [t[0] for t in baseline] == [seq(p), *(seq(o) for o in later)]

    metrics = await asyncio.to_thread(samples, node)
    advances = value(metrics, "lane_watermark_advance_seconds_count")
    p99 = value(metrics, "lane_watermark_advance_p99")
    print(f"\n26.1.3: {advances:.0f} lane advances observed, p99 {p99:.3f} s")
    assert advances > 0
    assert ("lane_watermark_advance_p99", ()) in metrics


async def test_26_1_4_pull_up_to_zero_returns_the_current_lane_watermark(
    node: Node, client: Client
) -> None:
    """26.1.4: C logs in (AUTH_OK.lane_watermark = W0), then gets 20 entries while the shard
    moves on; PULL(after=W0, up_to_seq=0) is answered (no ERROR) with the server's current
    W[lane(C)]; the first batch is the one frame with a watermark above W0; paging to
    has_more=false ends at covered_through == W; C's entries in (W0, W]: none missing, no
    duplicates."""
    tenant = f"t-{uid()}"
    (c,) = users_on(tenant, S4, 1, "c")
    senders = users_on(tenant, S4, 4, "s")
    login = await client.call(sync_auth(tenant, c))
    assert login.auth_sync is not None, login
    w0 = login.auth_sync.lane_watermark
    offsets = await client.dispatch(
        [d for i in range(20) for d in direct_dispatches(tenant, senders[i % 4], c, b"c%d" % i)]
    )
    tail = await client.dispatch(direct_dispatches(tenant, senders[0], senders[1], b"tail"))
    await node.applied(S4, tail[-1])
    current = seq(await client.end_offset(S4) - 1)  # no hold on this shard: W = applied

    batches = []
    after = w0
    while True:
        reply = await client.call(ranged(tenant, c, after, 0, max_items=7))
        batch = batch_of(reply)
        batches.append(batch)
        after = batch.covered_through_seq
        if not batch.has_more:
            break
        assert len(batches) < 20
    assert batches[0].lane_watermark == current > w0  # the first batch already tells C
    assert all(b.lane_watermark == current for b in batches)
    assert batches[-1].covered_through_seq == current
    got = [e.mailbox_seq for b in batches for e in b.entries]
    assert len(got) == len(set(got))
    assert got == [seq(o) for o in offsets]


async def test_26_1_5_read_join_reads_each_body_once_and_no_message_store(
    node: Node, client: Client
) -> None:
    """26.1.5 as it maps to our design (direction.md 4.4): bodies ride in the dispatch and
    are kept once per shard, so the read-time join never calls the MessageStore (the worker
    has no MessageStore client at all). What stays measurable: (a) 30 messages of one group
    conversation and (b) 6 one-to-one chats x 5 messages, all non-inlined: the join reads
    each message_id's body exactly once (``body_join_count`` == distinct message_ids, no
    per-entry lookups) and every entry comes back with its body; inlined entries never enter
    the join (c)."""
    tenant = f"t-{uid()}"
    (d,) = users_on(tenant, S5, 1, "d")
    members = [d, *users_on(tenant, S5, 3, "g")]
    group = []
    for i in range(30):
        chunks, dispatch = group_records(tenant, "g:big", members, S5, b"g%d" % i)
        group.append(msgspec.structs.replace(dispatch, conversation_seq=i + 1))
    (chunk,) = chunks  # version 1's slice once; every dispatch is pinned to it
    peers = users_on(tenant, S5, 6, "p")
    direct = [r for i in range(30) for r in direct_dispatches(tenant, peers[i % 6], d, b"d%d" % i)]
    inline = [
        msgspec.structs.replace(r, inline_body=True)
        for i in range(10)
        for r in direct_dispatches(tenant, peers[0], d, b"i%d" % i)
    ]
    layouts: dict[str, list[GroupDispatch | MemberSliceRecord]] = {
        "a": [chunk, *group],
        "b": list(direct),
        "c": list(inline),
    }
    for name, records in layouts.items():
        offsets = await client.dispatch(records)
        await node.applied(S5, offsets[-1])
        first = seq(offsets[0]) - 1
        reply, reads = await measured(node, client, ranged(tenant, d, first, 0, max_items=500))
        entries = batch_of(reply).entries
        print(f"\n26.1.5 ({name}) reads: {reads}")
        wanted = [r for r in records if isinstance(r, GroupDispatch)]
        assert len(entries) == len(wanted)
        assert all(e.body_included for e in entries)
        assert [e.payload_or_ciphertext for e in entries] == [r.payload for r in wanted]
        joined = 0 if name == "c" else len({e.message_id for e in entries})
        assert reads["body_join_count"] == joined


async def test_26_1_6_entry_cap_trims_oldest_first_and_expires_lagging_cursors(
    node: Node, client: Client
) -> None:
    """26.1.6 at cap 100: E gets 101 entries; the fold trims E to 80 (cap x 0.8), the 21
    trimmed are the oldest, E's trim line is the 21st entry's seq, E1 (cursor at entry #10)
    gets CURSOR_EXPIRED{rebuild_required} and never AUTH_OK, E2 (fully read) logs in, E1's
    REBUILD then receives new entries, and ``mailbox_entry_cap_evicted_total{tenant}`` rose by
    21. Control (another tenant, below the cap, an expired entry): a lagging cursor is
    CURSOR_EXPIRED by the time window with no cap eviction counted."""
    tenant = f"t-{uid()}"
    (e,) = users_on(tenant, S6, 1, "e")
    senders = users_on(tenant, S6, CAP + 1, "s")  # one entry each: only E crosses the cap
    login = await client.call(sync_auth(tenant, e))
    assert login.auth_sync is not None, login
    token = login.auth_sync.mailbox_cursor_token
    before = await asyncio.to_thread(samples, node)
    offsets = await client.dispatch(
        [d for s in senders for d in direct_dispatches(tenant, s, e, b"e")]
    )
    await node.applied(S6, offsets[-1])
    seqs = [seq(o) for o in offsets]
    evicted = CAP + 1 - KEPT

    stored = (await asyncio.to_thread(node.store_entries, tenant, [e], S6))[e]
    assert stored == seqs[evicted:], "not exactly the oldest entries were trimmed"
    after = await asyncio.to_thread(samples, node)
    label = {"tenant": tenant}
    assert (
        value(after, "mailbox_entry_cap_evicted_total", **label)
        - value(before, "mailbox_entry_cap_evicted_total", **label)
        == evicted
    )

    e1 = await client.call(
        sync_auth(tenant, e, MailboxCursor(token=token, last_applied_mailbox_seq=seqs[9]))
    )
    assert e1.auth_sync is None, "a trimmed cursor degraded to AUTH_OK"
    assert e1.error is not None and e1.error.code == ErrorCode.CURSOR_EXPIRED, e1
    assert e1.error.rebuild_required is True
    assert e1.error.trim_watermark == seqs[evicted - 1]
    e2 = await client.call(
        sync_auth(tenant, e, MailboxCursor(token=token, last_applied_mailbox_seq=seqs[-1]))
    )
    assert e2.auth_sync is not None and not e2.auth_sync.has_offline, e2

    rebuild = await client.call(sync_auth(tenant, e, MailboxCursor(token=token)))
    assert rebuild.auth_sync is not None and rebuild.auth_sync.kind == "rebuild_handshake"
    start = rebuild.auth_sync.sync_to_seq
    fresh = await one(client, direct_dispatches(tenant, senders[0], e, b"after rebuild"))
    await node.applied(S6, fresh)
    assert [x.payload_or_ciphertext for x in await client.pull_all(tenant, e, after=start)] == [
        b"after rebuild"
    ]

    # control: below the cap, only the time window trims
    control = f"t-{uid()}"
    (f,) = users_on(control, S6, 1, "f")
    (g,) = users_on(control, S6, 1, "s")
    totals_before = node.totals().get("mailbox_entry_cap_evicted_total", 0)
    old = int(time.time() * 1000) - 40 * DAY_MS
    lagging = await one(client, direct_dispatches(control, g, f, b"old", committed_at=old))
    expired = await one(client, direct_dispatches(control, g, f, b"old", committed_at=old))
    recent = await one(client, direct_dispatches(control, g, f, b"now"))
    await node.applied(S6, recent)
    await trimmed_to(client, control, f, seq(expired))
    ctl_login = await client.call(sync_auth(control, f))
    assert ctl_login.auth_sync is not None
    cursor = MailboxCursor(
        token=ctl_login.auth_sync.mailbox_cursor_token, last_applied_mailbox_seq=seq(lagging)
    )
    lag = await client.call(sync_auth(control, f, cursor))
    assert lag.error is not None and lag.error.code == ErrorCode.CURSOR_EXPIRED, lag
    final = await asyncio.to_thread(samples, node)
    assert value(final, "mailbox_entry_cap_evicted_total", tenant=control) == 0
    assert node.totals().get("mailbox_entry_cap_evicted_total", 0) == totals_before
