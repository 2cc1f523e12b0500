"""The session list on a real MailboxNode (issue 7, stages 1-2): dispatches in, pages out.

A real ``faust -A qim.apps.mailbox worker`` folds the dispatch log; PULL_SESSION_LIST and
user-state requests go through ``qim.user-requests`` exactly as the gateway sends them. The
list is compared with a reference computed from the dispatched history alone.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec
import pytest

from qim.agents.mailbox.options import MailboxOptions
from qim.agents.mailbox.replay import replay_worker_shard
from qim.core.mailbox.sessions import drop_ops, load_projection, rebuild_ops
from qim.core.mailbox.user_state import USER_STATE_CUSTOM_TYPE
from qim.devstack.stack import Stack
from qim.params import Settings
from qim.schemas.events import EventType
from qim.tables.mailbox_store import MailboxStore
from tests.integration.mailbox_support import (
    WORKER_ENV,
    Client,
    Node,
    shard_of,
    sync_auth,
    user_state,
    users_on,
)
from tests.integration.session_support import history, reference, shown

pytestmark = pytest.mark.integration

SHARD = 11


@pytest.fixture(scope="module")
async def node(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Node]:
    n = Node(stack, tmp_path_factory.mktemp("sessions") / "node")
    await n.start()
    try:
        await n.serving()
        yield n
    finally:
        await n.stop()


@pytest.fixture(scope="module")
async def client(stack: Stack) -> AsyncIterator[Client]:
    async with Client(stack.cfg.kafka.bootstrap) as c:
        yield c


async def test_offline_history_gives_the_reference_list_and_auth_badge(
    node: Node, client: Client
) -> None:
    """300 messages from 3 senders into 5 conversations while the user is offline -> every
    page of PULL_SESSION_LIST (keyset, 2 rows a page) equals the reference from history:
    order, previews, unread and mention counts; own messages never count; AUTH_OK's badge
    is the sum."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    me, *senders = users_on(tenant, SHARD, 4, "u")
    records = history(tenant, me, senders, 300)
    offsets = await client.dispatch(records)
    await node.applied(SHARD, offsets[-1])

    expected = reference(records, me)
    listed = await client.session_list(tenant, me, limit=2)
    assert shown(listed) == expected
    assert all(e.read_conversation_seq == 0 for e in listed)
    reply = await client.call(sync_auth(tenant, me))
    assert reply.auth_sync is not None, reply
    assert reply.auth_sync.total_unread == sum(row[3] for row in expected)
    assert reply.auth_sync.total_mention == sum(row[5] for row in expected)
    assert reply.auth_sync.projection_complete
    assert reply.auth_sync.badge_projection_mailbox_seq > 0


async def test_mark_read_goes_through_the_log_and_replay_is_byte_identical(
    stack: Stack, node: Node, client: Client, tmp_path: Path
) -> None:
    """MARK_READ -> a ``UserStateCommand`` on the shard log -> the CONTROL entry in the
    user's mailbox (origin device named) and unread 0 in the list; then rebuilding the shard
    from its dispatch partition gives the live store byte for byte, the session keyspaces
    (U, J, R) included."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    me, *senders = users_on(tenant, SHARD, 4, "m")
    records = history(tenant, me, senders, 60, seed=11)
    offsets = await client.dispatch(records)
    await node.applied(SHARD, offsets[-1])
    first = reference(records, me)[0]
    conv, latest = first[0], first[1]
    assert first[3] > 0

    await client.send(
        user_state(tenant, me, conv, "mark_read", device="phone", read_conversation_seq=latest)
    )
    read = {conv: latest}

    async def caught_up() -> bool:
        return shown(await client.session_list(tenant, me, limit=50)) == reference(
            records, me, read
        )

    await _eventually_async(caught_up, "the list follows MARK_READ")
    entries = await client.pull_all(tenant, me)
    controls = [e for e in entries if e.event_type == EventType.CONTROL]
    assert [(c.custom_type, c.origin_device_id, c.conversation_seq) for c in controls] == [
        (USER_STATE_CUSTOM_TYPE, "phone", latest)
    ]
    listed = await client.session_list(tenant, me, limit=50)
    assert next(e for e in listed if e.conversation_id == conv).read_conversation_seq == latest

    options = MailboxOptions.load(
        Settings.load(env=WORKER_ENV),
        WORKER_ENV,
        bootstrap=stack.cfg.kafka.bootstrap,
        datadir=node.worker.datadir,
    )
    report = await replay_worker_shard(options, SHARD, tmp_path / "replay")
    print("\n".join(report.lines()))
    assert report.identical, report.lines()
    assert shard_of(tenant, me) == SHARD


async def _eventually_async(
    check: Callable[[], Awaitable[bool]], what: str, within: float = 60.0
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.3)


async def test_250_unread_mark_unread_and_pin_on_the_live_node(node: Node, client: Client) -> None:
    """250 messages in one conversation -> unread_exact=false (unread_precise_limit 200);
    mark unread on a fully read conversation shows >= 1, inexact; a pin moves it first."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    me, *senders = users_on(tenant, SHARD, 2, "p")
    flood = history(tenant, me, senders, 250, conversations=1, seed=5, own_every=10**6)
    quiet = [
        msgspec.structs.replace(d, conversation_id="quiet", payload=b"q")
        for d in history(tenant, me, senders, 1, conversations=1, seed=6)
    ]
    offsets = await client.dispatch([*quiet, *flood])
    await node.applied(SHARD, offsets[-1])
    rows = {e.conversation_id: e for e in await client.session_list(tenant, me, limit=50)}
    assert (rows["c0"].unread_count, rows["c0"].unread_exact) == (200, False)
    latest = rows["quiet"].latest_conversation_seq
    await client.send(user_state(tenant, me, "quiet", "mark_read", read_conversation_seq=latest))
    await client.send(user_state(tenant, me, "quiet", "mark_unread"))
    await client.send(user_state(tenant, me, "quiet", "pin", pin_rank=1))

    async def settled() -> bool:
        listed = await client.session_list(tenant, me, limit=50)
        top = listed[0]
        return (top.conversation_id, top.pin_rank, top.unread_count, top.unread_exact) == (
            "quiet",
            1,
            1,
            False,
        )

    await _eventually_async(settled, "mark unread and pin")

    # Drop the projections on the stopped node's store and rebuild them (entries + 7.5
    # state): the same list (mark unread and pin included) and the same AUTH_OK badge.
    before = await client.session_list(tenant, me, limit=50)
    badge = (await client.call(sync_auth(tenant, me))).auth_sync
    await node.stop()
    options = MailboxOptions.load(
        Settings.load(env=WORKER_ENV),
        WORKER_ENV,
        bootstrap="127.0.0.1:9",
        datadir=node.worker.datadir,
    )
    config = options.config(SHARD)
    store = MailboxStore(options.store_path(SHARD))
    try:
        store.apply(drop_ops(store, tenant, me))
        assert load_projection(store, tenant, me).rows == {}
        store.apply(rebuild_ops(store, tenant, me, config.session_list, config.lane_count))
    finally:
        store.close()
    await node.start()
    await node.serving()
    assert await client.session_list(tenant, me, limit=50) == before
    again = (await client.call(sync_auth(tenant, me))).auth_sync
    assert badge is not None and again is not None
    assert (again.total_unread, again.total_mention) == (badge.total_unread, badge.total_mention)


def _replay_projections(datadir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "qim.cli", "replay", "projections", "--shard", str(SHARD)]
    argv += ["--datadir", str(datadir), *extra]
    env = {**os.environ, **WORKER_ENV}
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, check=False)


async def test_qim_replay_projections_rebuilds_every_list_equal_to_the_live_one(
    node: Node, client: Client
) -> None:
    """Issue 8: `qim replay projections` rebuilds every user's list and badge of the shard from
    entries + 7.5 state next to the running node and finds them equal; with --apply on the
    stopped node it rewrites them and the node serves the same list afterwards."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    me, *senders = users_on(tenant, SHARD, 3, "p")
    offsets = await client.dispatch(history(tenant, me, senders, 40))
    await node.applied(SHARD, offsets[-1])
    before = await client.session_list(tenant, me, limit=50)

    check = _replay_projections(node.worker.datadir)
    assert check.returncode == 0, check.stdout + check.stderr
    assert ": identical" in check.stdout and " 0 users" not in check.stdout, check.stdout

    await node.stop()
    try:
        applied = _replay_projections(node.worker.datadir, "--apply")
        assert applied.returncode == 0, applied.stdout + applied.stderr
        assert "rebuilt and checked: identical" in applied.stdout, applied.stdout
    finally:
        await node.start()
        await node.serving()
    assert await client.session_list(tenant, me, limit=50) == before
