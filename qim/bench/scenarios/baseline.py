"""Scenario ``kafka-baseline`` on its own: the send path's hops on plain aiokafka."""

from __future__ import annotations

from dataclasses import asdict

from qim.bench.baseline import BaselineSpec, run_baseline
from qim.bench.procstats import ProcSampler
from qim.bench.report import Column, Result
from qim.bench.target import Target

__all__ = ["run_kafka_baseline"]

COLUMNS = [
    Column("records", "count"),
    Column("received", "received"),
    Column("bytes", "record_bytes"),
    Column("topics", "topics"),
    Column("target rate", "target_rate"),
    Column("achieved/s", "achieved_rate"),
    Column("p50 (ms)", "latency_ms.p50"),
    Column("p99 (ms)", "latency_ms.p99"),
    Column("p99.9 (ms)", "latency_ms.p99.9"),
]


async def run_kafka_baseline(target: Target, specs: tuple[BaselineSpec, ...]) -> Result:
    rows = []
    for spec in specs:
        sampler = ProcSampler(target.pids())
        async with sampler.running():
            row = await run_baseline(target.kafka_bootstrap, spec)
        rows.append(row | {"processes": sampler.report()})
    params = {"specs": [asdict(s) for s in specs]}
    return Result("kafka-baseline", params, rows, COLUMNS, {})
