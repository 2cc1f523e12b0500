"""The README's path end to end: the stack's gateway, a token from `qim token issue`, the SDK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest

from qim.client import QimClient
from qim.client.heartbeat import HeartbeatConfig
from qim.devstack import procs
from qim.devstack.stack import ROOT, Stack

pytestmark = pytest.mark.integration


def issue_token(stack: Stack, tenant: str, user: str, device: str) -> str:
    """Through the operator's command, with the stack's environment (its signing keys)."""
    result = subprocess.run(
        [sys.executable, "-m", "qim.cli", "token", "issue",
         "--tenant", tenant, "--user", user, "--device", device],
        capture_output=True, text=True, check=True, cwd=ROOT,
        env={**os.environ, **stack.cfg.env()},
    )  # fmt: skip
    return result.stdout.strip()


def mailbox_serving(stack: Stack, shards: int) -> bool:
    """The stack's MailboxNode owns and serves every shard (login sync needs it)."""
    mailbox = next(w for w in stack.cfg.workers if w.module == "qim.apps.mailbox")
    try:
        url = f"http://127.0.0.1:{mailbox.web_port}/mailbox"
        with urllib.request.urlopen(url, timeout=2) as resp:
            return len(json.loads(resp.read()).get("serving", ())) == shards
    except (OSError, ValueError):
        return False


async def test_sdk_logs_in_through_the_stacks_gateway(stack: Stack) -> None:
    gw = stack.cfg.gateways[0]
    mailbox = next(w for w in stack.cfg.workers if w.module == "qim.apps.mailbox")
    stack.start_worker(mailbox)
    stack.start_gateway(gw)
    try:
        shards = stack.cfg.partition_counts["mailbox_shard_count"]
        procs.wait_until(
            lambda: mailbox_serving(stack, shards), timeout_s=120, what="mailbox shards served"
        )
        token = issue_token(stack, "demo", "alice", "phone")
        async with QimClient(heartbeat=HeartbeatConfig(enabled=False)) as client:
            ok = await client.connect(gw.url, token, "phone")
            assert ok.session_epoch > 0
            assert client.redirects == 0
            pong = await client.ping()
            assert pong.idle_timeout_ms > 0
        # A second login of the same device gets a larger session_epoch (spec 5.4.4).
        async with QimClient(heartbeat=HeartbeatConfig(enabled=False)) as again:
            ok2 = await again.connect(gw.url, token, "phone")
            assert ok2.session_epoch > ok.session_epoch
        assert stack.status()["gateways"][gw.name]["listening"] is True
    finally:
        stack.stop_gateway(gw)
        stack.stop_worker(mailbox)
    assert stack.status()["gateways"][gw.name]["running"] is False
