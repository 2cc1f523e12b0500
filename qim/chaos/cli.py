"""``qim chaos ...``: faults under load against the local stack (``qim up``) or another stack
folder (``--run-dir``). Each command prints its progress, writes
``<out>/<scenario>-<UTC>.json`` and a ``.md`` beside it, and exits 1 when the run failed its
checks. Issue 25 adds more commands (process kills, pauses, a full disk) to this group."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from qim.bench.report import Column, markdown_table, stamp
from qim.chaos.broker_restart import BrokerRestartParams, run_broker_restart
from qim.chaos.fuzz import FuzzParams, run_fuzz
from qim.chaos.soak import SoakParams, run_soak
from qim.devstack.stack import ROOT, Stack, StackConfig

__all__ = ["chaos", "write_report"]

_PARTITION_COLUMNS = [
    Column("partition", "partition"),
    Column("serving", "serving"),
    Column("attempts", "attempts"),
    Column("seconds", "seconds"),
    Column("errors", "errors"),
]


def _fault_result(f: dict[str, Any]) -> str:
    if "error" in f:
        return f"FAILED: {f['error']}"
    if "filled_bytes" in f:
        how = "restarted" if f["restarted"] else "stayed up"
        return f"filled {f['filled_bytes'] // 2**20} MiB, held {f['held_s']:g} s, {how}"
    if "back_after_s" in f:
        return f"serving again after {f['back_after_s']} s"
    if "outage_s" in f:
        return f"outage {f['outage_s']} s"
    if "paused_s" in f:
        return f"paused {f['paused_s']:g} s"
    return "ok"


def _soak_lines(report: dict[str, Any]) -> list[str]:
    load, delivery, zero = report["load"], report["delivery"], report["always_zero"]
    rows = [
        {
            "at_s": f["at_s"],
            "fault": f["fault"],
            "process": f.get("process", "-"),
            "result": _fault_result(f),
        }
        for f in report["faults"]
    ]
    columns = [Column(c, c) for c in ("at_s", "fault", "process", "result")]
    return [
        "Faults:",
        "",
        markdown_table(columns, rows),
        f"Load: {load['sent']} sent, {load['acked']} acked, {load['not_acked']} not acked "
        f"within the retry budget, {load['attempts']} attempts, {load['reconnects']} "
        f"reconnects; retries by code: {load['retry_codes'] or '-'}; churn: {load['churn']}.",
        "",
        f"Delivery: {delivery['lost']} of {delivery['acked_expected']} acked entries missing "
        f"from their recipients' mailboxes, {delivery['duplicate_entries']} duplicate entries.",
        "",
        f"`qim audit dispatch`: exit {report['audit']['exit']} ({report['audit']['tail']}).",
        "",
        f"`qim replay projections --all`: exit {report['projections']['exit']}.",
        "",
        f"`qim replay history --all`: exit {report.get('history', {}).get('exit', '-')}.",
        "",
        f"Always-zero counters: {zero['counters_checked']} checked, non-zero {zero['nonzero']}, "
        f"pages not answering {zero['unanswered_pages']}, not exported {zero['not_exported']}.",
        "",
        f"Needed a manual repair: {report['needed_repair'] or 'none'}.",
        "",
    ]


def _finish(out: Path, report: dict[str, Any]) -> None:
    """Every command's end: write the report, print it, exit 1 unless it is ok."""
    json_path, md_path = write_report(out, report)
    click.echo(md_path.read_text())
    click.echo(f"wrote {json_path} and {md_path}")
    sys.exit(0 if report["ok"] else 1)


def write_report(out_dir: Path, report: dict[str, Any]) -> tuple[Path, Path]:
    """The report as JSON (everything) and markdown (headline, then the scenario's tables)."""
    when = stamp()
    out_dir.mkdir(parents=True, exist_ok=True)
    base = out_dir / f"{report['scenario']}-{when}"
    json_path, md_path = base.with_suffix(".json"), base.with_suffix(".md")
    json_path.write_text(json.dumps({"utc": when, **report}, indent=2) + "\n")
    lines = [f"# qim chaos {report['scenario']} ({when})", "", f"**{report['headline']}**", ""]
    if report["scenario"] == "chaos-fuzz":
        lines += [
            f"Frames by kind: {report['frames_by_kind']}.", "",
            f"Replies by opcode: {report['replies_by_opcode']}.", "",
            f"Closes by WebSocket code: {report['closes_by_code']}.", "",
            f"Frames written behind a closing kind on the same connection (never read: the "
            f"gateway closes there): {report.get('frames_after_a_closing_kind', '-')}.", "",
            f"Observer: {report['observer']}.", "",
            f"Gateway RSS (bytes): {report['gateway_rss_bytes']}.", "",
        ]  # fmt: skip
        md_path.write_text("\n".join(lines))
        return json_path, md_path
    if "partitions" not in report:
        md_path.write_text("\n".join(lines + _soak_lines(report)))
        return json_path, md_path
    lines += ["Every conversation partition after the last restart:", ""]
    lines += [markdown_table(_PARTITION_COLUMNS, report["partitions"])]
    delivery, load = report["delivery"], report["load"]
    lines += [
        f"Load: {load['sent']} sent, {load['acked']} acked, {load['not_acked']} not acked "
        f"within the retry budget, {load['attempts']} attempts, {load['reconnects']} "
        f"reconnects; retries by code: {load['retry_codes'] or '-'}.",
        "",
        f"Delivery: {delivery['lost']} of {delivery['acked_expected']} acked messages missing "
        f"from their recipient's mailbox, {delivery['duplicate_entries']} duplicate entries.",
        "",
        f"Producers replaced: {report['producers_replaced'] or 'none'} "
        f"(log lines: {report['replacement_log_lines']}).",
        "",
        f"Faults: {report['faults']}.",
        "",
        f"Gateway RSS (bytes): {report['gateway_rss_bytes']}.",
        "",
    ]
    md_path.write_text("\n".join(lines))
    return json_path, md_path


@click.group("chaos")
@click.option(
    "--run-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=ROOT / ".run",
    show_default=True,
    help="The stack folder (`qim up` uses .run).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=ROOT / "bench" / "results",
    show_default=True,
)
@click.pass_context
def chaos(ctx: click.Context, run_dir: Path, out: Path) -> None:
    """Inject faults into the running local stack under a steady SDK load."""
    ctx.obj = (Stack(StackConfig(base_dir=run_dir)), out)


@chaos.command("broker-restart")
@click.option("--restarts", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--down", "down_s", type=float, default=12.0, show_default=True, help="seconds")
@click.option(
    "--between", "between_s", type=float, default=15.0, show_default=True,
    help="seconds of load before, between and after the restarts",
)  # fmt: skip
@click.option("--senders", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--lanes", type=click.IntRange(min=1), default=2, show_default=True)
@click.option(
    "--interval", "interval_s", type=float, default=0.5, show_default=True,
    help="seconds between a lane's messages",
)  # fmt: skip
@click.option("--probe-budget", "probe_budget_s", type=float, default=120.0, show_default=True)
@click.pass_obj
def broker_restart(
    obj: tuple[Stack, Path],
    restarts: int,
    down_s: float,
    between_s: float,
    senders: int,
    lanes: int,
    interval_s: float,
    probe_budget_s: float,
) -> None:
    """Restart Kafka N times under load, then send to every conversation partition."""
    stack, out = obj
    params = BrokerRestartParams(
        restarts=restarts,
        down_s=down_s,
        between_s=between_s,
        senders=senders,
        lanes_per_sender=lanes,
        interval_s=interval_s,
        probe_budget_s=probe_budget_s,
    )
    report = asyncio.run(run_broker_restart(stack, params, progress=click.echo))
    _finish(out, report)


@contextmanager
def private_stack(
    keep: bool = False, disk_limited: tuple[str, ...] = (), disk_mb: int = 512
) -> Iterator[Stack]:
    """Kafka, Redis, every worker and a gateway on free loopback ports under a temporary
    folder, stopped (by pid) and removed afterwards: a run that cannot touch ``qim up``'s.
    Each worker of ``disk_limited`` gets a ``disk_mb`` tmpfs as its data dir (root only), so
    a DiskFull fault fills that and nothing else."""
    base = Path(tempfile.mkdtemp(prefix="qim-chaos-"))
    st = Stack(StackConfig(admins=()).for_tests(base))
    mounted: list[Path] = []
    try:
        for name in disk_limited:
            data = base / "workers" / name / "data"
            data.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={disk_mb}m", "tmpfs", str(data)],
                check=True, capture_output=True,
            )  # fmt: skip
            mounted.append(data)
        st.record_partitions()
        st.start_services()
        for worker in st.cfg.workers:
            st.start_worker(worker, timeout_s=180)
        for gateway in st.cfg.gateways:
            st.start_gateway(gateway)
        yield st
    finally:
        st.down()
        for data in mounted:
            subprocess.run(["umount", str(data)], check=False, capture_output=True)
        if not keep:
            shutil.rmtree(base, ignore_errors=True)


@chaos.command("run")
@click.option(
    "--duration",
    "duration_s",
    type=float,
    default=150.0,
    show_default=True,
    help="seconds of load (e.g. 3600 for the hour-long soak)",
)
@click.option("--fault-every", "fault_every_s", type=float, default=20.0, show_default=True)
@click.option("--seed", type=int, default=1, show_default=True, help="the fault plan's seed")
@click.option("--broker-restarts", type=click.IntRange(min=0), default=1, show_default=True)
@click.option("--redis-restarts", type=click.IntRange(min=0), default=0, show_default=True)
@click.option(
    "--pauses",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="SIGSTOPs of a worker past its lease",
)
@click.option("--senders", type=click.IntRange(min=1), default=4, show_default=True)
@click.option(
    "--group-size",
    "group_sizes",
    type=click.IntRange(min=2),
    multiple=True,
    default=(10,),
    show_default=True,
    help="one group of this size (repeatable)",
)
@click.option(
    "--disk-fulls",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="fills of --disk-full's data disk to ENOSPC (needs --private and root)",
)
@click.option(
    "--disk-full",
    "disk_full",
    default="mailbox-1",
    show_default=True,
    help="the worker whose data dir becomes a small tmpfs for --disk-fulls",
)
@click.option(
    "--private",
    is_flag=True,
    help="run on a private stack on free ports (started and removed here) instead "
    "of the --run-dir one",
)
@click.option("--keep", is_flag=True, help="with --private: keep its folder for a post-mortem")
@click.pass_obj
def run(
    obj: tuple[Stack, Path],
    duration_s: float,
    fault_every_s: float,
    seed: int,
    broker_restarts: int,
    redis_restarts: int,
    pauses: int,
    senders: int,
    group_sizes: tuple[int, ...],
    disk_fulls: int,
    disk_full: str,
    private: bool,
    keep: bool,
) -> None:
    """Mixed load while processes are killed and paused and Kafka / Redis restart; then
    delivery, audit, projections and always-zero checks (exit 1 when one fails)."""
    stack, out = obj
    params = SoakParams(
        duration_s=duration_s, fault_every_s=fault_every_s, seed=seed,
        broker_restarts=broker_restarts, redis_restarts=redis_restarts, pauses=pauses,
        senders=senders, group_sizes=tuple(group_sizes), disk_fulls=disk_fulls,
    )  # fmt: skip
    if disk_fulls and not private:
        raise click.UsageError("--disk-fulls needs --private (it mounts a tmpfs data dir)")
    if private:
        click.echo("starting a private stack")
        limited = (disk_full,) if disk_fulls else ()
        with private_stack(keep, disk_limited=limited) as own:
            report = asyncio.run(
                run_soak(own, params, disk_limited=list(limited), progress=click.echo)
            )
    else:
        report = asyncio.run(run_soak(stack, params, progress=click.echo))
    _finish(out, report)


@chaos.command("fuzz")
@click.option("--frames", type=click.IntRange(min=1), default=1_000_000, show_default=True)
@click.option("--connections", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--private", is_flag=True, help="run on a private stack on free ports")
@click.pass_obj
def fuzz(obj: tuple[Stack, Path], frames: int, connections: int, seed: int, private: bool) -> None:
    """Frames from an independent generator into the gateway while a well-behaved client
    must keep being served; exit 1 if the gateway died, leaked or left the client unserved."""
    stack, out = obj
    params = FuzzParams(frames=frames, connections=connections, seed=seed)
    if private:
        click.echo("starting a private stack")
        with private_stack() as own:
            report = asyncio.run(run_fuzz(own, params, progress=click.echo))
    else:
        report = asyncio.run(run_fuzz(stack, params, progress=click.echo))
    _finish(out, report)
