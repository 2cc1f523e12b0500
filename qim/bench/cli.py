"""``qim bench quick|full|send|fanout|login|connections|rooms|presence|push|checkpoint`` and more.

Targets the local stack of ``qim up`` by default (``--run-dir`` for another stack folder,
``--url`` for another gateway). Each scenario writes ``<out>/<scenario>-<UTC>.json`` and a
``.md`` table. ``quick`` is a reduced run of every scenario (minutes); ``full`` the whole set.
Rate and connection limits are the server's: raise them for the bench tenant with
``QIM_TENANT_OVERRIDES`` / the ``QIM_PER_IP_*`` parameters when starting the stack
(bench/README.md).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from qim.bench.baseline import BaselineSpec
from qim.bench.report import Column, Result, write_result
from qim.bench.scenarios.baseline import run_kafka_baseline
from qim.bench.scenarios.checkpoint import CheckpointParams, run_checkpoint
from qim.bench.scenarios.connections import ConnectionsParams, run_connections
from qim.bench.scenarios.fanout import FanoutParams, run_fanout
from qim.bench.scenarios.login import LoginParams, run_login
from qim.bench.scenarios.presence import PresenceParams, run_presence
from qim.bench.scenarios.push import PushParams, run_push
from qim.bench.scenarios.reactions import ReactionsParams, run_reactions
from qim.bench.scenarios.rooms import RoomsParams, run_rooms
from qim.bench.scenarios.send import SendParams, run_send
from qim.bench.schedule import sweep
from qim.bench.speedscope import summarize
from qim.bench.target import Target
from qim.devstack.stack import ROOT, StackConfig
from qim.streams import runtime

__all__ = ["FULL", "QUICK", "Preset", "bench"]


@dataclass(frozen=True)
class Preset:
    send: SendParams
    fanout: FanoutParams
    login: LoginParams
    connections: ConnectionsParams
    baseline: tuple[BaselineSpec, ...]
    reactions: ReactionsParams
    presence: PresenceParams
    push: PushParams


QUICK = Preset(
    send=SendParams(pairs=10, rates=(20.0, 50.0, 100.0), duration_s=10.0, drain_s=20.0),
    fanout=FanoutParams(sizes=(500,), messages=10),  # 100 online: under per_ip_max_connections
    login=LoginParams(backlogs=(0, 1000), repeats=3),
    connections=ConnectionsParams(counts=(150,), hold_s=15.0),
    baseline=(BaselineSpec(count=5000, rate=None), BaselineSpec(count=1000, rate=100.0)),
    reactions=ReactionsParams(size=500, reactions=60),  # 100 online
    presence=PresenceParams(pairs=10, cycles=3),
    push=PushParams(devices=50, rates=(50.0, 200.0), duration_s=10.0),
)
FULL = Preset(
    send=SendParams(pairs=100, rates=tuple(sweep(50.0, 3200.0, 7)), duration_s=30.0),
    fanout=FanoutParams(sizes=(1000, 10_000), messages=30),
    login=LoginParams(backlogs=(0, 1000, 10_000), repeats=10),
    connections=ConnectionsParams(counts=(150, 1000), hold_s=60.0),
    baseline=(BaselineSpec(count=100_000, rate=None), BaselineSpec(count=30_000, rate=1000.0)),
    reactions=ReactionsParams(size=1000, reactions=200),  # 200 online, one REACT each
    presence=PresenceParams(pairs=50, cycles=10),
    push=PushParams(devices=1000, rates=tuple(sweep(100.0, 1600.0, 5)), duration_s=30.0),
)


@dataclass
class Ctx:
    target: Target
    out: Path


def _emit(ctx: Ctx, result: Result) -> None:
    json_path, md_path = write_result(ctx.out, result)
    click.echo(result.to_markdown(json_path.stem))
    click.echo(f"wrote {json_path} and {md_path}")


def _run(ctx: Ctx, job: Callable[[Target], Coroutine[Any, Any, Result]]) -> None:
    _emit(ctx, runtime.run(job(ctx.target)))


@click.group("bench")
@click.option(
    "--run-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="The stack folder of `qim up` (default .run): ports, keys, pid files.",
)
@click.option("--url", default=None, help="Gateway URL (default: the stack's first gateway).")
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=ROOT / "bench" / "results",
    show_default=True,
)
@click.pass_context
def bench(ctx: click.Context, run_dir: Path | None, url: str | None, out: Path) -> None:
    """Load-test a running stack (default: `qim up`) and write bench/results/*.json + .md."""
    cfg = StackConfig() if run_dir is None else StackConfig(base_dir=run_dir)
    ctx.obj = Ctx(Target.from_stack(cfg, url), out)


def _preset(ctx: Ctx, preset: Preset) -> None:
    _run(ctx, lambda t: run_kafka_baseline(t, preset.baseline))
    _run(ctx, lambda t: run_send(t, preset.send))
    _run(ctx, lambda t: run_fanout(t, preset.fanout))
    _run(ctx, lambda t: run_reactions(t, preset.reactions))
    _run(ctx, lambda t: run_presence(t, preset.presence))
    _run(ctx, lambda t: run_push(t, preset.push))
    _run(ctx, lambda t: run_login(t, preset.login))
    _run(ctx, lambda t: run_connections(t, preset.connections))


@bench.command()
@click.pass_obj
def quick(ctx: Ctx) -> None:
    """A reduced run of every scenario (under 10 minutes on an idle 2-core machine)."""
    _preset(ctx, QUICK)


@bench.command()
@click.pass_obj
def full(ctx: Ctx) -> None:
    """Every scenario at full size (long: tens of minutes)."""
    _preset(ctx, FULL)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


@bench.command()
@click.option("--pairs", type=click.IntRange(min=1), default=QUICK.send.pairs, show_default=True)
@click.option("--rates", default="20,50,100", show_default=True, help="msg/s, comma-separated.")
@click.option("--duration", type=float, default=QUICK.send.duration_s, show_default=True)
@click.option("--payload-bytes", type=click.IntRange(min=16), default=200, show_default=True)
@click.option("--tenant", default="bench", show_default=True)
@click.option("--baseline/--no-baseline", default=True, show_default=True)
@click.pass_obj
def send(
    ctx: Ctx,
    pairs: int,
    rates: str,
    duration: float,
    payload_bytes: int,
    tenant: str,
    baseline: bool,
) -> None:
    """One-to-one traffic from N pairs at each rate (open loop), with the Kafka baseline."""
    params = SendParams(
        pairs=pairs,
        rates=_floats(rates),
        duration_s=duration,
        payload_bytes=payload_bytes,
        tenant=tenant,
        baseline=baseline,
    )
    _run(ctx, lambda t: run_send(t, params))


@bench.command()
@click.option("--sizes", default="1000", show_default=True, help="Group sizes, comma-separated.")
@click.option("--online", type=float, default=0.2, show_default=True)
@click.option("--messages", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--rate", type=float, default=2.0, show_default=True)
@click.option("--tenant", default="bench", show_default=True)
@click.pass_obj
def fanout(ctx: Ctx, sizes: str, online: float, messages: int, rate: float, tenant: str) -> None:
    """Group messages to big groups with a fraction of the members online."""
    params = FanoutParams(
        sizes=_ints(sizes), online_fraction=online, messages=messages, rate=rate, tenant=tenant
    )
    _run(ctx, lambda t: run_fanout(t, params))


@bench.command()
@click.option("--size", type=click.IntRange(min=2), default=1000, show_default=True)
@click.option("--online", type=float, default=0.2, show_default=True)
@click.option("--reactions", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--rate", type=float, default=50.0, show_default=True, help="REACT/s.")
@click.option(
    "--window-ms",
    type=click.IntRange(min=1),
    default=2000,
    show_default=True,
    help="The stack's reaction_push_merge_window (the bound the report checks).",
)
@click.option("--tenant", default="bench", show_default=True)
@click.pass_obj
def reactions(
    ctx: Ctx, size: int, online: float, reactions: int, rate: float, window_ms: int, tenant: str
) -> None:
    """A burst of REACTs on one message of a big group: merged frames, no mailbox entries."""
    params = ReactionsParams(
        size=size,
        online_fraction=online,
        reactions=reactions,
        rate=rate,
        window_ms=window_ms,
        tenant=tenant,
    )
    _run(ctx, lambda t: run_reactions(t, params))


@bench.command()
@click.option("--pairs", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--cycles", type=click.IntRange(min=1), default=5, show_default=True)
@click.option(
    "--gap",
    type=float,
    default=2.5,
    show_default=True,
    help="Seconds between a pair's changes; keep it above presence_sub_merge_window (2 s).",
)
@click.option(
    "--target-ms",
    type=float,
    default=1000.0,
    show_default=True,
    help="presence_propagation_target (P99).",
)
@click.option("--tenant", default="bench", show_default=True)
@click.pass_obj
def presence(ctx: Ctx, pairs: int, cycles: int, gap: float, target_ms: float, tenant: str) -> None:
    """Login / logout of a watched user -> the watcher's PRESENCE_SUB: p99 against the target."""
    params = PresenceParams(
        pairs=pairs, cycles=cycles, gap_s=gap, target_ms=target_ms, tenant=tenant
    )
    _run(ctx, lambda t: run_presence(t, params))


@bench.command()
@click.option("--backlogs", default="0,1000", show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--tenant", default="bench", show_default=True)
@click.pass_obj
def login(ctx: Ctx, backlogs: str, repeats: int, tenant: str) -> None:
    """AUTH -> ONLINE_READY of a new device against a backlog of N entries."""
    params = LoginParams(backlogs=_ints(backlogs), repeats=repeats, tenant=tenant)
    _run(ctx, lambda t: run_login(t, params))


@bench.command()
@click.option("--counts", default="150", show_default=True)
@click.option("--hold", type=float, default=15.0, show_default=True)
@click.option("--tenant", default="bench", show_default=True)
@click.option("--gateway", default="gw-1", show_default=True, help="Which gateway's RSS.")
@click.pass_obj
def connections(ctx: Ctx, counts: str, hold: float, tenant: str, gateway: str) -> None:
    """N idle authenticated connections with heartbeats: gateway RSS per connection."""
    params = ConnectionsParams(counts=_ints(counts), hold_s=hold, tenant=tenant, gateway=gateway)
    _run(ctx, lambda t: run_connections(t, params))


@bench.command()
@click.option("--connections", "count", type=click.IntRange(min=1), default=2000, show_default=True)
@click.option("--rate", type=float, default=20.0, show_default=True, help="Room msg/s.")
@click.option("--duration", type=float, default=20.0, show_default=True)
@click.option("--connect-rate", type=float, default=15.0, show_default=True)
@click.option("--tenant", default="bench", show_default=True)
@click.option("--gateway", default="gw-1", show_default=True, help="Whose CPU is reported.")
@click.pass_obj
def rooms(
    ctx: Ctx, count: int, rate: float, duration: float, connect_rate: float, tenant: str,
    gateway: str,
) -> None:  # fmt: skip
    """N connections in one chatroom at RATE msg/s: delivery p99, frames/s/connection, CPU."""
    params = RoomsParams(count, rate, duration, tenant, connect_rate, gateway)
    _run(ctx, lambda t: run_rooms(t, params))


@bench.command()
@click.option("--devices", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--rates", default="50,200", show_default=True, help="PushTasks/s, comma-separated.")
@click.option("--duration", type=float, default=10.0, show_default=True)
@click.option("--drain", type=float, default=60.0, show_default=True, help="Wait for receipts.")
@click.option("--tenant", default="bench", show_default=True)
@click.pass_obj
def push(ctx: Ctx, devices: int, rates: str, duration: float, drain: float, tenant: str) -> None:
    """PushTasks through the NotificationService to the APNs stand-in: PushTasks/s and the
    wake-up latency from commit to the stand-in's receipt (issue 17)."""
    params = PushParams(
        devices=devices, rates=_floats(rates), duration_s=duration, drain_s=drain, tenant=tenant
    )
    _run(ctx, lambda t: run_push(t, params))


@bench.command("kafka-baseline")
@click.option("--count", type=click.IntRange(min=1), default=5000, show_default=True)
@click.option("--record-bytes", type=click.IntRange(min=8), default=200, show_default=True)
@click.option("--rate", type=float, default=None, help="Open-loop rate (default: flat out).")
@click.option("--topics", type=click.IntRange(min=2), default=4, show_default=True)
@click.pass_obj
def kafka_baseline(
    ctx: Ctx, count: int, record_bytes: int, rate: float | None, topics: int
) -> None:
    """The send path's Kafka hops on plain aiokafka relays: the floor qim is compared with."""
    spec = BaselineSpec(count=count, record_bytes=record_bytes, rate=rate, topics=topics)
    _run(ctx, lambda t: run_kafka_baseline(t, (spec,)))


@bench.command("profile")
@click.argument(
    "files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option("--top", type=click.IntRange(min=1), default=15, show_default=True)
def profile(files: tuple[Path, ...], top: int) -> None:
    """Summarize py-spy speedscope profiles (``py-spy record -f speedscope -p PID``): the
    frames with the most self time and qim's frames with the most inclusive time."""
    for path in files:
        click.echo(f"== {path}")
        for line in summarize(path, top).lines():
            click.echo(line)


@bench.command("checkpoint")
@click.option("--entries", type=click.IntRange(min=1), default=1_000_000, show_default=True)
@click.option("--members", type=click.IntRange(min=1), default=5000, show_default=True)
@click.option("--tail", type=click.IntRange(min=0), default=20, show_default=True,
              help="Dispatches replayed after the restore.")  # fmt: skip
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True)
@click.pass_obj
def checkpoint(ctx: Ctx, entries: int, members: int, tail: int, repeats: int) -> None:
    """A MailboxShard of ENTRIES entries: checkpoint, ship, restore on an empty path, replay a
    tail (no stack needed): the takeover RTO of 26.6.3 on this machine."""
    params = CheckpointParams(entries=entries, members=members, tail=tail)
    runs = [run_checkpoint(params) for _ in range(repeats)]
    columns = [
        Column(h, p)
        for h, p in (
            ("entries", "entries"), ("store MiB", "store_mib"), ("build s", "build_s"),
            ("fold entries/s", "replay_rate"), ("checkpoint s", "checkpoint_s"),
            ("checkpoint MiB", "checkpoint_mib"), ("restore s", "restore_s"),
            ("tail entries", "tail_entries"), ("tail s", "tail_s"),
            ("takeover s", "takeover_s"), ("target s", "rto_target_s"),
            ("within", "within_target"),
        )
    ]  # fmt: skip
    rows = [r["row"] for r in runs]
    worst = max(r["takeover_s"] for r in rows)
    result = Result(
        scenario="checkpoint",
        params=runs[0]["params"] | {"repeats": repeats},
        rows=rows,
        columns=columns,
        data={},
        headline=f"takeover on an empty disk: {worst} s (restore + tail), {entries} entries",
    )
    _emit(ctx, result)
