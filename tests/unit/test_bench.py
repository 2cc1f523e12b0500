"""Pure parts of `qim bench`: percentiles, the open-loop schedule, the ledger, the report."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from qim.bench.accounting import Deliveries, Ledger, cmid_of_payload, payload_for
from qim.bench.histogram import Samples, percentile
from qim.bench.procstats import parse_stat_cpu_ticks, parse_status_rss
from qim.bench.report import Column, Result, cell, lookup, markdown_table, write_result
from qim.bench.scenarios.presence import _Watch, meets_target
from qim.bench.scenarios.presence import clock as presence_clock
from qim.bench.scenarios.send import meets_slo, ratios
from qim.bench.schedule import run_open_loop, sweep, timetable
from qim.bench.speedscope import summarize
from qim.schemas.frames.control import PresenceEntry, PresenceSubDown


def test_percentiles_are_nearest_rank_on_the_recorded_samples() -> None:
    values = list(range(1, 1001))  # 1..1000
    assert percentile(values, 50) == 500
    assert percentile(values, 99) == 990
    assert percentile(values, 99.9) == 999
    assert percentile(values, 100) == 1000
    assert percentile(values, 0) == 1
    assert percentile([7.0], 99.9) == 7.0
    assert percentile([1, 2, 3, 4], 50) == 2  # not an interpolated 2.5
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1], 101)


def test_samples_summary_sorts_lazily_and_reports_no_data_as_none() -> None:
    s = Samples([5.0, 1.0, 3.0])
    s.add(2.0)
    summary = s.summary((50.0, 99.0))
    assert summary == {"count": 4, "min": 1.0, "mean": 2.75, "max": 5.0, "p50": 2.0, "p99": 5.0}
    s.add(0.5)  # added after a sort: still counted in order
    assert s.percentile(0) == 0.5
    empty = Samples().summary()
    assert empty["count"] == 0 and empty["p99"] is None and empty["p99.9"] is None


def test_timetable_is_evenly_spaced_and_sweep_is_geometric() -> None:
    assert timetable(4.0, 1.0, start=10.0) == [10.0, 10.25, 10.5, 10.75]
    assert len(timetable(30.0, 4.0)) == 120
    assert timetable(3.0, 0.0) == []
    with pytest.raises(ValueError):
        timetable(0.0, 1.0)
    assert sweep(50.0, 3200.0, 7) == [50.0, 100.0, 200.0, 400.0, 800.0, 1600.0, 3200.0]
    assert sweep(10.0, 10.0, 1) == [10.0]


def test_open_loop_fires_at_intended_times_and_never_shifts_after_a_stall() -> None:
    now = [0.0]
    fired: list[tuple[int, float, float]] = []

    async def sleep(seconds: float) -> None:
        now[0] += seconds

    def fire(index: int, intended: float) -> None:
        fired.append((index, intended, now[0]))
        if index == 1:
            now[0] += 0.35  # the event loop stalls for 350 ms right after the second send

    times = timetable(10.0, 0.6)  # 0.0, 0.1, ..., 0.5
    late = asyncio.run(run_open_loop(times, fire, clock=lambda: now[0], sleep=sleep))
    assert [i for i, _, _ in fired] == [0, 1, 2, 3, 4, 5]
    assert [round(t, 3) for _, t, _ in fired] == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    # sends 2 and 3 were due during the stall: they go at once (0.45 s), not 0.1 s apart,
    # and the later ones keep their slots; lateness is counted from the intended time
    assert [round(at, 3) for _, _, at in fired] == [0.0, 0.1, 0.45, 0.45, 0.45, 0.5]
    assert late == pytest.approx(0.25)


def test_payload_carries_the_client_message_id() -> None:
    payload = payload_for("m1-7", 200)
    assert len(payload) == 200 and cmid_of_payload(payload) == "m1-7"
    assert payload_for("a-very-long-id", 4) == b"a-very-long-id|"
    assert cmid_of_payload(b"no separator") is None


def test_ledger_matches_acks_pushes_and_echoes_and_counts_the_rest() -> None:
    ledger = Ledger()
    ledger.on_send("m-0", "s0", "r0", intended=1.0)
    ledger.on_send("m-1", "s1", "r1", intended=1.1)
    ledger.on_send("m-2", "s0", "r0", intended=1.2)
    with pytest.raises(ValueError):
        ledger.on_send("m-0", "s0", "r0", intended=2.0)
    ledger.on_ack("m-0", 1.02)
    ledger.on_ack("m-1", 1.15)
    ledger.on_ack("m-9", 1.3)  # never sent
    ledger.on_error("m-2", "RATE_LIMITED")
    ledger.on_entry("r0", payload_for("m-0", 50), 1.05)
    ledger.on_entry("r0", payload_for("m-0", 50), 1.06)  # a duplicate push
    ledger.on_entry("s0", payload_for("m-0", 50), 1.04)  # the echo
    ledger.on_entry("r1", payload_for("m-1", 50), 1.2)
    ledger.on_entry("r2", payload_for("m-1", 50), 1.2)  # wrong device
    ledger.on_entry("r1", b"junk", 1.2)
    assert not ledger.settled()  # m-1 has no echo yet
    summary = ledger.summary()
    assert summary == {
        "sent": 3,
        "acked": 2,
        "errors": {"RATE_LIMITED": 1},
        "pushed": 2,
        "echoed": 1,
        "push_entries": 3,
        "echo_entries": 1,
        "duplicate_pushes": 1,
        "unexpected_entries": 2,
        "unmatched_acks": 1,
        "missing_ack": 0,
        "lost": 0,
        "echo_missing": 1,
    }
    ledger.on_entry("s1", payload_for("m-1", 50), 1.3)
    assert ledger.settled()  # the failed send expects nothing
    ack, pushed = ledger.latencies()
    assert (len(ack), round(ack.percentile(0) or 0), round(ack.percentile(100) or 0)) == (2, 20, 50)
    # the first push counts, from the intended time
    assert (round(pushed.percentile(0) or 0), round(pushed.percentile(100) or 0)) == (50, 100)


def test_a_message_acked_but_never_pushed_is_lost() -> None:
    ledger = Ledger()
    ledger.on_send("m-0", "s0", "r0", intended=0.0)
    ledger.on_ack("m-0", 0.1)
    ledger.on_entry("s0", payload_for("m-0", 20), 0.2)
    assert ledger.summary()["lost"] == 1 and not ledger.settled()


def test_deliveries_expect_each_message_once_per_recipient() -> None:
    d = Deliveries(frozenset({"a", "b"}))
    d.on_send("f-0", 0.0)
    d.on_entry("a", payload_for("f-0", 30), 0.1)
    d.on_entry("a", payload_for("f-0", 30), 0.2)
    d.on_entry("c", payload_for("f-0", 30), 0.2)
    assert not d.complete()
    d.on_entry("b", payload_for("f-0", 30), 0.3)
    assert d.complete() and d.summary() == {
        "messages": 1,
        "expected_deliveries": 2,
        "delivered": 2,
        "missing": 0,
        "duplicates": 1,
        "unexpected_entries": 1,
    }
    assert d.latency().summary((50.0,))["p50"] == 100.0


def test_proc_parsers_read_cpu_ticks_and_rss() -> None:
    stat = "1234 (faust worker (x)) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 9 0 100 999 88"
    assert parse_stat_cpu_ticks(stat) == 300
    assert parse_status_rss("Name:\tjava\nVmRSS:\t  2048 kB\nThreads: 9\n") == 2048 * 1024
    assert parse_status_rss("Name:\tkthreadd\n") == 0


def test_slo_verdict_and_ratios() -> None:
    row = {
        "achieved_rate": 100.0,
        "send_ack_ms": {"p99": 120.0},
        "pushed_ms": {"p50": 40.0, "p99": 280.0},
        "accounting": {"errors": {}, "lost": 0},
    }
    assert meets_slo(row)
    assert not meets_slo(row | {"pushed_ms": {"p50": 40.0, "p99": 301.0}})
    assert not meets_slo(row | {"accounting": {"errors": {"TIMEOUT": 1}, "lost": 0}})
    assert not meets_slo(row | {"send_ack_ms": {"p99": None}})
    base = {"achieved_rate": 200.0, "latency_ms": {"p50": 10.0, "p99": 0}}
    assert ratios(row, base) == {"achieved_rate": 0.5, "pushed_p50": 4.0, "pushed_p99": None}


def test_report_writes_json_and_a_markdown_table(tmp_path: Path) -> None:
    cols = [Column("rate", "target_rate"), Column("p99", "lat.p99"), Column("errors", "errors")]
    rows = [
        {"target_rate": 50.0, "lat": {"p99": 12.3456}, "errors": {}},
        {"target_rate": 100.0, "lat": {"p99": None}, "errors": {"TIMEOUT": 2, "CLOSED": 1}},
    ]
    assert markdown_table(cols, rows) == (
        "| rate | p99 | errors |\n"
        "|---|---|---|\n"
        "| 50 | 12.346 | - |\n"
        "| 100 | - | TIMEOUT=2, CLOSED=1 |\n"
    )
    assert lookup({"lat": {"p99.9": 4.0, "p99": 3.0}}, "lat.p99.9") == 4.0
    assert lookup({"lat": {"p99": 3.0}}, "lat.p99") == 3.0
    assert lookup({"lat": {"p99": 3.0}}, "lat.p50") is None
    assert cell(True) == "yes" and cell("a|b") == "a\\|b" and cell(0.5) == "0.5"
    result = Result("send", {"pairs": 3}, rows, cols, {"extra": 1}, headline="best: 50 msg/s")
    when = datetime(2026, 11, 29, 10, 15, 0, tzinfo=UTC)
    json_path, md_path = write_result(tmp_path / "results", result, when)
    assert json_path.name == "send-20261129T101500Z.json"
    assert md_path.name == "send-20261129T101500Z.md"
    data = json.loads(json_path.read_text())
    assert data["scenario"] == "send" and data["rows"] == rows and data["extra"] == 1
    assert data["params"] == {"pairs": 3} and data["headline"] == "best: 50 msg/s"
    text = md_path.read_text()
    assert "**best: 50 msg/s**" in text and "| 100 | - | TIMEOUT=2, CLOSED=1 |" in text


def test_a_speedscope_profile_is_summarized_by_self_and_inclusive_time(tmp_path: Path) -> None:
    frames = [
        {"name": "select", "file": "/usr/lib/python3.11/selectors.py", "line": 468},
        {"name": "_serve", "file": "/work/main/qim/agents/mailbox/node.py", "line": 186},
        {"name": "materialize", "file": "/work/main/qim/core/mailbox/materialize.py", "line": 95},
    ]
    samples = [[0], [1, 2], [1, 2], [1]]
    doc = {
        "shared": {"frames": frames},
        "profiles": [{"samples": samples, "weights": [1.0, 1.0, 1.0, 1.0]}],
    }
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    summary = summarize(path)
    assert summary.total == 4.0
    assert summary.self_time[0] == ("materialize (qim/core/mailbox/materialize.py:95)", 0.5)
    assert dict(summary.inclusive) == {
        "_serve (qim/agents/mailbox/node.py:186)": 0.75,
        "materialize (qim/core/mailbox/materialize.py:95)": 0.5,
    }  # select is not a qim frame
    assert summary.lines()[0] == "total sampled: 4.0 s"


def test_reactions_bench_counts_the_most_frames_any_merge_window_held() -> None:
    from qim.bench.scenarios.reactions import max_in_window

    assert max_in_window([], 2.0) == 0
    assert max_in_window([0.0, 2.0, 4.0], 2.0) == 1  # half-open: one per window
    assert max_in_window([5.0, 0.0, 1.9, 2.1], 2.0) == 2
    assert max_in_window([0.0, 0.1, 0.2, 9.0], 2.0) == 3


def test_presence_verdict_needs_every_change_seen_and_the_p99_within_the_target() -> None:
    assert meets_target(999.0, 0, 1000.0)
    assert meets_target(1000.0, 0, 1000.0)
    assert not meets_target(1000.1, 0, 1000.0)
    assert not meets_target(10.0, 1, 1000.0)  # a missed change fails it
    assert not meets_target(None, 0, 1000.0)  # no data is no pass


def test_presence_watch_times_from_since_and_consumes_what_it_matched() -> None:
    async def scenario() -> tuple[float | None, float | None, float | None]:
        watch = _Watch("s")
        stale = presence_clock()
        watch.on_frame(PresenceSubDown(entries=(PresenceEntry(user_id="s", state="online"),)))
        since = presence_clock()

        async def later() -> None:
            await asyncio.sleep(0.05)
            other = PresenceEntry(user_id="other", state="offline")
            watch.on_frame(PresenceSubDown(entries=(other,)))  # not the subject
            await asyncio.sleep(0.05)
            watch.on_frame(PresenceSubDown(entries=(PresenceEntry(user_id="s", state="offline"),)))

        task = asyncio.create_task(later())
        # the online arrival came before ``since``: it does not count for a later wait
        offline = await watch.seen("offline", since, 5.0)
        await task
        again = await watch.seen("offline", since, 0.05)  # consumed: nothing left to match
        # everything up to the match was consumed, the early online arrival too
        first = await watch.seen("online", stale, 0.05)
        return offline, again, first

    offline, again, first = asyncio.run(scenario())
    assert offline is not None and offline >= 90.0
    assert again is None
    assert first is None
