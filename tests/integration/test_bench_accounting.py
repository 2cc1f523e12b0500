"""The load generator's accounting against the real pipeline (issue 9's proof).

Real conversation and mailbox ``faust worker`` processes, the stack's own ``qim gateway``
process (real AuthService, shard ownership, routing, login sync), tokens minted with the
stack's key ring. A few seconds of open-loop one-to-one sends at a low rate: every SEND_ACK is
matched to its send, every expected PUSH_EVENTS entry (the recipient's and the sender's echo)
is counted exactly once, nothing is lost, and nothing unexpected arrives. Latencies are
printed, never asserted. A second test runs every scenario once at toy size, so each
one's provisioning, measurement and report are exercised end to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from qim.bench.baseline import BaselineSpec
from qim.bench.loadgen import Router, SendStep, close_all, login_many, run_send_step, warm_up
from qim.bench.procstats import ProcSampler
from qim.bench.report import write_result
from qim.bench.scenarios.baseline import run_kafka_baseline
from qim.bench.scenarios.connections import ConnectionsParams, run_connections
from qim.bench.scenarios.fanout import FanoutParams, run_fanout
from qim.bench.scenarios.login import LoginParams, run_login
from qim.bench.scenarios.send import SendParams, run_send
from qim.bench.target import Target
from qim.client import ConnectionClosedError, QimError, RequestTimeout
from qim.devstack.stack import Stack
from tests.integration.login_support import WAIT_S, pipeline

pytestmark = pytest.mark.integration

PAIRS = 5
RATE = 30.0
DURATION_S = 4.0


async def gateway_accepts_logins(target: Target, tenant: str) -> None:
    """The gateway process owns its ConnectionShards once a login gets through."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while True:
        try:
            devices = await login_many(target, tenant, ["probe"], lambda *_: None)
        except (QimError, ConnectionClosedError, RequestTimeout, OSError):
            assert loop.time() < deadline, "the stack's gateway never accepted a login"
            await asyncio.sleep(1.0)
            continue
        await close_all(devices)
        return


@contextlib.asynccontextmanager
async def bench_target(
    stack: Stack, base: Path, tenant: str, *, admin: bool = False
) -> AsyncIterator[Target]:
    """The workers, the stack's gateway process (and admin endpoint): a Target on them."""
    gw = stack.cfg.gateways[0]
    async with pipeline(stack, base) as mailbox:
        await asyncio.to_thread(stack.start_gateway, gw)
        if admin:
            await asyncio.to_thread(stack.start_admin, stack.cfg.admins[0])
        try:
            target = Target.from_stack(stack.cfg)
            target = replace(
                target,
                mailbox_metrics_urls=(
                    f"http://127.0.0.1:{mailbox.worker.web_port}/mailbox/metrics",
                ),
                pid_files={**target.pid_files, "mailbox": mailbox.worker.pid_file},
            )
            await gateway_accepts_logins(target, tenant)
            yield target
        finally:
            if admin:
                await asyncio.to_thread(stack.stop_admin, stack.cfg.admins[0])
            await asyncio.to_thread(stack.stop_gateway, gw)


async def test_every_send_is_acked_and_pushed_exactly_once(stack: Stack, tmp_path: Path) -> None:
    gw = stack.cfg.gateways[0]
    tenant = "bench-acct"
    async with bench_target(stack, tmp_path, tenant) as target:
        senders = [f"s{i}" for i in range(PAIRS)]
        recipients = [f"r{i}" for i in range(PAIRS)]
        router = Router()
        devices = await login_many(target, tenant, senders + recipients, router.on_entry)
        try:
            pairs = list(zip(devices[:PAIRS], devices[PAIRS:], strict=True))
            await warm_up(pairs, router, "warm", within_s=WAIT_S)
            before = await target.mailbox_counters()
            sampler = ProcSampler(target.pids(), interval_s=0.5)
            step = SendStep("acct", RATE, DURATION_S, payload_bytes=120, drain_s=WAIT_S)
            ledger, timing = await run_send_step(step, pairs, router, sampler)
            # a later message in every pair's conversation pushed and echoed: each device
            # reads one to-gateway partition in log order, so a duplicate or stray push of
            # the step would have arrived before it (tests/integration/online_support.barrier)
            await warm_up(pairs, router, "fence", within_s=WAIT_S)
            after = await target.mailbox_counters()
        finally:
            await close_all(devices)

    summary = ledger.summary()
    ack, pushed = ledger.latencies()
    print(json.dumps({"timing": timing, "accounting": summary}, indent=1))
    print("SEND_ACK ms", ack.summary(), "PUSHED ms", pushed.summary())

    expected = int(RATE * DURATION_S)
    assert summary["sent"] == expected
    assert summary["errors"] == {} and summary["unmatched_acks"] == 0
    assert summary["acked"] == expected and summary["missing_ack"] == 0
    # every recipient entry and every echo arrived, each exactly once, and nothing else
    assert summary["pushed"] == expected and summary["lost"] == 0
    assert summary["echoed"] == expected and summary["echo_missing"] == 0
    assert summary["push_entries"] == expected and summary["echo_entries"] == expected
    assert summary["duplicate_pushes"] == 0 and summary["unexpected_entries"] == 0
    assert router.stray == 0
    assert timing["settled"] is True
    assert len(ack) == expected and len(pushed) == expected
    # the pipeline agrees: at least one mailbox entry per recipient and per echo was written
    written = "mailbox_entries_written_total"
    assert after[written] - before.get(written, 0.0) >= 2 * expected
    # the bench measured itself and the gateway process apart
    processes = sampler.report()
    assert {"bench", gw.name, "mailbox", "kafka"} <= set(processes)


async def test_every_scenario_runs_at_toy_size_and_writes_its_report(
    stack: Stack, tmp_path: Path
) -> None:
    tenant = "bench-toy"
    gw = stack.cfg.gateways[0]
    async with bench_target(stack, tmp_path, tenant, admin=True) as target:
        send = await run_send(
            target,
            SendParams(
                pairs=2,
                rates=(10.0,),
                duration_s=2.0,
                drain_s=WAIT_S,
                tenant=tenant,
                warm_step_s=1.0,
            ),
        )
        fanout = await run_fanout(
            target,
            FanoutParams(sizes=(10,), online_fraction=0.3, messages=3, senders=2, tenant=tenant),
        )
        login = await run_login(target, LoginParams(backlogs=(0, 12), repeats=2, tenant=tenant))
        conns = await run_connections(
            target, ConnectionsParams(counts=(4,), hold_s=1.0, tenant=tenant, gateway=gw.name)
        )
        baseline = await run_kafka_baseline(target, (BaselineSpec(count=300, rate=None),))

    (row,) = send.rows
    print(json.dumps({"send": {k: row[k] for k in ("send_ack_ms", "pushed_ms", "ratio")}}))
    assert row["accounting"]["sent"] == 20 and row["accounting"]["lost"] == 0
    assert row["accounting"]["errors"] == {} and row["baseline"]["received"] == 20
    assert set(row["ratio"]) == {"achieved_rate", "pushed_p50", "pushed_p99"}
    assert {"bench", gw.name, "kafka"} <= set(row["processes"])
    assert send.data["warm_step"]["accounting"]["sent"] == 10  # discarded, reported apart

    (fan,) = fanout.rows
    assert fan["online"] == 3 and fan["deliveries"]["expected_deliveries"] == 9
    assert fan["deliveries"]["missing"] == 0 and fan["errors"] == {}
    assert fan["entries_per_s"] is not None and fan["entries_per_s"] > 0  # scraped counters

    assert [(r["backlog"], r["entries"]) for r in login.rows] == [(0, 0), (12, 12)]
    assert login.rows[1]["bytes_received"] > login.rows[0]["bytes_received"]

    (conn,) = conns.rows
    assert conn["connections"] == 4 and conn["failed"] == 0

    (base,) = baseline.rows
    assert base["received"] == 300

    for result in (send, fanout, login, conns, baseline):
        json_path, md_path = write_result(tmp_path / "results", result)
        assert json.loads(json_path.read_text())["scenario"] == result.scenario
        assert md_path.read_text().startswith(f"# qim bench {result.scenario}")
