"""The gateway refuses to start on a Redis that would lose or evict auth state (issue 21, M-6).

A private ``redis-server`` with eviction on and persistence off is started on a free port (and
stopped by its pid); ``qim gateway`` pointed at it exits non-zero naming both settings and never
listens. The suite's own Redis (AOF on, noeviction) passes the same check.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from redis.asyncio import Redis

from qim.auth.redis_check import UnsafeRedisError, ensure_safe_redis
from qim.devstack import procs
from qim.devstack.redis import ping
from qim.devstack.stack import Stack

pytestmark = pytest.mark.integration


async def test_the_suites_redis_passes_the_safety_check(stack: Stack) -> None:
    redis = Redis.from_url(stack.cfg.redis.url)
    try:
        await ensure_safe_redis(redis)
    finally:
        await redis.aclose()


def test_a_gateway_refuses_an_evicting_redis_without_persistence(tmp_path: Path) -> None:
    binary = shutil.which("redis-server")
    assert binary, "redis-server is missing: scripts/bootstrap.sh installs it"
    port = procs.free_port()
    pid_file = tmp_path / "redis.pid"
    procs.spawn(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
         "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru", "--dir", str(tmp_path)],
        pid_file=pid_file, log_file=tmp_path / "redis.log",
    )  # fmt: skip
    try:
        procs.wait_until(lambda: ping(port), timeout_s=20, what="private Redis PING")
        ws_port = procs.free_port()
        env = {**os.environ, "QIM_AUTH_KEYS_FILE": str(tmp_path / "keys")}
        result = subprocess.run(
            [sys.executable, "-m", "qim.cli", "gateway", "--node-id", "gw-unsafe",
             "--ws-port", str(ws_port), "--metrics-port", str(procs.free_port()),
             "--redis-url", f"redis://127.0.0.1:{port}/0", "--no-routing"],
            capture_output=True, text=True, timeout=120, env=env, check=False,
        )  # fmt: skip
        out = result.stdout + result.stderr
        assert result.returncode != 0, out
        assert "allkeys-lru" in out and "appendonly" in out, out
        assert not procs.port_open("127.0.0.1", ws_port)
    finally:
        procs.stop_pid(pid_file, timeout_s=15)


async def test_ensure_safe_redis_names_the_problems(tmp_path: Path) -> None:
    binary = shutil.which("redis-server")
    assert binary
    port = procs.free_port()
    pid_file = tmp_path / "redis.pid"
    procs.spawn(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path)],
        pid_file=pid_file, log_file=tmp_path / "redis.log",
    )  # fmt: skip
    redis = Redis.from_url(f"redis://127.0.0.1:{port}/0")
    try:
        procs.wait_until(lambda: ping(port), timeout_s=20, what="private Redis PING")
        with pytest.raises(UnsafeRedisError, match="persistence is off"):
            await ensure_safe_redis(redis)
    finally:
        await redis.aclose()
        procs.stop_pid(pid_file, timeout_s=15)
