"""``qim chaos broker-restart``: restart Kafka N times under a steady SDK load, then prove that
every conversation partition serves and that no acknowledged message was lost (issue 15).

1. log the senders in; note the producers' replacement counters, their log lines so far and
   the gateway's RSS;
2. run the load (:func:`~qim.chaos.load.steady_load`) and, every ``between_s``, restart the
   broker (:class:`~qim.chaos.faults.BrokerRestart`, ``down_s`` down); keep the load running
   ``between_s`` after the last restart;
3. **probe**: one message to a one-to-one conversation on every conversation partition (the
   peers are chosen so that sender 0's conversations cover them all), each retried within
   ``probe_budget_s``; a partition serves when its SEND_ACK came back;
4. **delivery**: every acknowledged message, probes included, must be in its recipient's
   mailbox (a new device's full pull), read until it is or ``delivery_within_s`` passed;
5. the counters' and log lines' difference: how many producers each process replaced, and
   why (``qim_<process>_producer_replaced_total``), and the gateway's RSS after the senders
   closed.

``ok`` is every partition serving and 0 lost. The report is a dict (:func:`run_broker_restart`)
that the CLI writes as JSON and markdown under ``bench/results/``.
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from qim.bench.accounting import payload_for
from qim.bench.target import Target
from qim.chaos.faults import BrokerRestart, gateway_pid, rss_bytes
from qim.chaos.load import Accounting, Sender, check_delivery, steady_load
from qim.client import Identity
from qim.devstack.stack import Stack
from qim.schemas.records.requests import conversation_partition

__all__ = [
    "BrokerRestartParams",
    "peers_per_partition",
    "replacement_counters",
    "run_broker_restart",
]

REPLACED = re.compile(r"qim_[a-z]+_producer_replaced_total")
REPLACED_LOG_LINE = "Kafka producer unusable"


@dataclass(frozen=True)
class BrokerRestartParams:
    restarts: int = 3
    down_s: float = 12.0
    between_s: float = 15.0
    senders: int = 4
    lanes_per_sender: int = 2
    interval_s: float = 0.5
    probe_budget_s: float = 120.0
    delivery_within_s: float = 120.0
    tenant: str = "chaos"


def peers_per_partition(tenant: str, sender: str, partitions: int, prefix: str) -> list[str]:
    """``peers[p]``: a user whose one-to-one conversation with ``sender`` is on partition p."""
    found: dict[int, str] = {}
    me = Identity(tenant, sender)
    for i in range(partitions * 1000):
        peer = f"{prefix}{i}"
        p = conversation_partition(tenant, me.direct_conversation_id(peer), partitions)
        found.setdefault(p, peer)
        if len(found) == partitions:
            return [found[p] for p in range(partitions)]
    raise RuntimeError(f"no peers found for every one of {partitions} partitions")


def replacement_counters(urls: dict[str, str]) -> dict[str, float]:
    """``process producer reason -> count`` of every producer-replaced series on the pages."""
    out: dict[str, float] = {}
    for name, url in urls.items():
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                text = response.read().decode()
        except OSError:
            continue
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if REPLACED.fullmatch(sample.name):
                    labels = sample.labels
                    key = f"{name} {labels.get('producer', '?')} {labels.get('reason', '?')}"
                    out[key] = out.get(key, 0.0) + float(sample.value)
    return out


def _log_sizes(paths: dict[str, Path]) -> dict[str, int]:
    return {name: path.stat().st_size if path.exists() else 0 for name, path in paths.items()}


def _replacement_lines(paths: dict[str, Path], since: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, path in paths.items():
        try:
            with path.open("rb") as f:
                f.seek(since.get(name, 0))
                text = f.read().decode(errors="replace")
        except FileNotFoundError:
            continue
        out[name] = text.count(REPLACED_LOG_LINE)
    return out


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    keys = sorted(set(after) | set(before))
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in keys if after.get(k, 0.0)}


async def run_broker_restart(
    stack: Stack,
    params: BrokerRestartParams,
    *,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Steps 1-5 of the module docstring against ``stack``'s running processes."""
    cfg = stack.cfg
    target = Target.from_stack(cfg)
    partitions = cfg.partition_counts["conversation_partition_count"]
    tag = "br" + time.strftime("%H%M%S")
    users = [f"{tag}s{i}" for i in range(params.senders)]
    peers = peers_per_partition(params.tenant, users[0], partitions, f"{tag}r")
    metrics = {
        **{g.name: f"http://127.0.0.1:{g.metrics_port}/metrics" for g in cfg.gateways},
        **{w.name: f"http://127.0.0.1:{w.web_port}/metrics" for w in cfg.workers},
    }
    logs = {
        **{g.name: cfg.base_dir / "gateways" / g.name / "gateway.log" for g in cfg.gateways},
        **{w.name: cfg.base_dir / "workers" / w.name / "worker.log" for w in cfg.workers},
    }

    progress(f"logging in {len(users)} senders; {partitions} conversation partitions")
    senders = [Sender(target, params.tenant, u) for u in users]
    for sender in senders:
        await sender.connect()
    counters_before = replacement_counters(metrics)
    log_sizes = _log_sizes(logs)
    rss_before = rss_bytes(gateway_pid(stack))

    accounting = Accounting()
    stop = asyncio.Event()
    load = asyncio.create_task(
        steady_load(
            senders, peers, accounting, stop, tag=tag,
            lanes_per_sender=params.lanes_per_sender, interval_s=params.interval_s,
        )
    )  # fmt: skip
    faults: list[dict[str, Any]] = []
    try:
        for i in range(params.restarts):
            await asyncio.sleep(params.between_s)
            progress(f"restart {i + 1}/{params.restarts}: Kafka down for {params.down_s:g} s")
            faults.append(await BrokerRestart(params.down_s).run(stack))
            s = accounting.summary()
            progress(f"  Kafka is back; so far {s['acked']} acked of {s['sent']} sent")
        await asyncio.sleep(params.between_s)
    finally:
        stop.set()
        await load
    progress(f"load stopped: {accounting.summary()}")

    progress(f"probing every conversation partition (budget {params.probe_budget_s:g} s)")
    probe_started = time.monotonic()
    outcomes = await asyncio.gather(
        *(
            senders[0].send(
                peer, f"{tag}-probe-{p}", payload_for(f"{tag}-probe-{p}", 64), params.probe_budget_s
            )
            for p, peer in enumerate(peers)
        )
    )
    probes = []
    for p, (peer, outcome) in enumerate(zip(peers, outcomes, strict=True)):
        accounting.record(f"{tag}-probe-{p}", peer, outcome)
        probes.append(
            {
                "partition": p,
                "serving": outcome.acked,
                "attempts": outcome.attempts,
                "seconds": round(outcome.seconds, 2),
                "errors": dict(outcome.codes),
            }
        )
    serving = sum(1 for row in probes if row["serving"])
    progress(f"{serving}/{partitions} partitions acknowledged a message")
    reconnects = sum(s.reconnects for s in senders)
    for sender in senders:
        await sender.close()

    progress("checking every acked message in its recipient's mailbox")
    delivery = await check_delivery(
        target, params.tenant, accounting.expected(), within_s=params.delivery_within_s
    )
    progress(f"lost {delivery['lost']} of {delivery['acked_expected']} acked messages")

    replaced = _delta(replacement_counters(metrics), counters_before)
    lines = _replacement_lines(logs, log_sizes)
    rss_after = rss_bytes(gateway_pid(stack))
    ok = serving == partitions and delivery["lost"] == 0
    return {
        "scenario": "chaos-broker-restart",
        "ok": ok,
        "headline": (
            f"{params.restarts} broker restarts: {serving}/{partitions} partitions serving "
            f"afterwards, {delivery['lost']} of {delivery['acked_expected']} acked messages lost"
        ),
        "params": asdict(params),
        "faults": faults,
        "load": {**accounting.summary(), "reconnects": reconnects},
        "probe_seconds": round(time.monotonic() - probe_started, 2),
        "partitions": probes,
        "delivery": delivery,
        "producers_replaced": replaced,
        "replacement_log_lines": lines,
        "gateway_rss_bytes": {"before": rss_before, "after": rss_after},
    }
