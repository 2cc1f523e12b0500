"""The second check for online devices (spec 16.1.2, PD-1, INV-50/51, AT-100/103/105/106).

On the stack's own processes (gateway, conversation, mailbox and notify workers, APNs / FCM
stand-ins), like ``test_notify_e2e``; the windows are raised for this module
(``push_grace_window`` 5 s, ``push_confirm_extended_window`` 20 s = ``tcp_user_timeout`` +
grace) so a loaded 2-core machine does not turn a late evidence record into an extra push --
nothing here times anything.

alice has four devices with registered tokens:

* the phone is offline: a message wakes it at once (16.1.1);
* the desktop is online and applies what it is pushed (its PING reports the cursor): never
  pushed -- the PD-1 case "phone offline + desktop online";
* the tablet is online, is pushed, never applies, and closes cleanly: its CONN_CLOSED makes
  the MailboxNode push it the unapplied entry at once (the zombie catch-up);
* the watch is online but stops reading its socket: what no longer reaches it is pushed after
  the window, while its connection is still open.

The negative checks wait for positive barriers in alice's PushTask partition (one partition,
one order): the desktop's APPLIED evidence precedes the tablet's CONN_CLOSED on the same
user-requests partition (the gateway flushes pending evidence before a close), so the tablet's
released task in qim.push-tasks comes after the desktop's task was cancelled for good.
"""

from __future__ import annotations

import asyncio
import functools
import os
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families
from websockets.protocol import State

from qim.client import QimClient, QimError
from qim.client.heartbeat import HeartbeatConfig
from qim.client.login import login_and_sync
from qim.devstack import procs
from qim.devstack.stack import Stack
from qim.schemas.frames import ErrorCode, PushEvents
from qim.schemas.records.notify import DeviceKey, PushTask, decode_push_task
from qim.streams.topics import PUSH_TASKS
from tests.integration.test_notify_e2e import SETTINGS, WAIT_S, Scene, _get, _until, _worker
from tests.integration.test_slow_client import StallDialer

pytestmark = pytest.mark.integration

WINDOWS = {"QIM_PUSH_GRACE_WINDOW": "5000", "QIM_PUSH_CONFIRM_EXTENDED_WINDOW": "20000"}
PHONE_TOKEN = "f1" * 32
DESKTOP_TOKEN = "f2" * 32
TABLET_TOKEN = "f3" * 32
WATCH_TOKEN = "f4" * 32
LATE_TOKEN = "f5" * 32
KiB = 1024


@pytest.fixture(scope="module")
def running(stack: Stack) -> Iterator[Stack]:
    """Stand-ins, the three workers and the gateway, the workers with this module's windows."""
    started: list[Callable[[], object]] = []
    saved = {k: os.environ.get(k) for k in WINDOWS}
    os.environ.update(WINDOWS)
    try:
        stack.start_push_standins()
        started.append(stack.stop_push_standins)
        for module in ("qim.apps.conversation", "qim.apps.mailbox", "qim.apps.notify"):
            w = _worker(stack, module)
            stack.start_worker(w, timeout_s=180)
            started.append(functools.partial(stack.stop_worker, w))
        gw = stack.cfg.gateways[0]
        stack.start_gateway(gw)
        started.append(lambda: stack.stop_gateway(gw))
        mailbox = _worker(stack, "qim.apps.mailbox")
        shards = stack.cfg.partition_counts["mailbox_shard_count"]
        procs.wait_until(
            lambda: len(_get(mailbox.web_port, "/mailbox").get("serving", ())) == shards,
            timeout_s=WAIT_S,
            what="mailbox shards served",
        )
        yield stack
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        for stop in reversed(started):
            stop()


async def _tasks_until(scene: Scene, user: str, device: str, message_id: bytes) -> list[PushTask]:
    """The user's PushTasks in their partition, in order, up to ``device``'s alert for
    ``message_id`` (the barrier)."""
    key = DeviceKey(scene.tenant, user, device)
    partition = key.partition(
        virtual_bucket_count=SETTINGS.virtual_bucket_count,
        mailbox_shard_count=SETTINGS.mailbox_shard_count,
    )
    consumer = AIOKafkaConsumer(bootstrap_servers=scene.stack.cfg.kafka.bootstrap)
    await consumer.start()
    tp = TopicPartition(PUSH_TASKS.name, partition)
    consumer.assign([tp])
    await consumer.seek_to_beginning(tp)
    seen = []
    try:
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while asyncio.get_running_loop().time() < deadline:
            for record in (await consumer.getmany(tp, timeout_ms=500)).get(tp, []):
                task = decode_push_task(record.value)
                if (task.tenant_id, task.user_id) != (scene.tenant, user):
                    continue
                seen.append(task)
                if task.device_id == device and task.message_id == message_id.hex():
                    return seen
        raise AssertionError(f"no PushTask of {message_id.hex()} for {device}: {seen}")
    finally:
        await consumer.stop()


async def _pushed(client: QimClient, message_id: bytes) -> int:
    """Read the client's frames until the PUSH_EVENTS of ``message_id``; its mailbox_seq."""
    while True:
        frame = await client.next_event(timeout=WAIT_S)
        if isinstance(frame.body, PushEvents):
            for event in frame.body.events:
                if event.message_id == message_id:
                    return event.mailbox_seq


async def _send(sender: QimClient, to: str, payload: bytes, cmid: str) -> Any:
    while True:
        try:
            return await sender.send_direct(to, payload, client_message_id=cmid)
        except QimError as exc:
            if exc.code != ErrorCode.RATE_LIMITED:
                raise
            await asyncio.sleep(0.5)


async def _device(scene: Scene, device: str, push_token: str, **client: Any) -> QimClient:
    """alice's ``device`` online past ONLINE_READY (pushes flow only after the login barrier)
    with a registered token; ``client``: QimClient options."""
    fresh = QimClient(heartbeat=HeartbeatConfig(enabled=False), request_timeout=20, **client)
    token = scene.token("alice", device)
    url = scene.stack.cfg.gateways[0].url
    result = await login_and_sync(fresh, url, token, device)
    scene.clients.append(result.client)
    await scene.register(token, device, result.auth_ok.session_epoch, push_token)
    return result.client


async def test_pd1_offline_phone_pushed_applying_desktop_never_closed_tablet_at_once(
    running: Stack,
) -> None:
    scene = Scene(running)
    try:
        before = await asyncio.to_thread(scene.digests)
        phone = await _device(scene, "phone", PHONE_TOKEN)
        desktop = await _device(scene, "desktop", DESKTOP_TOKEN)
        tablet = await _device(scene, "tablet", TABLET_TOKEN)
        await _until(lambda: scene.digests() >= before + 3, "digests never reached the node")
        await phone.close()  # offline
        await _until(lambda: scene.online("alice") == ["desktop", "tablet"], "presence")

        bob, _, _ = await scene.login("bob", "phone")
        ack = await _send(bob, "alice", b"hello", "m1")
        [woke] = await scene.wait_received(PHONE_TOKEN, 1)  # offline: pushed at once
        assert woke["payload"]["aps"]["badge"] == 1

        # The desktop applies what it was pushed and says so in a PING (APPLIED evidence).
        seq = await _pushed(desktop, ack.message_id)
        desktop.applied(seq)
        await desktop.ping(timeout=20)
        # The tablet was pushed the same entry and never applies it; it closes cleanly.
        assert await _pushed(tablet, ack.message_id) == seq
        await tablet.close()

        # CONN_CLOSED: the tablet is pushed the unapplied entry, without waiting for a window.
        [caught_up] = await scene.wait_received(TABLET_TOKEN, 1)
        assert caught_up["payload"]["aps"]["badge"] == 1
        # Barrier: every PushTask of alice up to the tablet's: the phone's and the tablet's,
        # none for the desktop, whose task was cancelled by its own APPLIED before the close.
        tasks = await _tasks_until(scene, "alice", "tablet", ack.message_id)
        assert [(t.device_id, t.kind) for t in tasks] == [("phone", "alert"), ("tablet", "alert")]
        assert all(t.message_id == ack.message_id.hex() for t in tasks)
        assert await scene.received(DESKTOP_TOKEN) == []
    finally:
        await scene.aclose()


async def test_a_device_that_stops_reading_is_pushed_after_the_window_while_still_connected(
    running: Stack,
) -> None:
    scene = Scene(running)
    stall = StallDialer()
    try:
        before = await asyncio.to_thread(scene.digests)
        watch = await _device(scene, "watch", WATCH_TOKEN, dial=stall.dial)
        await _until(lambda: scene.digests() >= before + 1, "digest never reached the node")
        await _until(lambda: scene.online("alice") == ["watch"], "presence")
        bob, _, _ = await scene.login("bob", "phone")

        warm = await _send(bob, "alice", b"warm-up", "w0")
        await _pushed(watch, warm.message_id)  # pushed and read: the socket works
        assert stall.transport is not None
        stall.transport.reading.clear()  # the watch's app stops reading its socket

        # 8 KiB messages fill the watch's tiny receive buffer and the gateway's socket: the
        # later ones never reach the peer's kernel (no PUSHED, or PUSHED and never acked).
        acks = [await _send(bob, "alice", b"s" * (8 * KiB), f"s{i}") for i in range(24)]
        tasks = await _tasks_until(scene, "alice", "watch", acks[-1].message_id)
        assert {t.device_id for t in tasks} == {"watch"}
        assert await scene.wait_received(WATCH_TOKEN, 1)
        # Pushed while the connection is still open: no close released it (a close would
        # have tombstoned the watch's PresenceEntry).
        assert scene.online("alice") == ["watch"]
        assert stall.transport.ws.state is State.OPEN
    finally:
        if stall.transport is not None:
            stall.transport.reading.set()
        await scene.aclose()


def _second_checks(scene: Scene, outcome: str) -> float:
    """``push_second_check_total{outcome}`` of the mailbox worker (0 before the first)."""
    url = f"http://127.0.0.1:{scene.mailbox}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "push_second_check_total" and sample.labels == {"outcome": outcome}:
                return float(sample.value)
    return 0.0


async def test_a_close_after_the_window_is_caught_up_from_the_range_it_never_applied(
    running: Stack,
) -> None:
    """AT-106 shape: the entry reached the device's kernel (the extended window ended without
    a push: the connection was alive), the device never applied it, and its connection closes
    later: CONN_CLOSED's range (APPLIED, last_pushed_user_seq] is read back and pushed."""
    scene = Scene(running)
    try:
        before = await asyncio.to_thread(scene.digests)
        tablet = await _device(scene, "late", LATE_TOKEN)
        await _until(lambda: scene.digests() >= before + 1, "digest never reached the node")
        await _until(lambda: scene.online("alice") == ["late"], "presence")
        bob, _, _ = await scene.login("bob", "phone")
        delivered = await asyncio.to_thread(_second_checks, scene, "delivered")
        ack = await _send(bob, "alice", b"read me later", "l1")
        await _pushed(tablet, ack.message_id)  # on its socket; never applied
        # Barrier: the held task ended at the extended window as delivered, not pushed.
        await _until(
            lambda: _second_checks(scene, "delivered") > delivered, "extended window never ended"
        )
        assert await scene.received(LATE_TOKEN) == []
        ranged = await asyncio.to_thread(_second_checks, scene, "conn_closed_range")
        await tablet.close()
        tasks = await _tasks_until(scene, "alice", "late", ack.message_id)
        assert [(t.device_id, t.kind) for t in tasks] == [("late", "alert")]
        await scene.wait_received(LATE_TOKEN, 1)
        assert await asyncio.to_thread(_second_checks, scene, "conn_closed_range") > ranged
    finally:
        await scene.aclose()
