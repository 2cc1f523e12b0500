"""Operators' view of a running stack (issue 8): /metrics, /healthz, JSON trace logs, user show.

The processes are the ones `qim up` starts (``Stack.start_worker`` / ``start_gateway``: the
conversation and mailbox workers and a gateway), with their environment, so JSON logs are on
(``QIM_LOG_FORMAT=json``) and, for this module only, every message is traced
(``QIM_TRACE_SAMPLE_PERCENT=100``). One direct message alice -> bob is sent through the SDK.

What it proves: every metric the inventory (``qim/observability/names.py``) declares for a
process is in that process's scrape; each worker's ``/healthz`` is ready with its services'
state in the body; the message's ``trace_id`` (its message_id) appears in the gateway's,
the conversation worker's (commit and dispatch) and the mailbox worker's log lines; and
``qim user show`` reports alice's device in the session table and the presence topic and
bob's shard, lane watermark and newest entry as the MailboxNode holds them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qim.client import HeartbeatConfig, Identity, QimClient, login_and_sync
from qim.devstack import procs
from qim.devstack.stack import ROOT, Stack, WorkerSpec
from qim.observability.logging import trace_id_of
from qim.observability.names import Process, by_process
from qim.params import Settings
from qim.schemas.routing import lane_id, mailbox_shard_id, user_bucket
from tests.integration.test_e2e_local_stack import issue_token

pytestmark = pytest.mark.integration

WAIT_S = 90.0


def worker(stack: Stack, module: str) -> WorkerSpec:
    return next(w for w in stack.cfg.workers if w.module == module)


@pytest.fixture(scope="module")
def running(stack: Stack) -> Iterator[Stack]:
    """Both workers and the gateway, started and stopped by this module."""
    before = os.environ.get("QIM_TRACE_SAMPLE_PERCENT")
    os.environ["QIM_TRACE_SAMPLE_PERCENT"] = "100"
    try:
        for w in stack.cfg.workers:
            stack.start_worker(w, timeout_s=240)  # waits for /healthz ready
        stack.start_gateway(stack.cfg.gateways[0])
        yield stack
    finally:
        stack.stop_gateway(stack.cfg.gateways[0])
        for w in stack.cfg.workers:
            stack.stop_worker(w)
        if before is None:
            os.environ.pop("QIM_TRACE_SAMPLE_PERCENT", None)
        else:
            os.environ["QIM_TRACE_SAMPLE_PERCENT"] = before


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def families(text: str) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+) ", text, re.M))


def scrape_urls(stack: Stack) -> dict[Process, str]:
    conv = worker(stack, "qim.apps.conversation")
    mailbox = worker(stack, "qim.apps.mailbox")
    notify = worker(stack, "qim.apps.notify")
    rooms = worker(stack, "qim.apps.rooms")
    return {
        "gateway": f"http://127.0.0.1:{stack.cfg.gateways[0].metrics_port}/metrics",
        "conversation": f"http://127.0.0.1:{conv.web_port}/metrics",
        "mailbox": f"http://127.0.0.1:{mailbox.web_port}/metrics",
        "notify": f"http://127.0.0.1:{notify.web_port}/metrics",
        "rooms": f"http://127.0.0.1:{rooms.web_port}/metrics",
    }


def test_every_process_exports_its_declared_metric_names(running: Stack) -> None:
    for process, url in scrape_urls(running).items():
        status, text = get(url)
        assert status == 200, (process, text[:200])
        exported = families(text)
        declared = {name for m in by_process(process) for name in m.exported}
        assert declared, process
        assert declared - exported == set(), process
    # the alias serves the same registry: scraped after the main path, it has every family the
    # main path had (a labelled counter's `_created` family appears with its first child, so
    # the two scrapes are compared by inclusion, in time order, not equality)
    mailbox = worker(running, "qim.apps.mailbox")
    main_families = families(get(scrape_urls(running)["mailbox"])[1])
    status, alias = get(f"http://127.0.0.1:{mailbox.web_port}/mailbox/metrics")
    assert status == 200 and main_families <= families(alias), main_families - families(alias)


def test_healthz_is_ready_with_each_services_state(running: Stack) -> None:
    conv, mailbox = worker(running, "qim.apps.conversation"), worker(running, "qim.apps.mailbox")
    status, body = get(f"http://127.0.0.1:{conv.web_port}/healthz")
    health = json.loads(body)
    assert status == 200 and health["ready"] and health["worker_ready"], health
    writer = health["services"]["conversation_writer"]
    fanout = health["services"]["fanout_coordinator"]
    assert writer["ready"] and writer["assigned"] > 0 and writer["waiting"] == []
    assert fanout["ready"] and fanout["assigned"] > 0 and fanout["stalled"] == {}
    status, body = get(f"http://127.0.0.1:{mailbox.web_port}/healthz")
    node = json.loads(body)["services"]["mailbox_node"]
    shards = Settings.load().mailbox_shard_count
    assert status == 200 and node["ready"], node
    assert node["owned"] == list(range(shards)) and node["not_ready"] == {}
    # `qim status` (the same /healthz) says every worker is ready
    workers = running.status()["workers"]
    assert all(w["health"]["ready"] for w in workers.values()), workers


def json_lines(path: Path, trace_id: str) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{") and trace_id in line:
            obj = json.loads(line)
            if obj.get("trace_id") == trace_id:
                out.append(obj)
    return out


async def test_one_message_carries_its_trace_id_through_every_process(running: Stack) -> None:
    tenant = f"t-obs-{uuid.uuid4().hex[:6]}"
    gw = running.cfg.gateways[0]
    base = running.cfg.base_dir
    conv_log = base / "workers" / worker(running, "qim.apps.conversation").name / "worker.log"
    mailbox_port = worker(running, "qim.apps.mailbox").web_port
    mailbox_log = base / "workers" / worker(running, "qim.apps.mailbox").name / "worker.log"
    gateway_log = base / "gateways" / gw.name / "gateway.log"

    token = issue_token(running, tenant, "alice", "phone")
    client = QimClient(heartbeat=HeartbeatConfig(enabled=False), request_timeout=20)
    alice = await login_and_sync(client, gw.url, token, "phone")
    alice.client.identity = Identity(tenant, "alice")
    try:
        ack = await alice.client.send_direct("bob", b"traced", client_message_id="obs-1")
        tid = trace_id_of(ack.message_id)
        bob_shard = mailbox_shard_id(user_bucket(tenant, "bob"), 64)

        def mailboxed() -> bool:
            lines = json_lines(mailbox_log, tid)
            return any(x["mailbox_shard"] == bob_shard for x in lines)

        procs.wait_until(mailboxed, timeout_s=WAIT_S, what="the mailboxed trace line")
        stages = {
            "gateway": json_lines(gateway_log, tid),
            "conversation": json_lines(conv_log, tid),
            "mailbox": json_lines(mailbox_log, tid),
        }
        assert {x["stage"] for x in stages["gateway"]} == {"acked"}
        assert {x["stage"] for x in stages["conversation"]} == {"committed", "dispatched"}
        assert {x["stage"] for x in stages["mailbox"]} == {"mailboxed"}
        committed = next(x for x in stages["conversation"] if x["stage"] == "committed")
        assert committed["client_message_id"] == "obs-1" and committed["tenant_id"] == tenant
        assert stages["gateway"][0]["client_message_id"] == "obs-1"
        assert {x["process"] for x in stages["conversation"]} == {"qim-conversation"}
        bob_line = next(x for x in stages["mailbox"] if x["mailbox_shard"] == bob_shard)
        dispatched = {x["mailbox_shard"] for x in stages["conversation"] if "dispatch_id" in x}
        assert bob_shard in dispatched

        # qim user show, while alice is online
        alice_view = user_show(running, tenant, "alice", mailbox_port)
        assert [d["device_id"] for d in alice_view["sessions"]] == ["phone"]
        assert alice_view["sessions"][0]["session_epoch"] >= 1
        assert [(d["device_id"], d["online"]) for d in alice_view["presence"]] == [("phone", True)]
        bob_view = user_show(running, tenant, "bob", mailbox_port)
        assert bob_view["sessions"] == [] and bob_view["presence"] == []
        assert bob_view["mailbox_shard"] == bob_shard
        assert bob_view["lane_id"] == lane_id(tenant, "bob", 64)
        mailbox = bob_view["mailbox"]
        assert mailbox["owned_here"] and mailbox["lane"]["served"]
        bounds = mailbox["cursor_bounds"]
        assert bounds["entry_count"] == 1
        assert bounds["last_entry"]["mailbox_seq"] == bob_line["mailbox_seq"]
        assert mailbox["lane"]["watermark"]["mailbox_seq"] >= bob_line["mailbox_seq"]
    finally:
        await alice.client.close()


def user_show(stack: Stack, tenant: str, user: str, mailbox_port: int) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "qim.cli", "user", "show", "--tenant", tenant, "--user", user,
         "--mailbox-url", f"http://127.0.0.1:{mailbox_port}"],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, **stack.cfg.env()},
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    view: dict[str, Any] = json.loads(result.stdout)
    return view
