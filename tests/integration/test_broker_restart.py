"""Every producer recovers by itself from broker restarts under traffic (issue 15, item 1).

The whole stack (conversation and mailbox workers, a gateway) runs on a private Kafka, which
this module restarts several times on the same data dir and ports while SDK senders keep
sending (``qim chaos broker-restart``'s own code, CI-sized). Afterwards a message to a
one-to-one conversation on every conversation partition must get its SEND_ACK, every acked
message must be in its recipient's mailbox, each process's producer-replaced counter must have
moved exactly as often as it logged a replacement, and the gateway's RSS must be back below a
bound once the senders are gone.

Its own stack, not the session's: restarting the session broker would fail other tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from qim.chaos.broker_restart import BrokerRestartParams, run_broker_restart
from qim.chaos.cli import write_report
from qim.devstack.stack import Stack, StackConfig

pytestmark = pytest.mark.integration

RSS_GROWTH_BOUND = 96 * 1024 * 1024


@pytest.fixture(scope="module")
def own_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Kafka, Redis, one worker of each app and a gateway on free loopback ports."""
    st = Stack(StackConfig(admins=()).for_tests(tmp_path_factory.mktemp("qim-restart")))
    try:
        st.start_services()
        for worker in st.cfg.workers:
            st.start_worker(worker, timeout_s=180)
        for gateway in st.cfg.gateways:
            st.start_gateway(gateway)
        yield st
    finally:
        st.down()


@pytest.mark.timeout(1200)
async def test_after_broker_restarts_under_load_every_partition_serves_and_nothing_is_lost(
    own_stack: Stack, tmp_path: Path
) -> None:
    params = BrokerRestartParams(
        restarts=3,
        down_s=12.0,
        between_s=8.0,
        senders=2,
        lanes_per_sender=2,
        interval_s=0.4,
        probe_budget_s=150.0,
        delivery_within_s=150.0,
    )
    report = await run_broker_restart(own_stack, params, progress=lambda line: None)
    json_path, md_path = write_report(tmp_path, report)
    context = md_path.read_text()

    assert len(report["faults"]) == 3 and all(f["was_running"] for f in report["faults"])
    partitions = own_stack.cfg.partition_counts["conversation_partition_count"]
    assert [row["partition"] for row in report["partitions"] if row["serving"]] == list(
        range(partitions)
    ), context
    assert report["load"]["acked"] > params.restarts, context  # traffic ran across the restarts
    assert report["delivery"]["lost"] == 0, context
    assert report["delivery"]["acked_expected"] == report["load"]["acked"], context
    assert report["ok"] is True and json_path.exists()

    # the replacement counter moves exactly when a producer was replaced (logged), per process
    counted: dict[str, float] = {}
    for key, value in report["producers_replaced"].items():
        process = key.split(" ", 1)[0]
        counted[process] = counted.get(process, 0.0) + value
    for process, lines in report["replacement_log_lines"].items():
        assert counted.get(process, 0.0) == lines, (process, context)

    rss = report["gateway_rss_bytes"]
    assert rss["before"] is not None and rss["after"] is not None
    assert rss["after"] <= rss["before"] + RSS_GROWTH_BOUND, context
