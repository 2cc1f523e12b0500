"""Issue 8's proof: `qim audit dispatch` finds nothing after a mixed workload with kill -9s.

Real processes only: a `faust worker` of ``qim.apps.conversation`` (ConversationWriter +
FanoutCoordinator), one of ``qim.apps.mailbox`` (MailboxNode) and a `qim gateway`; the SDK
over WebSocket sends one-to-one messages and messages to a 500-member group. During the
workload each worker type is SIGKILLed once and restarted on its own datadir: the conversation
worker (an outbox transaction and a fanout round may be cut), the mailbox worker (a fold may be
cut) and the gateway (the client reconnects and resends the same client_message_id). Then the
audit, run as the operator runs it (``python -m qim.cli audit dispatch``), must exit 0 with zero
findings, and every always-zero correctness counter (24.1.5 and our own invariants) scraped
from the restarted workers reads 0 -- the counters restart with the process, so they cover the
time after the last kill. Finally two defects are injected and the audit must name each.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from qim.auth import AuthService, KeyRing, SigningKey
from qim.client import (
    ConnectionClosedError,
    QimClient,
    QimError,
    RequestTimeout,
    TransportError,
)
from qim.client.heartbeat import HeartbeatConfig
from qim.core.mailbox import keys as mkeys
from qim.devstack import procs
from qim.devstack.stack import ROOT, Stack
from qim.observability.always_zero import ALWAYS_ZERO, always_zero_samples
from qim.tables.mailbox_store import MailboxStore
from tests.integration.mailbox_support import Client as DispatchClient
from tests.integration.mailbox_support import Node as MailboxWorker
from tests.integration.mailbox_support import direct_dispatches, shard_of
from tests.integration.test_admin_groups import WRITER_ENV, writer_serving
from tests.integration.test_gateway_cluster import LEASE_MS, GatewayProc
from tests.integration.workers import FaustWorker

pytestmark = pytest.mark.integration

TENANT = f"t-audit-{uuid.uuid4().hex[:6]}"
GROUP = f"g:audit-{uuid.uuid4().hex[:8]}"
MEMBERS = tuple(f"m{i}" for i in range(499))  # + alice = 500
PEERS = tuple(f"p{i}" for i in range(7))
ROUNDS = 24
FAST = {"count": 100_000, "period_ms": 1000}
TENANT_ENV = {
    "QIM_TENANT_OVERRIDES": json.dumps(
        {
            TENANT: {
                "per_user_msg_rate": FAST,
                "per_user_msg_rate_burst": 100_000,
                "per_conversation_msg_rate": {
                    "tiers": [{"max_members": None, "msgs_per_s": 100_000}]
                },
            }
        }
    )
}


def start_gateway(stack: Stack, workdir: Path, keys: str, metrics_port: int) -> GatewayProc:
    """A routing `qim gateway` (no login sync: sends must not wait on the MailboxNode)."""
    port = procs.free_port()
    gw = GatewayProc("gw-audit", port, workdir / "gw.pid", workdir / "gw.log")
    argv = [
        sys.executable, "-m", "qim.cli", "gateway", "--node-id", gw.name,
        "--ws-port", str(port), "--metrics-port", str(metrics_port), "--advertise", gw.url,
        "--group-id", f"qim-gw-audit-{TENANT}", "--no-mailbox-sync",
    ]  # fmt: skip
    env = {
        **os.environ,
        **stack.cfg.env(),
        "QIM_AUTH_KEYS": keys,
        "QIM_SHARD_LEASE_TTL": str(LEASE_MS),
        "QIM_WRITER_SELF_FENCE_DEADLINE": str(LEASE_MS * 4 // 5),
        "QIM_WRITER_LEASE_RENEW_INTERVAL": str(LEASE_MS // 3),
    }
    pid = procs.spawn(argv, pid_file=gw.pid_file, log_file=gw.log_file, cwd=ROOT, env=env)
    procs.wait_until(
        lambda: procs.port_open("127.0.0.1", port),
        timeout_s=60,
        what="gateway listening",
        alive=lambda: procs.pid_alive(pid),
    )
    return gw


def kill_9(pid_file: Path, what: str) -> None:
    pid = procs.read_pid(pid_file)
    assert pid is not None, f"{what} is not running"
    os.kill(pid, signal.SIGKILL)
    procs.wait_until(lambda: not procs.pid_alive(pid), timeout_s=10, what=f"{what} dead")


class Sender:
    """alice's SDK session; every send is retried with its client_message_id until acked,
    across writer takeovers (retry_after) and gateway deaths (reconnect)."""

    def __init__(self, auth: AuthService) -> None:
        self.auth = auth
        self.url = ""
        self.client: QimClient | None = None

    async def connect(self, url: str) -> None:
        self.url = url
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 90
        while True:
            client = QimClient(heartbeat=HeartbeatConfig(enabled=False), request_timeout=15)
            try:
                token = await self.auth.issue_token(TENANT, "alice", "phone")
                await client.connect(url, token, "phone")
                self.client = client
                return
            except (QimError, TransportError, ConnectionClosedError, OSError):
                await client.close()
                assert loop.time() < deadline, "alice could not log in"
                await asyncio.sleep(0.5)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()

    async def send(self, to: str, cmid: str, direct: bool) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 120
        while True:
            try:
                assert self.client is not None
                if direct:
                    await self.client.send_direct(to, cmid.encode(), client_message_id=cmid)
                else:
                    await self.client.send_message(to, cmid.encode(), client_message_id=cmid)
                return
            except (RequestTimeout, QimError, TransportError, ConnectionClosedError) as exc:
                if isinstance(exc, QimError) and exc.retry_after_ms is None:
                    raise
                assert loop.time() < deadline, f"{cmid} never acknowledged: {exc!r}"
                if isinstance(exc, (TransportError, ConnectionClosedError)):
                    await self.close()
                    await self.connect(self.url)
                else:
                    await asyncio.sleep(0.5)


async def run_audit(stack: Stack, datadir: Path) -> tuple[int, dict[str, Any]]:
    argv = [
        sys.executable, "-m", "qim.cli", "audit", "dispatch",
        "--bootstrap", stack.cfg.kafka.bootstrap, "--datadir", str(datadir),
        "--tenant", TENANT, "--timeout", "150", "--json",
    ]  # fmt: skip
    env = {**os.environ, **stack.cfg.env(), **TENANT_ENV}
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode is not None
    assert out, f"no report (exit {proc.returncode}): {err.decode()[-2000:]}"
    report: dict[str, Any] = json.loads(out)
    report["stderr"] = err.decode()[-2000:]
    return proc.returncode, report


def scrape(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())
    except (urllib.error.HTTPError, OSError):
        return None


@pytest.fixture
async def auth(stack: Stack) -> AsyncIterator[tuple[AuthService, str]]:
    ring = KeyRing([SigningKey.generate("audit-test")])
    client = aioredis.Redis.from_url(stack.cfg.redis.url)
    try:
        yield AuthService(client, ring), ring.format()
    finally:
        await client.aclose()


async def test_audit_is_clean_after_kill_9_of_every_worker_type_and_names_injected_defects(
    stack: Stack, tmp_path: Path, auth: tuple[AuthService, str]
) -> None:
    service, keys = auth
    writer = FaustWorker(
        stack, "qim.apps.conversation", tmp_path / "conversation", {**WRITER_ENV, **TENANT_ENV}
    )
    mailbox = MailboxWorker(stack, tmp_path / "mailbox", TENANT_ENV)
    metrics_port = procs.free_port()
    gw: GatewayProc | None = None
    alice = Sender(service)
    try:
        await asyncio.gather(asyncio.to_thread(writer.start), mailbox.start())
        await asyncio.gather(writer_serving(writer), mailbox.serving())
        gw = await asyncio.to_thread(start_gateway, stack, tmp_path, keys, metrics_port)
        await alice.connect(gw.url)
        assert alice.client is not None
        await alice.client.create_group(GROUP, MEMBERS, timeout=60)

        restarts: list[asyncio.Task[None]] = []
        bursts: list[asyncio.Task[None]] = []

        async def burst(name: str) -> None:
            """Four group messages at once; returns at the first SEND_ACK, so the kill that
            follows lands while the others are committing and the fanout / fold is busy."""
            tasks = [asyncio.create_task(alice.send(GROUP, f"{name}{j}", False)) for j in range(4)]
            bursts.extend(tasks)
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)

        for i in range(ROUNDS):
            await alice.send(GROUP, f"g{i}", direct=False)
            await alice.send(PEERS[i % len(PEERS)], f"d{i}", direct=True)
            if i == 5:  # the conversation worker: writer + fanout
                await burst("w")
                kill_9(writer.pid_file, "conversation worker")
                restarts.append(asyncio.create_task(asyncio.to_thread(writer.start)))
            elif i == 11:
                await burst("m")
                kill_9(mailbox.worker.pid_file, "mailbox worker")
                restarts.append(asyncio.create_task(mailbox.start()))
            elif i == 17:
                kill_9(gw.pid_file, "gateway")
                gw = await asyncio.to_thread(start_gateway, stack, tmp_path, keys, metrics_port)
                alice.url = gw.url
        await asyncio.gather(*restarts, *bursts)
        await asyncio.gather(writer_serving(writer), mailbox.serving())

        # 1. Sound: exit 0, no finding, and it covered the whole workload.
        code, report = await run_audit(stack, mailbox.worker.datadir)
        assert (code, report.get("findings")) == (0, []), report
        group_messages = ROUNDS + len(bursts)  # each reaches all 500 members, alice included
        creates = len(MEMBERS) + 1  # the create's MEMBERSHIP entries, one per member (12.9)
        expected = group_messages * (len(MEMBERS) + 1) + 2 * ROUNDS + creates
        assert report["expected_entries"] == expected
        assert report["entries_seen"] == report["expected_entries"]

        # 2. Every always-zero counter the restarted processes export reads 0.
        pages = {
            "conversation": scrape(f"http://127.0.0.1:{writer.web_port}/metrics"),
            "mailbox": scrape(f"http://127.0.0.1:{mailbox.worker.web_port}/metrics")
            or mailbox.metrics_text(),
            "gateway": scrape(f"http://127.0.0.1:{metrics_port}/metrics"),
        }
        assert all(pages.values()), {proc: bool(text) for proc, text in pages.items()}
        samples = {
            f"{proc}:{k}": v
            for proc, text in pages.items()
            for k, v in always_zero_samples(text or "", ALWAYS_ZERO[proc]).items()
        }
        print({k: v for k, v in report.items() if k not in ("findings", "stderr")})
        print(sorted(samples))
        assert {k: v for k, v in samples.items() if v} == {}

        # 3. A dispatch no commit explains: named on the log and in the store.
        ghost = direct_dispatches(TENANT, "alice", "ghost", b"never committed")
        async with DispatchClient(stack.cfg.kafka.bootstrap) as producer:
            offsets = await producer.dispatch(ghost)
        for d, offset in zip(ghost, offsets, strict=True):
            await mailbox.applied(d.target_mailbox_shard, offset)
        code, report = await run_audit(stack, mailbox.worker.datadir)
        kinds = report["counts"]
        assert code == 1 and kinds.get("dispatch_without_commit") == len(ghost), report
        assert kinds.get("entry_without_commit", 0) >= 1
        assert {f["message_id"] for f in report["findings"]} == {ghost[0].message_id.hex()}

        # 4. One entry deleted from a stopped worker's store: a missing entry, for that user.
        await mailbox.stop()
        shard = shard_of(TENANT, MEMBERS[0])
        store = MailboxStore(mailbox.worker.datadir / "mailbox" / f"shard-{shard}")
        try:
            prefix = mkeys.user_entry_prefix(TENANT, MEMBERS[0])
            key = next(k for k, _ in store.scan(prefix, prefix, False))
            store.apply([(key, None)])
        finally:
            store.close()
        code, report = await run_audit(stack, mailbox.worker.datadir)
        missing = [f for f in report["findings"] if f["kind"] == "missing_entry"]
        assert code == 1
        assert [(f["user"], f["shard"]) for f in missing] == [(MEMBERS[0], shard)], report
    finally:
        await alice.close()
        if gw is not None:
            await asyncio.to_thread(gw.stop)
        await asyncio.gather(asyncio.to_thread(writer.stop), mailbox.stop(), return_exceptions=True)
