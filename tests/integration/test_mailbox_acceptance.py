"""Seed 003 acceptance cases M-4, M-7, M-5, M-1 and M-3 against the real mailbox worker (issue 5).

The pure-core versions live in ``tests/unit/mailbox`` and ``tests/unit/sync``; here the same
cases run through a real ``faust -A qim.apps.mailbox worker`` on the real Kafka, driven with the
``tests/integration/mailbox_support.py`` harness (dispatch records in, MailboxReplies out).
Each case uses its own tenant and its own shard (none of the shards test_mailbox_node uses).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from qim.agents.mailbox.shard import encode_floor
from qim.core.fanout import FanoutState
from qim.core.membership import bitmap_from_bytes
from qim.devstack.stack import Stack
from qim.schemas import compose_mailbox_seq, dispatch_id
from qim.schemas.frames import ErrorCode, MailboxCursor, PullMailbox, SyncEntry
from qim.schemas.records.dispatch import GroupDispatch
from qim.schemas.records.membership import MemberSliceRecord
from qim.schemas.records.user_requests import PullMailboxRequest
from qim.schemas.routing import lane_id
from tests.integration.acceptance_support import call_once, commit_dispatch_metadata
from tests.integration.mailbox_support import (
    SETTINGS,
    SHARDS,
    Client,
    Node,
    direct_dispatches,
    group_records,
    pull,
    sync_auth,
    users_on,
)
from tests.unit.fanout.support import Outbox, delivered, pipeline

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000
M4_SHARD = 13
M7_SHARD = 17
M5_SHARD = 21
M1_SHARD = 25
M3_SHARD = 29


def uid() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
async def node(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Node]:
    n = Node(stack, Path(tmp_path_factory.mktemp("acceptance")) / "node")
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


def pull_limited(tenant: str, user: str, after: int, max_items: int) -> PullMailboxRequest:
    request = pull(tenant, user, after)
    return msgspec.structs.replace(
        request, message=PullMailbox(after_seq=after, max_items=max_items)
    )


def groups_of(entries: list[SyncEntry]) -> dict[int, list[SyncEntry]]:
    out: dict[int, list[SyncEntry]] = {}
    for entry in entries:
        out.setdefault(entry.mailbox_seq, []).append(entry)
    return out


async def test_m4_max_items_1_returns_whole_event_groups_and_continuation_is_contiguous(
    node: Node, client: Client
) -> None:
    """Seed 003 M-4 (I-003-1). The worker's default write tier gives a user one entry per
    dispatch (MENTION entries exist only in the unimplemented ``mention_only`` tier), so a
    4-entry group cannot be produced here; instead: paging a user with several event groups at
    ``max_items=1`` returns whole groups, and the continuation chain (after_seq :=
    covered_through_seq) has no duplicates and no gaps: its union is every entry."""
    tenant = f"t-{uid()}"
    ann, ben = users_on(tenant, M4_SHARD, 2, "u")
    records = [d for i in range(6) for d in direct_dispatches(tenant, ben, ann, b"m%d" % i)]
    offsets = await client.dispatch(records)
    await node.applied(M4_SHARD, max(offsets))

    everything = await client.pull_all(tenant, ann)
    assert [e.mailbox_seq for e in everything] == [compose_mailbox_seq(1, o) for o in offsets]
    expected_groups = groups_of(everything)

    seen: list[SyncEntry] = []
    after, pages = 0, 0
    while True:
        reply = await client.call(pull_limited(tenant, ann, after, 1))
        batch = reply.mailbox_batch
        assert batch is not None, reply
        pages += 1
        assert pages <= 50, "continuation does not terminate"
        for seq, group in groups_of(list(batch.entries)).items():
            assert group == expected_groups[seq], "an event group was split"
            assert after < seq <= batch.covered_through_seq
        assert len(groups_of(list(batch.entries))) <= 1  # max_items=1: one whole group
        assert batch.covered_through_seq >= after
        seen.extend(batch.entries)
        after = batch.covered_through_seq
        if not batch.has_more:
            break
    seqs = [e.mailbox_seq for e in seen]
    assert len(seqs) == len(set(seqs)), "a continuation pull repeated an entry"
    assert seen == everything, "the continuation chain skipped or reordered entries"
    assert pages >= len(expected_groups)


async def test_m7_rebuild_after_cursor_expired_starts_at_sync_to_seq(
    node: Node, client: Client
) -> None:
    """Seed 003 M-7 (spec 9.3.1 check 2, 9.6.3): a device whose unapplied range was trimmed
    gets CURSOR_EXPIRED{rebuild_required}; its REBUILD re-handshake (its own token, seq 0) gets
    has_offline=false with sync_to_seq = W[lane], and pulls from sync_to_seq return nothing of
    ``trim_watermark..sync_to_seq`` again."""
    tenant = f"t-{uid()}"
    erin, frank = users_on(tenant, M7_SHARD, 2, "u")
    now = int(time.time() * 1000)
    login = await client.call(sync_auth(tenant, erin))
    assert login.auth_sync is not None, login
    old = now - 40 * DAY_MS
    first = direct_dispatches(tenant, frank, erin, b"d0", committed_at=old)
    second = direct_dispatches(tenant, frank, erin, b"d1", committed_at=old + 3_600_000)
    recent = direct_dispatches(tenant, frank, erin, b"d2", committed_at=now)
    (d0,) = await client.dispatch(first)
    (d1,) = await client.dispatch(second)
    (d2,) = await client.dispatch(recent)
    await node.applied(M7_SHARD, d2)

    token = login.auth_sync.mailbox_cursor_token
    stale = MailboxCursor(token=token, last_applied_mailbox_seq=compose_mailbox_seq(1, d0))
    reply = None
    for _ in range(120):  # the sweep runs every second
        reply = await client.call(sync_auth(tenant, erin, stale))
        if reply.error is not None:
            break
        await asyncio.sleep(0.5)
    assert reply is not None
    error = reply.error
    assert error is not None and error.code == ErrorCode.CURSOR_EXPIRED, reply
    assert error.rebuild_required is True
    assert error.trim_watermark is not None and error.trim_watermark >= compose_mailbox_seq(1, d1)

    rebuild = await client.call(sync_auth(tenant, erin, MailboxCursor(token=token)))
    sync = rebuild.auth_sync
    assert sync is not None, rebuild
    assert sync.kind == "rebuild_handshake"
    assert not sync.has_offline
    assert sync.sync_to_seq == sync.lane_watermark >= compose_mailbox_seq(1, d2)
    assert sync.sync_to_seq >= error.trim_watermark

    # the rebuilt device resumes at sync_to_seq: nothing at or below it comes back
    resumed = await client.pull_all(tenant, erin, after=sync.sync_to_seq)
    assert all(e.mailbox_seq > sync.sync_to_seq for e in resumed)
    assert compose_mailbox_seq(1, d2) not in {e.mailbox_seq for e in resumed}
    # ... and a later dispatch is the only thing the next pull returns
    (d3,) = await client.dispatch(direct_dispatches(tenant, frank, erin, b"d3"))
    await node.applied(M7_SHARD, d3)
    later = await client.pull_all(tenant, erin, after=sync.sync_to_seq)
    assert [(e.mailbox_seq, e.payload_or_ciphertext) for e in later] == [
        (compose_mailbox_seq(1, d3), b"d3")
    ]


def _slots(records: list[MemberSliceRecord], version: int, user: str) -> list[int]:
    out = []
    for r in records:
        if r.membership_version == version:
            for slot, member in zip(bitmap_from_bytes(r.slot_bitmap), r.user_ids, strict=True):
                if member == user:
                    out.append(slot)
    return out


async def test_m5_rejoin_gets_a_new_slot_and_old_version_dispatches_never_reach_it(
    node: Node, client: Client
) -> None:
    """Seed 003 M-5 (I-003-5): U leaves and rejoins (with a newcomer Y), getting a slot above
    its old one; dispatches pinned to the older membership versions at seqs after the leave
    reach neither U (v1 lists U, but v2's slice closed that interval at left_at) nor Y: 0
    cross-user misdeliveries. Everything else matches the pure-core expansion of the same
    dispatch log."""
    tenant = f"t-{uid()}"
    owner, u, y = users_on(tenant, M5_SHARD, 3, "p")
    group = "g:rejoin"
    outbox = Outbox(tenant=tenant)
    outbox.clock = int(time.time() * 1000)
    outbox.create(group, owner, [u])  # v1
    outbox.send(group, owner, payload=b"before leave")
    outbox.leave(group, u)  # v2
    outbox.send(group, owner, payload=b"while away")
    assert outbox.add(group, [u, y]) is not None  # v3: U rejoins, Y joins
    outbox.send(group, owner, payload=b"after rejoin")
    log = pipeline(outbox, FanoutState())
    slices = [r for r in log if isinstance(r, MemberSliceRecord)]
    (old_slot,) = _slots(slices, 1, u)
    (new_slot,) = _slots(slices, 3, u)
    assert new_slot > old_slot
    assert _slots(slices, 2, u) == []

    # stale dispatches: pinned to v1 / v2, at a conversation_seq after the rejoin
    template = next(r for r in log if isinstance(r, GroupDispatch) and r.payload == b"after rejoin")
    stale = []
    for version in (1, 2):
        mid = ((outbox.clock + version) << 32 | 0xFFFF).to_bytes(16, "big")
        stale.append(
            msgspec.structs.replace(
                template,
                message_id=mid,
                last_activity_id=mid,
                dispatch_id=dispatch_id(int.from_bytes(mid, "big"), M5_SHARD),
                conversation_seq=template.conversation_seq + version,
                membership_version=version,
                payload=b"stale v%d" % version,
            )
        )
    ordered = [r for r in log if isinstance(r, MemberSliceRecord | GroupDispatch)]
    offsets = await client.dispatch([*ordered, *stale])
    await node.applied(M5_SHARD, max(offsets))

    expected = delivered(log, SHARDS, tenant)
    for user in (owner, u, y):
        got = {e.message_id for e in await client.pull_all(tenant, user)}
        want = {mid for mid, ds in expected.items() if any(d.user_id == user for d in ds)}
        assert want <= got, f"{user} is missing entries"
        extra = got - want
        if user == owner:
            # the owner is in every version: the stale dispatches reach it, nothing else does
            assert extra <= {s.message_id for s in stale}
        else:
            assert extra == set(), f"{user} got {len(extra)} entries pinned to old versions"
    y_entries = {e.message_id for e in await client.pull_all(tenant, y)}
    assert not y_entries & {s.message_id for s in stale}, "an old version reached the newcomer"
    u_entries = {e.message_id for e in await client.pull_all(tenant, u)}
    assert stale[1].message_id not in u_entries, "a v2 dispatch hit the rejoined user's slot"
    totals = node.totals()
    assert totals.get("mailbox_seq_regression_count", 0) == 0


async def test_m1_one_to_one_behind_a_10000_member_group_on_the_same_shard(
    node: Node, client: Client
) -> None:
    """Seed 003 M-1 (I-003-4): right after a 10,000-member group dispatch in the same
    partition, a one-to-one dispatch to U (not a member); U's entry becomes pullable and
    W[lane(U)] covers it. The wall time is printed as information only."""
    tenant = f"t-{uid()}"
    members = users_on(tenant, M1_SHARD, 10_000, "m")
    chunks, big = group_records(tenant, "g:huge", members, M1_SHARD, b"to everyone")
    sender, target = users_on(tenant, M1_SHARD, 2, "solo")
    assert target not in members
    (one,) = direct_dispatches(tenant, sender, target, b"just for you")
    group_offsets = await client.dispatch([*chunks, big])
    started = time.monotonic()
    (offset,) = await client.dispatch([one])
    assert offset > group_offsets[-1]
    seq = compose_mailbox_seq(1, offset)

    while True:
        reply = await client.call(pull(tenant, target))
        batch = reply.mailbox_batch
        assert batch is not None, reply
        if any(e.mailbox_seq == seq for e in batch.entries):
            break
        assert time.monotonic() - started < 60, "U's entry never became pullable"
    elapsed = time.monotonic() - started
    lane = lane_id(tenant, target, SETTINGS.lane_count)
    print(f"\nM-1: U's entry pullable {elapsed * 1000:.0f} ms after its dispatch (lane {lane})")
    assert batch.lane_watermark >= seq
    assert [e.payload_or_ciphertext for e in batch.entries if e.mailbox_seq == seq] == [
        b"just for you"
    ]
    await node.applied(M1_SHARD, offset)
    for user in (members[0], members[-1]):
        entries = await client.pull_all(tenant, user)
        assert [e.mailbox_seq for e in entries] == [compose_mailbox_seq(1, group_offsets[-1])]


async def test_m3_a_published_floor_above_the_recomputed_w_refuses_the_lane(
    node: Node, client: Client, stack: Stack, tmp_path: Path
) -> None:
    """Seed 003 M-3 (I-003-7): the previous owner published a W_floor for lane(U) above
    anything a fresh store can recompute (the offset-commit metadata of the dispatch
    partition); a worker on a fresh datadir answers U with SHARD_MOVED{retry_after_ms}, never
    with a watermark below the floor, while another lane of the shard is served. The group's
    metadata is reset afterwards so later workers do not inherit the floor."""
    await node.stop()  # the group must be empty to commit from outside; M-3 runs last
    tenant = f"t-{uid()}"
    bootstrap = stack.cfg.kafka.bootstrap
    end = await client.end_offset(M3_SHARD)
    u = users_on(tenant, M3_SHARD, 1, "u")[0]
    lane_u = lane_id(tenant, u, SETTINGS.lane_count)
    v = next(
        x
        for x in users_on(tenant, M3_SHARD, 50, "v")
        if lane_id(tenant, x, SETTINGS.lane_count) != lane_u
    )
    floor_seq = compose_mailbox_seq(1, end + 1_000_000)
    floor = [0] * SETTINGS.lane_count
    floor[lane_u] = floor_seq
    await commit_dispatch_metadata(bootstrap, M3_SHARD, end, encode_floor(1, floor))

    fresh = Node(stack, tmp_path / "fresh")
    await fresh.start()
    try:
        await fresh.serving()
        offsets = await client.dispatch(direct_dispatches(tenant, v, u, b"below the floor"))
        await fresh.applied(M3_SHARD, max(offsets))
        status = fresh.status()["shards"][str(M3_SHARD)]
        assert status["lanes_refused"] >= 1

        replies = [
            await call_once(client, sync_auth(tenant, u)),
            await call_once(client, pull(tenant, u)),
            await call_once(client, pull(tenant, u, after=compose_mailbox_seq(1, end))),
        ]
        for reply in replies:
            assert reply.auth_sync is None and reply.mailbox_batch is None, reply
            error = reply.error
            assert error is not None and error.code == ErrorCode.SHARD_MOVED, reply
            assert error.retry_after_ms is not None and error.retry_after_ms > 0
        # another lane of the same shard is served (and shows no watermark above its W)
        other = await call_once(client, pull(tenant, v))
        assert other.mailbox_batch is not None, other
        assert [e.payload_or_ciphertext for e in other.mailbox_batch.entries] == [
            b"below the floor"
        ]
    finally:
        await fresh.stop()
        await commit_dispatch_metadata(bootstrap, M3_SHARD, end, "")
