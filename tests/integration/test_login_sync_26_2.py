"""Spec 26.2 login-sync acceptance cases on the real stack (issue 5).

One module-scoped rig (``login_support``): real ``faust worker`` processes of
``qim.apps.conversation`` (ConversationWriter + FanoutCoordinator) and ``qim.apps.mailbox``
(MailboxNode), a syncing ConnectionNode, the SDK's ``login_and_sync`` over WebSocket, and a
:class:`~tests.integration.login_support.FrameRecorder` that records every frame on the wire.
Backlogs come through SEND_MESSAGE where the case is about the write path (26.2.1, 26.2.5) and
straight onto the dispatch topic where volume or a crafted record is needed (26.2.2, 26.2.3,
26.2.6), as the FanoutCoordinator would produce them.

Not here: 26.2.4 (gateway flow control, another work item) and 26.2.7 (no governance removal
yet). 26.2.2's 4-entry event group cannot be produced on this stack (the worker writes one
entry per user and dispatch: ``mention_entries`` is the unenabled ``mention_only`` tier), so
the whole-group and zero-progress rules run over single-entry groups of three event types here,
and over the 4-entry group in ``tests/unit/sync/test_paging.py``. Latency is printed only.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import msgspec
import pytest

from qim.client import DeviceCursor, Identity, QimClient, QimError, SyncResult, login_and_sync
from qim.devstack import procs
from qim.devstack.stack import Stack
from qim.schemas import compose_mailbox_seq
from qim.schemas.events import EventType
from qim.schemas.frames import (
    AuthOk,
    Error,
    ErrorCode,
    Frame,
    MailboxBatch,
    MailboxCursor,
    OnlineReady,
    PullMailbox,
    PushEvents,
    SyncEntry,
    UnknownFrame,
)
from qim.schemas.records.dispatch import GroupDispatch
from tests.gateway_support import Gateway
from tests.integration.login_support import (
    WAIT_S,
    FrameRecorder,
    from_sender,
    materialized,
    new_client,
    pipeline,
    syncing_gateway,
)
from tests.integration.mailbox_support import SETTINGS as MAILBOX_SETTINGS
from tests.integration.mailbox_support import Client as MailboxProbe
from tests.integration.mailbox_support import Node as MailboxWorker
from tests.integration.mailbox_support import direct_dispatches, pull, sync_auth, users_on

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000
Triple = tuple[int, int, int]


def uid() -> str:
    return uuid.uuid4().hex[:8]


def triples(entries: Sequence[SyncEntry]) -> list[Triple]:
    return [(e.mailbox_seq, e.event_ordinal, e.event_id) for e in entries]


@dataclass(frozen=True, slots=True)
class Rig:
    mailbox: MailboxWorker
    probe: MailboxProbe
    gw: Gateway


@pytest.fixture(scope="module")
async def rig(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    base = Path(tmp_path_factory.mktemp("login-26-2"))
    async with (
        pipeline(stack, base) as mailbox,
        MailboxProbe(stack.cfg.kafka.bootstrap) as probe,
        syncing_gateway(stack, "gw-26-2") as gw,
    ):
        yield Rig(mailbox, probe, gw)


async def login(
    rig: Rig,
    tenant: str,
    user: str,
    device: str,
    cursor: DeviceCursor | None = None,
    recorder: FrameRecorder | None = None,
) -> SyncResult:
    """``login_and_sync`` of one device; the caller closes ``result.client``."""
    token = await rig.gw.token(user, device, tenant)
    client = new_client(recorder)
    client.identity = Identity(tenant, user)
    return await login_and_sync(client, rig.gw.ws_url, token, device, cursor)


async def send_backlog(client: QimClient, group: str, count: int, tag: str) -> None:
    """``count`` messages; RATE_LIMITED (the writer's admission) is waited out and the same
    client_message_id sent again, as A.6 prescribes."""
    for i in range(count):
        while True:
            try:
                await client.send_message(
                    group, f"{tag}{i}".encode(), client_message_id=f"{tag}{i}"
                )
                break
            except QimError as exc:
                if exc.code is not ErrorCode.RATE_LIMITED:
                    raise
                retry_ms = exc.extras.get("retry_after_ms")
                await asyncio.sleep((retry_ms if isinstance(retry_ms, int) else 500) / 1000)


def names(frames: Sequence[Frame | UnknownFrame]) -> list[str]:
    return [f.name if isinstance(f, Frame) else "UNKNOWN" for f in frames]


B = TypeVar("B")


def bodies(frames: Sequence[Frame | UnknownFrame], kind: type[B]) -> list[B]:
    return [f.body for f in frames if isinstance(f, Frame) and isinstance(f.body, kind)]


async def test_26_2_1_many_offline_messages_give_one_auth_ok_and_no_early_push(
    rig: Rig,
) -> None:
    """26.2.1: 100 entries while bob is offline. His AUTH is answered by exactly one AUTH_OK
    with has_offline and a pending_entry_count_hint within pending_hint_error_ratio of 100;
    the wire carries no separate sync notification (every server-initiated frame before
    ONLINE_READY is a PUSH_EVENTS or a PONG, no unknown opcode), and no PUSH_EVENTS entry at
    or below sync_to_seq arrives before ONLINE_READY - while alice keeps sending live."""
    tenant, group = f"t-2621-{uid()}", f"g:2621-{uid()}"
    alice = await login(rig, tenant, "alice", "phone")
    try:
        await alice.client.create_group(group, ("bob",))
        await send_backlog(alice.client, group, 100, "b")
        await materialized(rig.probe, tenant, "bob", 100)

        recorder = FrameRecorder()

        async def live() -> None:
            """Messages while bob's login is in flight: pushes the barrier has to hold."""
            loop = asyncio.get_running_loop()
            deadline = loop.time() + WAIT_S
            while not bodies(recorder.received(), AuthOk):
                assert loop.time() < deadline, "bob's AUTH_OK never came"
                await asyncio.sleep(0.01)
            await send_backlog(alice.client, group, 5, "live")

        started = time.monotonic()
        bob, _ = await asyncio.gather(login(rig, tenant, "bob", "phone", None, recorder), live())
        print(f"\n26.2.1: AUTH -> ONLINE_READY {time.monotonic() - started:.2f} s (100 backlog)")
        # no wait here: every check below is about frames before ONLINE_READY, and login()
        # returned after reading it, so the wire up to it is complete (frames arrive in order)
        await bob.client.close()
    finally:
        await alice.client.close()

    assert recorder.dials == 1 and bob.attempts == 1
    received = recorder.received()
    assert len(bodies(received, AuthOk)) == 1, names(received)
    ok = bob.auth_ok
    assert ok.has_offline
    ratio = MAILBOX_SETTINGS.pending_hint_error_ratio
    assert abs(ok.pending_entry_count_hint - 100) <= ratio * 100, ok.pending_entry_count_hint
    assert not any(isinstance(f, UnknownFrame) for f in received)
    ready = next(
        i for i, f in enumerate(received) if isinstance(f, Frame) and f.name == "ONLINE_READY"
    )
    before = received[:ready]
    server_initiated = [f for f in before[1:] if f.header.request_id == 0]
    assert set(names(server_initiated)) <= {"PUSH_EVENTS", "PONG"}, names(server_initiated)
    pushes = bodies(received, PushEvents)
    print(
        f"26.2.1: PUSH_EVENTS before/after ONLINE_READY: {len(bodies(before, PushEvents))}"
        f"/{len(pushes) - len(bodies(before, PushEvents))}"
    )
    early = [
        e.mailbox_seq
        for push in bodies(before, PushEvents)
        for e in push.events
        if e.mailbox_seq <= ok.sync_to_seq
    ]
    assert early == [], f"pushed at or below sync_to_seq before ONLINE_READY: {early}"
    backlog = [e for e in from_sender(bob.entries, "alice") if e.mailbox_seq <= ok.sync_to_seq]
    payloads = sorted(e.payload_or_ciphertext or b"" for e in backlog)
    assert payloads == sorted(f"b{i}".encode() for i in range(100))


async def test_26_2_3_backlog_syncs_in_few_pipelined_round_trips(rig: Rig) -> None:
    """26.2.3 (functional part): a device with 3,000 backlog entries syncs with pipelined
    pulls in at most entries/pull_mailbox_max_items + 5 PULL_MAILBOX round trips, no ERROR
    frame, no triple duplicated or missing; a tampered SYNC_COMPLETE.sync_to_seq is answered
    SYNC_INCOMPLETE and the barrier stays. AUTH -> ONLINE_READY is printed, not asserted."""
    tenant, count = f"t-2623-{uid()}", 3000
    shard = 41
    ann, ben = users_on(tenant, shard, 2, "u")
    records = [d for i in range(count) for d in direct_dispatches(tenant, ben, ann, b"%d" % i)]
    offsets = await rig.probe.dispatch(records)
    await rig.mailbox.applied(shard, max(offsets), WAIT_S * 2)
    expected = [compose_mailbox_seq(1, o) for o in offsets]

    recorder = FrameRecorder()
    started = time.monotonic()
    result = await login(rig, tenant, ann, "phone", None, recorder)
    elapsed = time.monotonic() - started
    await result.client.close()
    pulls = bodies(recorder.sent(), PullMailbox)
    print(
        f"\n26.2.3: {count} entries, {len(pulls)} PULL_MAILBOX, AUTH->ONLINE_READY {elapsed:.2f}s"
    )
    max_items = MAILBOX_SETTINGS.pull_mailbox_max_items
    assert len(pulls) <= count // max_items + 5
    assert bodies(recorder.received(), Error) == []
    got = triples(result.entries)
    assert len(got) == len(set(got)) == count
    assert [t[0] for t in got] == expected
    assert result.cursor.last_applied_mailbox_seq >= expected[-1]

    # a tampered SYNC_COMPLETE: the server keeps the barrier, the right value releases it
    token = await rig.gw.token(ann, "phone", tenant)
    saved = MailboxCursor(result.cursor.token, result.cursor.last_applied_mailbox_seq)
    async with new_client() as raw:
        ok = await raw.connect(rig.gw.ws_url, token, "phone", cursor=saved)
        assert not ok.has_offline
        with pytest.raises(QimError) as info:
            await raw.sync_complete(ok.sync_to_seq - 1)
        assert info.value.code is ErrorCode.SYNC_INCOMPLETE
        assert await raw.sync_complete(ok.sync_to_seq) == OnlineReady()
    async with new_client() as fresh:  # a new device that pulled nothing claims it is done
        ok = await fresh.connect(rig.gw.ws_url, await rig.gw.token(ann, "tab", tenant), "tab")
        assert ok.has_offline
        with pytest.raises(QimError) as info:
            await fresh.sync_complete(ok.sync_to_seq)
        assert info.value.code is ErrorCode.SYNC_INCOMPLETE


async def test_26_2_5_device_cursors_do_not_swallow_each_other(rig: Rig) -> None:
    """26.2.5: dana has three devices; 100 entries arrive; A syncs and reports acked_seq (a
    second login whose pulls carry it), then B and C log in as new devices. B's and C's
    triple sets equal A's (100 messages each), A's position never shortens theirs, and the
    trim watermark every AUTH_OK reports did not move."""
    tenant, group = f"t-2625-{uid()}", f"g:2625-{uid()}"
    alice = await login(rig, tenant, "alice", "phone")
    try:
        await alice.client.create_group(group, ("dana",))
        await send_backlog(alice.client, group, 100, "e")
        await materialized(rig.probe, tenant, "dana", 100)
    finally:
        await alice.client.close()

    a1 = await login(rig, tenant, "dana", "A")
    await a1.client.close()
    recorder_a = FrameRecorder()
    a2 = await login(rig, tenant, "dana", "A", a1.cursor, recorder_a)  # reports acked_seq
    await a2.client.close()
    acked = [p.acked_seq for p in bodies(recorder_a.sent(), PullMailbox)]
    assert acked and all(a == a1.cursor.last_applied_mailbox_seq for a in acked)
    assert a2.entries == []

    others = {}
    for device in ("B", "C"):
        recorder = FrameRecorder()
        others[device] = (await login(rig, tenant, "dana", device, None, recorder), recorder)
        await others[device][0].client.close()

    a_set = set(triples(a1.entries))
    assert len(from_sender(a1.entries, "alice")) == 100
    for device, (result, recorder) in others.items():
        assert set(triples(result.entries)) == a_set, f"device {device} differs from A"
        assert len(from_sender(result.entries, "alice")) == 100
        first_pull = bodies(recorder.sent(), PullMailbox)[0]
        assert first_pull.after_seq < min(t[0] for t in a_set), f"{device} started past A's"
    trims = {r.auth_ok.trim_watermark for r in (a1, a2, *(r for r, _ in others.values()))}
    assert len(trims) == 1, f"the trim watermark moved: {trims}"


async def test_26_2_6_expired_cursor_gets_cursor_expired_and_rebuild_logs_in_normally(
    rig: Rig,
) -> None:
    """26.2.6 (what M-7 of test_mailbox_acceptance does not cover, through the gateway and the
    SDK): AUTH with a cursor below the trim line is never answered AUTH_OK, and no
    MAILBOX_BATCH reaches the device before REBUILD; the SDK's REBUILD re-handshake sets the
    cursor to its AUTH_OK.sync_to_seq; after the back-fill a normal re-login gets no
    CURSOR_EXPIRED and receives new entries."""
    tenant = f"t-2626-{uid()}"
    erin, frank = users_on(tenant, 45, 2, "u")
    first = await login(rig, tenant, erin, "phone")
    await first.client.close()
    token = first.cursor.token
    assert token

    old = int(time.time() * 1000) - 40 * DAY_MS
    (d0,) = await rig.probe.dispatch(
        direct_dispatches(tenant, frank, erin, b"d0", committed_at=old)
    )
    await rig.probe.dispatch(
        direct_dispatches(tenant, frank, erin, b"d1", committed_at=old + 3_600_000)
    )
    (d2,) = await rig.probe.dispatch(direct_dispatches(tenant, frank, erin, b"d2"))
    await rig.mailbox.applied(45, d2)
    stale_seq = compose_mailbox_seq(1, d0)
    stale = MailboxCursor(token=token, last_applied_mailbox_seq=stale_seq)
    probe_auth = msgspec.structs.replace(sync_auth(tenant, erin, stale), device_id="phone")
    for _ in range(120):  # the sweep runs every second; the token is the phone's
        reply = await rig.probe.call(probe_auth)
        if reply.error is not None:
            break
        await asyncio.sleep(0.5)
    assert reply.error is not None and reply.error.code == ErrorCode.CURSOR_EXPIRED, reply

    # 1. the raw AUTH: an ERROR, never AUTH_OK, no batch
    recorder = FrameRecorder()
    async with new_client(recorder) as raw:
        with pytest.raises(QimError) as info:
            await raw.connect(
                rig.gw.ws_url, await rig.gw.token(erin, "phone", tenant), "phone", cursor=stale
            )
    assert info.value.code is ErrorCode.CURSOR_EXPIRED
    assert info.value.extras.get("rebuild_required") is True
    trim = info.value.extras.get("trim_watermark")
    assert isinstance(trim, int) and trim > stale_seq
    assert names(recorder.received()) == ["ERROR"]

    # 2. the SDK: CURSOR_EXPIRED, then the REBUILD re-handshake; nothing pulled before it
    recorder = FrameRecorder()
    rebuilt = await login(rig, tenant, erin, "phone", DeviceCursor(token, stale_seq), recorder)
    await rebuilt.client.close()
    assert recorder.dials == 2 and rebuilt.attempts == 2
    assert names(recorder.received(0)) == ["ERROR"]
    (expired,) = bodies(recorder.received(0), Error)  # no AUTH_OK, no MAILBOX_BATCH: just this
    assert expired.code == ErrorCode.CURSOR_EXPIRED and expired.rebuild_required is True
    assert rebuilt.rebuild_required and not rebuilt.auth_ok.has_offline
    assert rebuilt.cursor.last_applied_mailbox_seq == rebuilt.auth_ok.sync_to_seq
    assert rebuilt.auth_ok.sync_to_seq >= max(trim, compose_mailbox_seq(1, d2))
    rebuilt.sync.rebuild_done()  # the 9.6.3 back-fill is the application's (not exercised)
    cursor = rebuilt.sync.cursor
    assert not cursor.rebuild_pending

    # 3. a normal re-login: no CURSOR_EXPIRED, and a new entry arrives
    (d3,) = await rig.probe.dispatch(direct_dispatches(tenant, frank, erin, b"d3"))
    await rig.mailbox.applied(45, d3)
    recorder = FrameRecorder()
    again = await login(rig, tenant, erin, "phone", cursor, recorder)
    await again.client.close()
    assert again.attempts == 1 and recorder.dials == 1
    assert bodies(recorder.received(), Error) == []
    assert [e.payload_or_ciphertext for e in again.entries] == [b"d3"]
    assert again.cursor.last_applied_mailbox_seq >= compose_mailbox_seq(1, d3)


async def _page(
    probe: MailboxProbe, tenant: str, user: str, after: int, max_items: int
) -> MailboxBatch:
    request = msgspec.structs.replace(
        pull(tenant, user, after), message=PullMailbox(after_seq=after, max_items=max_items)
    )
    reply = await probe.call(request, WAIT_S * 2)
    assert reply.mailbox_batch is not None, reply
    return reply.mailbox_batch


def _check_page(batch: MailboxBatch, after: int, groups: dict[int, list[Triple]]) -> None:
    """9.3.3: whole event groups only, never an empty zero-progress batch."""
    got: dict[int, list[Triple]] = {}
    for entry in batch.entries:
        got.setdefault(entry.mailbox_seq, []).append(triples([entry])[0])
    for seq, group in got.items():
        assert group == groups[seq], f"event group at {seq} cut: {len(group)}/{len(groups[seq])}"
        assert after < seq <= batch.covered_through_seq
    assert not (batch.has_more and batch.covered_through_seq == after), "zero-progress batch"


async def test_26_2_2_capped_pulls_keep_groups_whole_across_a_kill_9(rig: Rig) -> None:
    """26.2.2 on the real MailboxNode: pages of max_items=3 over event groups of MESSAGE,
    MEMBERSHIP and CONTROL entries never cut a group and never make zero progress; the chain
    until has_more=false equals one unlimited pull (no duplicate, none missing). Between two
    pages the worker is killed -9 and restarted - once on its own store, once on a wiped store
    (a standby rebuilding from the dispatch log) - and every (event_ordinal, event_id)
    sequence under the same mailbox_seq is identical to the one before.

    Runs last in this module: it kills the shared mailbox worker (and leaves it serving)."""
    tenant, shard = f"t-2622-{uid()}", 49
    ann, ben = users_on(tenant, shard, 2, "u")
    kinds = (EventType.MESSAGE, EventType.MEMBERSHIP, EventType.CONTROL)
    records: list[GroupDispatch] = []
    for i in range(12):
        (d,) = direct_dispatches(tenant, ben, ann, b"x%d" % i)
        records.append(msgspec.structs.replace(d, event_type=int(kinds[i % 3])))
    offsets = await rig.probe.dispatch(records)
    await rig.mailbox.applied(shard, max(offsets))

    baseline = await rig.probe.pull_all(tenant, ann)
    assert [e.mailbox_seq for e in baseline] == [compose_mailbox_seq(1, o) for o in offsets]
    assert {e.event_type for e in baseline} == {int(k) for k in kinds}
    groups: dict[int, list[Triple]] = {}
    for entry in baseline:
        groups.setdefault(entry.mailbox_seq, []).append(triples([entry])[0])

    for wipe in (False, True):
        seen: list[SyncEntry] = []
        after, pages = 0, 0
        while True:
            batch = await _page(rig.probe, tenant, ann, after, 3)
            _check_page(batch, after, groups)
            seen.extend(batch.entries)
            after, pages = batch.covered_through_seq, pages + 1
            assert pages <= 20, "the continuation does not terminate"
            if pages == 2:  # between two batches: kill -9, restart
                killed = rig.mailbox.pid
                assert procs.stop_pid(rig.mailbox.worker.pid_file, sig=signal.SIGKILL)
                if wipe:
                    rig.mailbox.worker.wipe_state()
                await rig.mailbox.start()
                await rig.mailbox.serving(WAIT_S * 2)
                assert rig.mailbox.pid not in (None, killed)
            if not batch.has_more:
                break
        assert pages > 2, "the kill did not fall between two batches"
        assert triples(seen) == triples(baseline), f"wipe={wipe}: the chain differs"
        again = await rig.probe.pull_all(tenant, ann)
        assert again == baseline, f"wipe={wipe}: entries changed across the restart"
