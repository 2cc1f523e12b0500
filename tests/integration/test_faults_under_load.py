"""Faults under load on one private stack: broker restarts (issue 15, item 1), then a fuzz run.
They share the stack to save its start.

Every producer recovers by itself from broker restarts under traffic.

The whole stack (conversation and mailbox workers, a gateway) runs on a private Kafka, which
this module restarts several times on the same data dir and ports while SDK senders keep
sending (``qim chaos broker-restart``'s own code, CI-sized). Afterwards a message to a
one-to-one conversation on every conversation partition must get its SEND_ACK, every acked
message must be in its recipient's mailbox, each process's producer-replaced counter must have
moved exactly as often as it logged a replacement, and the gateway's RSS must be back below a
bound once the senders are gone.

Then ``qim chaos fuzz``, CI-sized: frames from the independent generator into the gateway
while a well-behaved client must be answered throughout, the gateway alive and its RSS back
within a bound afterwards (the 10^6-frame run is ``qim chaos fuzz``).

The mixed soak (``qim chaos run``: SIGKILLs of every qim process, a pause past the lease, a
broker restart, then delivery, audit, replay and always-zero checks) is a soak, so it runs as
``qim chaos run --private``, not in this suite; its reports are committed under
``bench/results/chaos-run-*`` (bench/README.md). The kill -9 of every worker type with the
audit is ``test_audit_dispatch.py``.

Its own stack, not the session's: restarting the session broker would fail other tests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import ProducerFenced

from qim.agents.writer.options import WriterOptions
from qim.agents.writer.restore import fenced_producer
from qim.bench.accounting import payload_for
from qim.bench.target import Target
from qim.chaos.broker_restart import (
    BrokerRestartParams,
    peers_per_partition,
    replacement_counters,
    run_broker_restart,
)
from qim.chaos.cli import write_report
from qim.chaos.fuzz import CLOSING, FuzzParams, run_fuzz
from qim.chaos.load import Sender
from qim.devstack.stack import Stack, StackConfig, default_partition_counts
from qim.streams import OUTBOX

pytestmark = pytest.mark.integration

RSS_GROWTH_BOUND = 96 * 1024 * 1024
TRANSACTIONAL_PREFIX = WriterOptions.transactional_id_prefix
PARTITIONS = default_partition_counts()["conversation_partition_count"]  # for_tests: the defaults


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
        restarts=2,
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

    assert len(report["faults"]) == 2 and all(f["was_running"] for f in report["faults"])
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


@pytest.mark.timeout(600)
async def test_after_the_restarts_the_writers_restore_still_fences_a_former_producer(
    own_stack: Stack,
) -> None:
    """A zombie with partition 0's transactional id (started after the restarts, so it fences
    the live writer's producer) opens a transaction; the writer's next transaction fails, its
    restore starts a new producer, and that InitProducerId must fence the zombie: its commit
    fails and nothing it wrote is visible to read_committed readers."""
    bootstrap = own_stack.cfg.kafka.bootstrap
    zombie = await fenced_producer(
        bootstrap, f"{TRANSACTIONAL_PREFIX}-0", transaction_timeout_ms=60_000, client_id="zombie"
    )
    try:
        await zombie.begin_transaction()
        await (await zombie.send(OUTBOX.name, b"zombie", key=b"zombie", partition=0))
        target = Target.from_stack(own_stack.cfg)
        sender = Sender(target, "chaos", "fence-s")
        await sender.connect()
        try:
            peer = peers_per_partition("chaos", "fence-s", PARTITIONS, "fence-r")[0]
            outcome = await sender.send(peer, "fence-probe", payload_for("fence-probe", 64), 150)
        finally:
            await sender.close()
        assert outcome.acked, outcome  # partition 0 served again, by a restored writer
        with pytest.raises(ProducerFenced):
            await zombie.commit_transaction()
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(zombie.stop(), 10)
    assert b"zombie" not in await committed_values(bootstrap, OUTBOX.name, 0)
    writer = next(w for w in own_stack.cfg.workers if w.module == "qim.apps.conversation")
    counters = replacement_counters({"c": f"http://127.0.0.1:{writer.web_port}/metrics"})
    assert counters.get("c writer ProducerFenced", 0) >= 1, counters


@pytest.mark.timeout(600)
async def test_fuzz_frames_never_kill_the_gateway_and_a_good_client_is_served_throughout(
    own_stack: Stack,
) -> None:
    report = await run_fuzz(own_stack, FuzzParams(frames=20_000, connections=2, seed=25))
    assert report["gateway_alive"]
    observer = report["observer"]
    assert observer["pings"] > 0 and observer["sends"] > 0 and not observer["failures"], observer
    assert sum(report["frames_by_kind"].values()) == 20_000
    assert any(report["frames_by_kind"].get(k) for k in CLOSING)  # some closing kinds were sent
    assert report["replies_by_opcode"].get("0x0007", 0) > 0  # ERROR answers came back
    rss = report["gateway_rss_bytes"]
    assert rss["after"] - rss["before"] <= FuzzParams.rss_growth_bound, rss
    assert report["ok"]


async def committed_values(bootstrap: str, topic: str, partition: int) -> list[bytes]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_committed"
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]  # the last stable offset
        consumer.seek(tp, (await consumer.beginning_offsets([tp]))[tp])
        values: list[bytes] = []
        while await consumer.position(tp) < end:
            for records in (await consumer.getmany(tp, timeout_ms=1000)).values():
                values += [r.value for r in records]
        return values
    finally:
        await consumer.stop()
