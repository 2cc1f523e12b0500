"""Results on disk: ``<out>/<scenario>-<UTC timestamp>.json`` and a ``.md`` table beside it.

The JSON holds everything (parameters, per-step accounting, latency summaries, per-process
CPU/RSS); the markdown is the table a README or an issue can quote. Pure formatting here.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["Column", "Result", "cell", "lookup", "markdown_table", "stamp", "write_result"]


@dataclass(frozen=True)
class Column:
    """A table column: ``path`` is a dotted path into a row (``send_ack_ms.p99``)."""

    header: str
    path: str


def lookup(row: Mapping[str, Any], path: str) -> Any:
    """The value at ``path``; keys may hold dots themselves (``p99.9``): longest key first."""
    if path in row:
        return row[path]
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:cut])
        if head in row and isinstance(row[head], Mapping):
            return lookup(row[head], ".".join(parts[cut:]))
    return None


def cell(value: Any) -> str:
    """``-`` for missing; floats without noise; dicts as ``k=v`` lists (errors by code)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value != int(value) else f"{value:.0f}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={cell(v)}" for k, v in value.items()) or "-"
    return str(value).replace("|", "\\|")


def markdown_table(columns: Sequence[Column], rows: Sequence[Mapping[str, Any]]) -> str:
    head = "| " + " | ".join(c.header for c in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(cell(lookup(r, c.path)) for c in columns) + " |" for r in rows]
    return "\n".join([head, rule, *body]) + "\n"


def stamp(now: datetime | None = None) -> str:
    """UTC timestamp for file names: ``20261129T101500Z``."""
    return (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")


@dataclass
class Result:
    """One scenario's output: ``rows`` feed the table, ``data`` is everything else."""

    scenario: str
    params: dict[str, Any]
    rows: list[dict[str, Any]]
    columns: list[Column]
    data: dict[str, Any]
    headline: str = ""

    def to_json(self, when: str) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "utc": when,
            "host": {"machine": platform.machine(), "python": platform.python_version()},
            "params": self.params,
            "headline": self.headline,
            "rows": self.rows,
            **self.data,
        }

    def to_markdown(self, when: str) -> str:
        lines = [f"# qim bench {self.scenario} ({when})", ""]
        if self.headline:
            lines += [f"**{self.headline}**", ""]
        lines += [markdown_table(self.columns, self.rows)]
        params = ", ".join(f"{k}={cell(v)}" for k, v in sorted(self.params.items()))
        lines += [f"Parameters: {params}", ""]
        return "\n".join(lines)


def write_result(out_dir: Path, result: Result, now: datetime | None = None) -> tuple[Path, Path]:
    when = stamp(now)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = out_dir / f"{result.scenario}-{when}"
    json_path, md_path = base.with_suffix(".json"), base.with_suffix(".md")
    json_path.write_text(json.dumps(result.to_json(when), indent=2, sort_keys=False) + "\n")
    md_path.write_text(result.to_markdown(when))
    return json_path, md_path
