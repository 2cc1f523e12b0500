"""The browser chat client in headless Chromium against the real local stack (issue 24).

Kafka and Redis from the suite's ``stack`` fixture, real ``faust worker`` processes of both
apps, ``qim gateway`` and ``qim admin serve`` with the dev web endpoint, all on free loopback
ports. ``sdk/js/test/browser/chat.browser.mjs`` drives Chromium through playwright-core: alice
and bob (two devices) exchange messages, unread badges follow, reading on one of bob's devices
clears the other's badge (READ_SYNC), edit and recall reach the other side, bob's typing shows
in alice's window until its ``expires_in_ms`` runs out, alice sees bob online while his pages are
open (PRESENCE_SUB: the group's member chips and the one-to-one row's dot) and offline once they
closed, and a reload restores alice's session from the
persisted cursor with no duplicate message. Each checked step prints ``ok ...``; the script
exits 1 on the first failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from qim.core.conversation.ids import direct_conversation_id
from qim.devstack import procs
from qim.devstack.stack import ROOT, Stack
from tests.integration.test_e2e_local_stack import mailbox_serving

pytestmark = pytest.mark.integration

SDK = ROOT / "sdk" / "js"
SCRIPT = SDK / "test" / "browser" / "chat.browser.mjs"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
DEV_TENANT = "demo"  # the tenant of /dev/token (``qim admin serve --dev-tenant``'s default)


def test_two_users_chat_in_chromium_with_badges_read_sync_typing_presence_and_reload(
    stack: Stack, tmp_path: Path
) -> None:
    node = shutil.which("node")
    assert node, "node is missing: scripts/bootstrap.sh installs it"
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: scripts/bootstrap.sh installs it"
    assert (SDK / "dist" / "index.js").exists(), "sdk/js is not built: scripts/bootstrap.sh"
    assert (SDK / "node_modules" / "playwright-core").is_dir(), "npm ci in sdk/js"
    workers = list(stack.cfg.workers)
    gw, admin = stack.cfg.gateways[0], stack.cfg.admins[0]
    assert admin.web_url is not None
    for w in workers:
        stack.start_worker(w)
    stack.start_gateway(gw)
    stack.start_admin(admin)
    try:
        shards = stack.cfg.partition_counts["mailbox_shard_count"]
        procs.wait_until(
            lambda: mailbox_serving(stack, shards), timeout_s=180, what="mailbox shards served"
        )
        assert admin.dev_web_port is not None
        procs.wait_until(
            lambda: procs.port_open("127.0.0.1", admin.dev_web_port or 0),
            timeout_s=60,
            what="dev web endpoint",
        )
        result = subprocess.run(
            [node, str(SCRIPT)],
            capture_output=True,
            text=True,
            cwd=SDK,
            timeout=600,
            env={
                **os.environ,
                "QIM_WEB_URL": admin.web_url,
                "QIM_SHOT_DIR": str(tmp_path),
                "QIM_DIRECT_ID": direct_conversation_id(DEV_TENANT, "alice", "bob"),
                "CHROMIUM": CHROMIUM,
            },
        )
    finally:
        stack.stop_admin(admin)
        stack.stop_gateway(gw)
        for w in workers:
            stack.stop_worker(w)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "PASS" in result.stdout, out
    for step in (
        "bob phone shows 2 unread",
        "READ_SYNC clears the badge on bob phone",
        "bob sees alice's recall",
        "alice sees bob online",
        "the one-to-one rows show the peer online",
        'alice sees "bob is typing" in the conversation and its row',
        "the typing indicator is gone once expires_in_ms ran out",
        "no duplicates",
        "alice sees bob offline once his pages closed",
    ):
        assert step in result.stdout, out
    shots = (
        "alice.png",
        "bob.png",
        "alice-typing.png",
        "alice-reloaded.png",
        "alice-bob-offline.png",
    )
    for name in shots:
        assert (tmp_path / name).stat().st_size > 10_000, name
