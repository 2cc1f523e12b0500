"""`qim bench presence` runs at toy size on the real stack and writes its report (issue 16).

The stack's own gateway process, the real workers; two watcher/subject pairs, two login /
logout cycles each: every change is seen (none missed) and the report has its three rows.
Latencies are printed, never asserted (speed is the bench's business, not the suite's).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qim.bench.report import write_result
from qim.bench.scenarios.presence import PresenceParams, run_presence
from qim.devstack.stack import Stack
from tests.integration.test_bench_accounting import bench_target

pytestmark = pytest.mark.integration


async def test_the_presence_scenario_sees_every_change_and_writes_its_report(
    stack: Stack, tmp_path: Path
) -> None:
    tenant = "bench-presence"
    async with bench_target(stack, tmp_path, tenant) as target:
        result = await run_presence(
            target, PresenceParams(pairs=2, cycles=2, gap_s=2.2, timeout_s=30, tenant=tenant)
        )
    print(result.headline)
    login, logout, both = result.rows
    assert [r["transition"] for r in result.rows] == ["login", "logout", "all"]
    assert (login["latency_ms"]["count"], login["missed"]) == (4, 0)
    assert (logout["latency_ms"]["count"], logout["missed"]) == (4, 0)
    assert (both["latency_ms"]["count"], both["missed"]) == (8, 0)
    assert both["latency_ms"]["min"] is not None and both["latency_ms"]["min"] >= 0
    json_path, md_path = write_result(tmp_path / "results", result)
    assert json.loads(json_path.read_text())["scenario"] == "presence"
    assert "presence_propagation_target" in md_path.read_text()
