"""The real stack: Kafka and Redis start, a Faust agent fills a RocksDB table, and a restarted
worker gets the table back from its changelog (issue 2, section 4)."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import pytest
import redis

from qim.devstack import kafka
from qim.devstack.stack import Stack
from qim.streams import ALL_TOPICS
from tests.integration.kafka_util import (
    create_topic,
    group_caught_up,
    list_topics,
    produce,
    topic_config,
    wait_for,
)
from tests.integration.workers import FaustWorker

pytestmark = pytest.mark.integration


def test_declared_topics_exist_with_their_cleanup_policy(stack: Stack) -> None:
    bootstrap = stack.cfg.kafka.bootstrap
    names = list_topics(bootstrap)
    for spec in ALL_TOPICS:
        assert spec.name in names
        assert topic_config(bootstrap, spec.name)["cleanup.policy"] == spec.cleanup


def test_redis_runs_with_aof_on_loopback(stack: Stack) -> None:
    r = redis.Redis.from_url(stack.cfg.redis.url)
    try:
        assert r.config_get("appendonly")["appendonly"] == "yes"
        assert r.config_get("appendfsync")["appendfsync"] == "everysec"
        assert r.config_get("bind")["bind"] == "127.0.0.1"
        r.set("qim:probe", "1")
        assert r.get("qim:probe") == b"1"
    finally:
        r.close()


def test_kafka_start_is_idempotent(stack: Stack) -> None:
    kafka.start(stack.cfg.kafka)  # already running: returns once metadata answers
    assert kafka.metadata_ok("127.0.0.1", stack.cfg.kafka_port)


def test_faust_rocksdb_table_recovers_from_changelog(stack: Stack, tmp_path: Path) -> None:
    bootstrap = stack.cfg.kafka.bootstrap
    run_id = uuid.uuid4().hex[:8]
    topic = f"it-counts-{run_id}"
    app_id = f"it-counter-{run_id}"
    create_topic(bootstrap, topic, 4)
    env = {"QIM_TEST_APP_ID": app_id, "QIM_TEST_TOPIC": topic}
    worker = FaustWorker(stack, "tests.integration.faust_apps.counter", tmp_path / "w", env)

    records = [(f"user-{i % 7}".encode(), f"m{i}".encode()) for i in range(210)]
    expected = Counter(k.decode() for k, _ in records)
    worker.start()
    try:
        produce(bootstrap, topic, records)
        wait_for(
            lambda: worker.get("/counts") == expected,
            60,
            "table to count every event",
            diagnose=lambda: f"{worker.get('/counts')}\n{worker.log_tail()}",
        )
        # Offsets committed up to the end: a restart must not reprocess anything.
        wait_for(lambda: group_caught_up(bootstrap, app_id, topic), 60, "offset commit")
    finally:
        worker.stop()

    changelog = f"{app_id}-counts-changelog"
    assert changelog in list_topics(bootstrap)
    assert topic_config(bootstrap, changelog)["cleanup.policy"] == "compact"

    # Restart with the local RocksDB wiped: only the changelog can restore the table.
    worker.wipe_state()
    assert not worker.datadir.exists()
    worker.start()
    try:
        assert worker.get("/counts") == expected
        assert any(worker.datadir.rglob("*.db")), "the table lives in RocksDB on disk"

        # Processing goes on from the committed offsets, on top of the recovered state.
        more = [(f"user-{i % 3}".encode(), b"late") for i in range(30)]
        produce(bootstrap, topic, more)
        expected.update(k.decode() for k, _ in more)
        wait_for(
            lambda: worker.get("/counts") == expected,
            60,
            "counts after restart",
            diagnose=lambda: f"{worker.get('/counts')}\n{worker.log_tail()}",
        )
        wait_for(lambda: group_caught_up(bootstrap, app_id, topic), 60, "offset commit")
    finally:
        worker.stop()

    # Restart with the local RocksDB kept: the store resumes from its persisted offset.
    worker.start()
    try:
        assert worker.get("/counts") == expected
    finally:
        worker.stop()


def test_app_workers_start_and_report_healthy(stack: Stack) -> None:
    """The README's run command starts these same workers; each must reach /healthz ready."""
    try:
        for w in stack.cfg.workers:
            stack.start_worker(w)
        status = stack.status()
        for w in stack.cfg.workers:
            health = status["workers"][w.name]["health"]
            assert health is not None and health["ready"] is True, health
            assert health["crashed_agents"] == []
    finally:
        for w in stack.cfg.workers:
            stack.stop_worker(w)
    assert all(not w["running"] for w in stack.status()["workers"].values())


def test_a_crashed_agent_makes_the_worker_unhealthy(stack: Stack, tmp_path: Path) -> None:
    bootstrap = stack.cfg.kafka.bootstrap
    run_id = uuid.uuid4().hex[:8]
    topic, app_id = f"it-crash-{run_id}", f"it-crash-{run_id}"
    create_topic(bootstrap, topic, 4)
    env = {"QIM_TEST_APP_ID": app_id, "QIM_TEST_TOPIC": topic}
    worker = FaustWorker(stack, "tests.integration.faust_apps.counter", tmp_path / "w", env)
    worker.start()
    try:
        assert worker.health()["ready"] is True
        produce(bootstrap, topic, [(b"user-1", b"crash")])
        wait_for(lambda: worker.health()["ready"] is False, 60, "/healthz to report the crash")
        assert worker.health()["crashed_agents"] == ["tests.integration.faust_apps.counter.count"]
    finally:
        worker.stop()
