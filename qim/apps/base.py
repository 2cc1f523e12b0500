"""The one place a Faust app of qim is configured: broker, store, guarantees, web and health.

Every app (one per topic group, run as `faust -A qim.apps.<name> worker`) is made here, so the
choices of direction.md section 1 hold everywhere: at-least-once (Faust's exactly_once mode has
open data-loss bugs), RocksDB tables through rocksdict with a capped block cache, web bound to
loopback, and a `/healthz` page that says whether the worker is ready to serve.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

import faust
from faust.web import Request, Response, View

from qim.params import Settings

DEFAULT_BOOTSTRAP = "127.0.0.1:19092"
S = TypeVar("S")

# RocksDB's default block cache is 2 GiB per partition DB; a 64-partition table would claim the
# whole machine. These caps are per partition DB (faust opens one DB per table partition).
ROCKSDB_OPTIONS: Mapping[str, Any] = {
    "block_cache_size": 8 * 1024 * 1024,
    "write_buffer_size": 4 * 1024 * 1024,
    "max_write_buffer_number": 2,
    "max_open_files": 256,
}


def kafka_bootstrap(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get("QIM_KAFKA_BOOTSTRAP", DEFAULT_BOOTSTRAP)


def make_app(app_id: str, *, env: Mapping[str, str] | None = None, **overrides: Any) -> faust.App:
    """A Faust app with qim's fixed settings; `overrides` are for tests and special workers."""
    env = os.environ if env is None else env
    params = Settings.load(env=env)
    settings: dict[str, Any] = {
        "broker": f"kafka://{kafka_bootstrap(env)}",
        "store": "rocksdb://",
        "processing_guarantee": "at_least_once",
        "producer_acks": -1,
        "topic_replication_factor": int(env.get("QIM_REPLICATION_FACTOR", "1")),
        "topic_allow_declare": True,
        "table_standby_replicas": int(env.get("QIM_STANDBY_REPLICAS", "0")),
        "web_bind": "127.0.0.1",
        "web_host": "127.0.0.1",
        "web_in_thread": False,
        # The group's session timeout is the shard lease (direction.md 4.1, B.1 shard_lease_ttl).
        "broker_session_timeout": params.shard_lease_ttl / 1000.0,
        "broker_heartbeat_interval": 3.0,
        "stream_wait_empty": False,
        "consumer_auto_offset_reset": "earliest",
        # A group formed before a new topic's metadata reached the broker gets an empty
        # assignment; aiokafka rebalances when a metadata refresh shows the topic, so refresh
        # often (the default is 5 minutes, during which the worker would look ready and idle).
        "consumer_metadata_max_age_ms": 5000,
        "autodiscover": False,
    }
    settings.update(overrides)
    app = faust.App(app_id, **settings)
    install_health(app)
    return app


def crashed_agents(app: faust.App) -> list[str]:
    """Agents with an actor that crashed (even if its supervisor restarted it): a bug of ours."""
    names = []
    for name, agent in sorted(app.agents.items()):
        actors = list(getattr(agent, "_actors", ()))
        if any(a._crashed.is_set() or getattr(a, "restart_count", 0) for a in actors):
            names.append(name)
    return names


def health_of(app: faust.App) -> dict[str, Any]:
    """Ready means: not rebalancing, table recovery finished, and no agent has crashed."""
    recovery_done = bool(app.tables.recovery.completed.is_set())  # type: ignore[attr-defined]
    crashed = crashed_agents(app)
    rebalancing = bool(getattr(app, "rebalancing", False))
    try:
        assigned = sorted(f"{tp.topic}:{tp.partition}" for tp in app.consumer.assignment())
    except Exception:  # the consumer does not exist before the worker starts
        assigned = []
    return {
        "app": app.conf.id,
        "ready": recovery_done and not rebalancing and not crashed,
        "crashed_agents": crashed,
        "rebalancing": rebalancing,
        "recovery_complete": recovery_done,
        "assigned_partitions": len(assigned),
    }


class RunningService(Generic[S]):
    """The one long-running service of a worker process, once Faust has started it."""

    def __init__(self) -> None:
        self.service: S | None = None


def install_status_page(app: faust.App, path: str, running: RunningService[Any]) -> None:
    """A JSON status page for a service: 503 until it started, then its ``status()``."""

    async def status_page(web: View, request: Request) -> Response:
        service = running.service
        if service is None:
            return web.json({"started": False}, status=503)
        return web.json({"started": True, **service.status()})

    app.page(path, name=f"status{path.replace('/', '_')}")(status_page)


def install_health(app: faust.App) -> None:
    @app.page("/healthz")
    async def healthz(web: View, request: Request) -> Response:
        state = health_of(app)
        return web.json(state, status=200 if state["ready"] else 503)

    del healthz
