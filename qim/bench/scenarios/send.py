"""Scenario ``send``: one-to-one traffic from N pairs at a swept aggregate rate.

Per rate: achieved rate, SEND_ACK p50/p99/p99.9 and PUSHED p50/p99 (sender's intended send
time -> the recipient's PUSH_EVENTS), errors by code, the accounting, CPU/RSS of every process,
and the Kafka baseline at the same rate and count with the ratios qim/baseline. Headline: the
highest rate with SEND_ACK p99 <= 150 ms and PUSHED p99 <= 300 ms.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from typing import Any

from qim.bench.baseline import BaselineSpec, run_baseline
from qim.bench.loadgen import Router, SendStep, close_all, login_many, run_send_step, warm_up
from qim.bench.procstats import ProcSampler
from qim.bench.report import Column, Result
from qim.bench.target import Target

__all__ = ["SLO_ACK_P99_MS", "SLO_PUSHED_P99_MS", "SendParams", "ratios", "run_send"]

SLO_ACK_P99_MS = 150.0
SLO_PUSHED_P99_MS = 300.0

COLUMNS = [
    Column("target msg/s", "target_rate"),
    Column("achieved msg/s", "achieved_rate"),
    Column("SEND_ACK p50", "send_ack_ms.p50"),
    Column("SEND_ACK p99", "send_ack_ms.p99"),
    Column("SEND_ACK p99.9", "send_ack_ms.p99.9"),
    Column("PUSHED p50", "pushed_ms.p50"),
    Column("PUSHED p99", "pushed_ms.p99"),
    Column("errors", "accounting.errors"),
    Column("lost", "accounting.lost"),
    Column("SLO", "meets_slo"),
    Column("Kafka p99", "baseline.latency_ms.p99"),
    Column("PUSHED p99 / Kafka", "ratio.pushed_p99"),
    Column("rate / Kafka", "ratio.achieved_rate"),
]


@dataclass(frozen=True)
class SendParams:
    pairs: int = 20
    rates: tuple[float, ...] = (20.0, 50.0, 100.0)
    duration_s: float = 10.0
    payload_bytes: int = 200
    drain_s: float = 30.0
    tenant: str = "bench"
    baseline: bool = True
    connect_rate: float = 15.0
    warm_step_s: float = 5.0  # a discarded step at the first rate: caches, JIT, batching warm


def ratios(row: dict[str, Any], base: dict[str, Any]) -> dict[str, float | None]:
    """qim / Kafka baseline for throughput and the PUSHED latency percentiles."""

    def div(a: Any, b: Any) -> float | None:
        if isinstance(a, int | float) and isinstance(b, int | float) and b:
            return round(a / b, 2)
        return None

    lat = base.get("latency_ms", {})
    return {
        "achieved_rate": div(row.get("achieved_rate"), base.get("achieved_rate")),
        "pushed_p50": div(row["pushed_ms"].get("p50"), lat.get("p50")),
        "pushed_p99": div(row["pushed_ms"].get("p99"), lat.get("p99")),
    }


def meets_slo(row: dict[str, Any]) -> bool:
    ack, pushed = row["send_ack_ms"].get("p99"), row["pushed_ms"].get("p99")
    acc = row["accounting"]
    return (
        ack is not None
        and pushed is not None
        and ack <= SLO_ACK_P99_MS
        and pushed <= SLO_PUSHED_P99_MS
        and not acc["errors"]
        and acc["lost"] == 0
    )


async def run_send(target: Target, params: SendParams) -> Result:
    run = uuid.uuid4().hex[:6]
    senders = [f"s{run}x{i}" for i in range(params.pairs)]
    recipients = [f"r{run}x{i}" for i in range(params.pairs)]
    router = Router()
    devices = await login_many(
        target,
        params.tenant,
        senders + recipients,
        router.on_entry,
        connect_rate=params.connect_rate,
    )
    rows: list[dict[str, Any]] = []
    try:
        pairs = list(zip(devices[: params.pairs], devices[params.pairs :], strict=True))
        rounds = await warm_up(pairs, router, f"w{run}")
        warm_step: dict[str, Any] = {}
        if params.warm_step_s > 0:
            first = SendStep(
                f"x{run}",
                params.rates[0],
                params.warm_step_s,
                payload_bytes=params.payload_bytes,
                drain_s=params.drain_s,
            )
            discarded, timing = await run_send_step(first, pairs, router)
            warm_step = {**timing, "accounting": discarded.summary()}
        for k, rate in enumerate(params.rates):
            step = SendStep(
                tag=f"m{run}{k}",
                rate=rate,
                duration_s=params.duration_s,
                payload_bytes=params.payload_bytes,
                drain_s=params.drain_s,
            )
            sampler = ProcSampler(target.pids())
            ledger, timing = await run_send_step(step, pairs, router, sampler)
            ack, pushed = ledger.latencies()
            row: dict[str, Any] = {
                "target_rate": rate,
                **timing,
                "send_ack_ms": ack.summary(),
                "pushed_ms": pushed.summary((50.0, 99.0)),
                "accounting": ledger.summary(),
                "processes": sampler.report(),
            }
            row["meets_slo"] = meets_slo(row)
            if params.baseline:
                spec = BaselineSpec(
                    count=max(1, len(ledger.messages)),
                    record_bytes=params.payload_bytes,
                    rate=rate,
                )
                row["baseline"] = await run_baseline(target.kafka_bootstrap, spec)
                row["ratio"] = ratios(row, row["baseline"])
            rows.append(row)
    finally:
        await close_all(devices)
    passing = [r["target_rate"] for r in rows if r["meets_slo"]]
    headline = (
        f"highest rate within SLO (SEND_ACK p99 <= {SLO_ACK_P99_MS:g} ms, PUSHED p99 <= "
        f"{SLO_PUSHED_P99_MS:g} ms): {max(passing):g} msg/s"
        if passing
        else "no swept rate met the SLO"
    )
    return Result(
        "send",
        asdict(params),
        rows,
        COLUMNS,
        {"warm_up_rounds": rounds, "warm_step": warm_step, "stray_entries": router.stray},
        headline,
    )
