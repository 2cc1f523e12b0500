"""The Grafana dashboard queries only metrics the inventory declares as exported.

Together with ``tests/integration/test_observability.py`` (a scrape of every process finds
every exported name), this proves each panel's metric exists on a running stack.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from qim.observability.names import INVENTORY, exported_names

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "qim-dashboard.json"

_PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "rate", "irate", "increase", "histogram_quantile",
    "by", "without", "on", "ignoring", "and", "or", "unless", "bool", "offset",
}  # fmt: skip
_SUFFIXES = ("_bucket", "_count", "_sum")


def metric_names(expr: str) -> set[str]:
    """The metric names of a PromQL expression (label matchers, groupings, ranges removed)."""
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)  # groupings
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        word = match.group(0)
        following = expr[match.end() :].lstrip()
        if word in _PROMQL_WORDS or following.startswith("("):
            continue
        for suffix in _SUFFIXES:
            if word.endswith(suffix) and word[: -len(suffix)] in exported_names():
                word = word[: -len(suffix)]
        names.add(word)
    return names


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", ()))
    return out


def test_the_dashboard_is_valid_json_with_queries() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    panels = _panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    queried = [p for p in panels if p["type"] in ("timeseries", "stat")]
    assert len(queried) >= 10
    for panel in queried:
        assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]


def test_every_metric_a_panel_queries_is_declared_as_exported() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    used: set[str] = set()
    for panel in _panels(dashboard):
        for target in panel.get("targets", ()):
            used |= metric_names(target["expr"])
    assert used, "no metric found in the panels"
    assert used - exported_names() == set()


def test_the_dashboard_shows_the_exported_always_zero_counters() -> None:
    """Every exported 24.1.5 counter has a panel (the P1 alerts of 24.0 start there)."""
    dashboard = json.loads(DASHBOARD.read_text())
    used: set[str] = set()
    for panel in _panels(dashboard):
        for target in panel.get("targets", ()):
            used |= metric_names(target["expr"])
    zero = {n for m in INVENTORY if m.section == "24.1.5" for n in m.exported}
    assert zero and zero <= used, zero - used
    assert {"send_to_ack_latency_seconds", "mailbox_seq_regression_count"} <= used


def test_the_name_parser_finds_names_and_skips_functions_and_labels() -> None:
    expr = 'histogram_quantile(0.99, sum by (le) (rate(x_seconds_bucket{kind="a"}[5m]))) / y'
    assert metric_names(expr) == {"x_seconds_bucket", "y"}
    assert metric_names("sum(rate(send_to_ack_latency_seconds_bucket[5m]))") == {
        "send_to_ack_latency_seconds"
    }
