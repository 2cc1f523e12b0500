"""Two real `qim gateway` processes sharing the ConnectionShards through Kafka's group protocol.

Issue 3's proof: a client that reaches the gateway not owning its user's ConnectionShard is
REDIRECTed to the owner and authenticates there (the SDK follows it), and when the owner is
killed with SIGKILL the survivor takes its shards within the lease, so the same user then logs
in on the survivor directly. Everything is real: processes, Kafka, Redis, AuthService, SDK.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from qim.auth import AuthService, KeyRing, SigningKey
from qim.client import QimClient, QimError, TransportError
from qim.client.heartbeat import HeartbeatConfig
from qim.devstack import procs
from qim.devstack.stack import ROOT, Stack

pytestmark = pytest.mark.integration

TENANT = "t-cluster"
LEASE_MS = 6000  # the broker's minimum session timeout; the shard lease of these gateways


@dataclass
class GatewayProc:
    name: str
    ws_port: int
    pid_file: Path
    log_file: Path

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.ws_port}/"

    def kill(self) -> None:
        pid = procs.read_pid(self.pid_file)
        assert pid is not None, f"{self.name} is not running"
        os.kill(pid, signal.SIGKILL)
        procs.wait_until(lambda: not procs.pid_alive(pid), timeout_s=10, what=f"{self.name} dead")

    def stop(self) -> None:
        procs.stop_pid(self.pid_file, timeout_s=20)


def start_gateway(
    stack: Stack,
    workdir: Path,
    name: str,
    group: str,
    keys: str,
    extra_env: Mapping[str, str] | None = None,
) -> GatewayProc:
    """``extra_env`` overrides the defaults below (test_online_gateway_kill turns login sync on)."""
    port = procs.free_port()
    gw = GatewayProc(name, port, workdir / f"{name}.pid", workdir / f"{name}.log")
    argv = [
        sys.executable, "-m", "qim.cli", "gateway", "--node-id", name,
        "--ws-port", str(port), "--metrics-port", "-1", "--advertise", gw.url,
        "--group-id", group,
    ]  # fmt: skip
    env = {
        **os.environ,
        **stack.cfg.env(),
        "QIM_AUTH_KEYS": keys,
        # A short lease keeps the test short; spec 19.2.2 ties two writer timings to it.
        "QIM_SHARD_LEASE_TTL": str(LEASE_MS),
        "QIM_WRITER_SELF_FENCE_DEADLINE": str(LEASE_MS * 4 // 5),
        "QIM_WRITER_LEASE_RENEW_INTERVAL": str(LEASE_MS // 3),
        # This test is about shard ownership: no MailboxNode runs, so no login sync.
        "QIM_MAILBOX_SYNC": "0",
        # Every test client comes from 127.0.0.1: lift the per-IP admission rate (20/s).
        "QIM_PER_IP_CONNECT_RATE": '{"count": 10000, "period_ms": 1000}',
        **(extra_env or {}),
    }
    pid = procs.spawn(argv, pid_file=gw.pid_file, log_file=gw.log_file, cwd=ROOT, env=env)
    try:
        procs.wait_until(
            lambda: procs.port_open("127.0.0.1", port),
            timeout_s=60,
            what=f"{name} listening",
            alive=lambda: procs.pid_alive(pid),
        )
    except (TimeoutError, RuntimeError) as exc:
        raise AssertionError(f"{exc}\n{procs.tail(gw.log_file)}") from exc
    return gw


@pytest.fixture
async def auth(stack: Stack) -> AsyncIterator[tuple[AuthService, str]]:
    ring = KeyRing([SigningKey.generate("cluster-test")])
    client = aioredis.Redis.from_url(stack.cfg.redis.url)
    try:
        yield AuthService(client, ring), ring.format()
    finally:
        await client.aclose()


async def login(service: AuthService, url: str, user: str) -> QimClient:
    """Connect as `user`; the SDK follows at most one REDIRECT."""
    token = await service.issue_token(TENANT, user, "phone")
    client = QimClient(heartbeat=HeartbeatConfig(enabled=False), connect_timeout=10)
    try:
        await client.connect(url, token, "phone")
    except BaseException:
        await client.close()
        raise
    return client


async def landing(service: AuthService, url: str, user: str) -> tuple[str, int] | None:
    """Where `user` ends up when it dials `url` (final URL, redirect count), or None while the
    gateways are rebalancing (SHARD_MOVED) or the lease of a dead owner has not run out yet
    (REDIRECT to an endpoint that refuses connections; a client backs off and retries)."""
    try:
        client = await login(service, url, user)
    except QimError as err:
        if err.name == "SHARD_MOVED":
            return None
        raise
    except TransportError:
        return None
    try:
        assert client.url is not None
        return client.url, client.redirects
    finally:
        await client.close()


async def eventually(check: object, timeout_s: float, what: str) -> object:
    assert callable(check)
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last: {last!r}")


async def test_redirect_to_the_owner_and_takeover_after_kill(
    stack: Stack, tmp_path: Path, auth: tuple[AuthService, str]
) -> None:
    service, keys = auth
    group = f"it-gateways-{uuid.uuid4().hex[:8]}"
    users = [f"user-{i}" for i in range(24)]
    a = start_gateway(stack, tmp_path, "gw-a", group, keys)
    b: GatewayProc | None = None
    try:
        # Alone, gateway A owns every shard: nobody is redirected.
        async def all_on_a() -> bool:
            spots = [await landing(service, a.url, u) for u in users[:4]]
            return all(s == (a.url, 0) for s in spots)

        await eventually(all_on_a, 60, "gateway A to own every shard")

        b = start_gateway(stack, tmp_path, "gw-b", group, keys)

        # After the rebalance, users whose shard B owns are redirected from A to B.
        async def split() -> dict[str, tuple[str, int]] | None:
            spots = {u: await landing(service, a.url, u) for u in users}
            if any(s is None for s in spots.values()):
                return None
            done = {u: s for u, s in spots.items() if s is not None}
            on_b = [u for u, s in done.items() if s == (b.url, 1)]
            on_a = [u for u, s in done.items() if s == (a.url, 0)]
            return done if on_b and on_a and len(on_a) + len(on_b) == len(users) else None

        spots = await eventually(split, 60, "the two gateways to split the shards")
        assert isinstance(spots, dict)
        moved = sorted(u for u, s in spots.items() if s == (b.url, 1))

        # A user that B owns reaches B directly with no redirect.
        assert await landing(service, b.url, moved[0]) == (b.url, 0)

        # B dies without leaving the group: within the lease, A takes B's shards back.
        b.kill()

        async def back_on_a() -> bool:
            spots = [await landing(service, a.url, u) for u in moved]
            return all(s == (a.url, 0) for s in spots)

        # The bound is a correctness timeout (lease + rebalance), not a speed measurement.
        await eventually(back_on_a, LEASE_MS / 1000 + 20, "gateway A to take B's shards")
    finally:
        a.stop()
        if b is not None:
            b.stop()
