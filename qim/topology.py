"""Render the generated blocks of `topology.md` from the code, and check they are current.

The topic table comes from `qim.streams`, the app table from each Faust app's registered agents
and tables, the process table from the local stack's declaration. Prose around the markers is
hand-written; only the text between `<!-- generated:NAME:begin -->` and `:end -->` is replaced.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path

from qim.apps import APP_MODULES
from qim.devstack.stack import StackConfig
from qim.streams import ALL_TOPICS

TOPOLOGY_MD = Path(__file__).resolve().parents[1] / "topology.md"


def _topics() -> str:
    counts = StackConfig().partition_counts
    rows = [
        "| topic | partitions (local) | partitioned by | key | cleanup | retention | "
        "producer | consumer |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in ALL_TOPICS:
        retention = "-" if t.retention_ms is None else _span(t.retention_ms)
        rows.append(
            f"| `{t.name}` | `{t.partitions_param}` = {t.partitions(counts)} | {t.partitioned_by} "
            f"| {t.key} | {t.cleanup} | {retention} | {t.producer} | {t.consumer} |"
        )
    return "\n".join(rows)


def _span(ms: int) -> str:
    return f"{ms // 3_600_000} h" if ms % 3_600_000 == 0 else f"{ms // 60_000} min"


def _apps() -> str:
    rows = ["| app module | app id | agents | tables |", "|---|---|---|---|"]
    for module in APP_MODULES:
        app = importlib.import_module(module).app
        agents = ", ".join(f"`{name.rsplit('.', 1)[-1]}`" for name in sorted(app.agents)) or "-"
        tables = ", ".join(f"`{name}`" for name in sorted(app.tables)) or "-"
        rows.append(f"| `{module}` | `{app.conf.id}` | {agents} | {tables} |")
    return "\n".join(rows)


def _processes() -> str:
    cfg = StackConfig()
    rows = [
        "| process | command | listens on (loopback) |",
        "|---|---|---|",
        f"| Redis 7 | `redis-server` (AOF, everysec) | {cfg.redis_port} |",
        f"| Kafka {_kafka_version()} KRaft | `java ... kafka.Kafka server.properties` "
        f"| {cfg.kafka_port}, controller {cfg.controller_port} |",
    ]
    for w in cfg.workers:
        rows.append(
            f"| worker `{w.name}` | `faust -A {w.module} worker` "
            f"| {w.web_port} (`/healthz`, `/metrics`) |"
        )
    for g in cfg.gateways:
        rows.append(
            f"| ConnectionNode `{g.name}` | `qim gateway` | {g.ws_port} (ws), "
            f"{g.metrics_port} (`/metrics`) |"
        )
    for a in cfg.admins:
        rows.append(f"| group admin `{a.name}` | `qim admin serve` | {a.port} (HTTP) |")
    return "\n".join(rows)


def _kafka_version() -> str:
    from qim.devstack.kafka import KAFKA_VERSION

    return KAFKA_VERSION


BLOCKS: dict[str, Callable[[], str]] = {
    "topics": _topics,
    "apps": _apps,
    "processes": _processes,
}


def render(text: str) -> str:
    """`text` with every generated block replaced by its current rendering."""
    for name, fn in BLOCKS.items():
        pattern = re.compile(
            rf"(<!-- generated:{name}:begin -->).*?(<!-- generated:{name}:end -->)", re.S
        )
        if not pattern.search(text):
            raise ValueError(f"topology.md lacks the generated block {name!r}")
        body = fn()

        def fill(m: re.Match[str], body: str = body) -> str:
            return f"{m.group(1)}\n{body}\n{m.group(2)}"

        text = pattern.sub(fill, text)
    return text


def check(path: Path = TOPOLOGY_MD) -> bool:
    text = path.read_text()
    return render(text) == text


def write(path: Path = TOPOLOGY_MD) -> None:
    path.write_text(render(path.read_text()))
