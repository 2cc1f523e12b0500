"""Scenario ``connections``: N idle authenticated connections with heartbeats on.

Reports the gateway's RSS before and after opening them and the difference per connection
(the spec's per-connection memory budget is what this checks), plus CPU of every process
while the connections sit idle and ping.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from qim.bench.loadgen import Pacer, new_client
from qim.bench.procstats import ProcSampler, read_sample
from qim.bench.report import Column, Result
from qim.bench.target import Target
from qim.client import QimClient

__all__ = ["ConnectionsParams", "run_connections"]

COLUMNS = [
    Column("connections", "connections"),
    Column("gateway RSS before (MB)", "gateway_rss_before_mb"),
    Column("gateway RSS after (MB)", "gateway_rss_after_mb"),
    Column("bytes / connection", "rss_per_connection_bytes"),
    Column("failed", "failed"),
    Column("gateway CPU % idle", "gateway_cpu_pct"),
]


@dataclass(frozen=True)
class ConnectionsParams:
    counts: tuple[int, ...] = (150,)  # per_ip_max_connections is 200 unless raised
    hold_s: float = 20.0
    tenant: str = "bench"
    connect_rate: float = 15.0
    gateway: str = "gw-1"


async def _one(target: Target, params: ConnectionsParams, count: int, run: str) -> dict[str, Any]:
    pid = target.pids().get(params.gateway)
    if pid is None:
        raise RuntimeError(f"no running gateway {params.gateway!r} in the target's pid files")
    first = read_sample(pid)
    pacer, clients, failed = Pacer(params.connect_rate), [], 0

    async def connect(i: int) -> QimClient:
        await pacer.wait()
        user = f"c{run}x{i}"
        client = new_client(heartbeat=True)
        await client.connect(target.ws_url, target.token(params.tenant, user, "idle"), "idle")
        return client

    outcomes = await asyncio.gather(*(connect(i) for i in range(count)), return_exceptions=True)
    clients = [c for c in outcomes if isinstance(c, QimClient)]
    failed = count - len(clients)
    try:
        sampler = ProcSampler(target.pids())
        async with sampler.running():
            await asyncio.sleep(params.hold_s)
        last = read_sample(pid)
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    before = first.rss_bytes if first else 0
    after = last.rss_bytes if last else 0
    report = sampler.report()
    return {
        "connections": len(clients),
        "failed": failed,
        "gateway_rss_before_mb": round(before / 2**20, 1),
        "gateway_rss_after_mb": round(after / 2**20, 1),
        "rss_per_connection_bytes": round((after - before) / len(clients)) if clients else None,
        "gateway_cpu_pct": report.get(params.gateway, {}).get("cpu_pct"),
        "processes": report,
    }


async def run_connections(target: Target, params: ConnectionsParams) -> Result:
    run = uuid.uuid4().hex[:6]
    rows = [await _one(target, params, n, run) for n in params.counts]
    return Result("connections", asdict(params), rows, COLUMNS, {})
