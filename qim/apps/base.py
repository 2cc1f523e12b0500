"""The one place a Faust app of qim is configured: broker, store, guarantees, web and health.

Every app (one per topic group, run as `faust -A qim.apps.<name> worker`) is made here, so the
choices of direction.md section 1 hold everywhere: at-least-once (Faust's exactly_once mode has
open data-loss bugs), RocksDB tables through rocksdict with a capped block cache, web bound to
loopback, a `/healthz` page that says whether the worker is ready to serve, `/metrics`, and
JSON log lines when ``QIM_LOG_FORMAT=json``.

Readiness (`/healthz`, 200 ready / 503 not): Faust's own (``worker_ready``: table recovery
done, not rebalancing, no crashed agent) AND every service check registered with
:func:`add_readiness` -- the ConversationWriter has restored every partition it was assigned,
the FanoutCoordinator serves every outbox partition it was assigned, the MailboxNode has taken
over its shards and every lane reached its floor (direction.md 4.1). A worker the group gave
nothing is not ready: it serves nothing. The body names each service's state, per shard.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import faust
from faust.web import Request, Response, View
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from qim.observability.logging import json_logging_config, wants_json
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
    if wants_json(env):
        settings["logging_config"] = json_logging_config(app_id)
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


ReadinessCheck = Callable[[], dict[str, Any]]
"""A service's readiness: a JSON-able dict with at least ``"ready": bool``."""

_READINESS: dict[str, dict[str, ReadinessCheck]] = {}


def add_readiness(app: faust.App, name: str, check: ReadinessCheck) -> None:
    """Make ``/healthz`` ready only when ``check()["ready"]`` is true too."""
    _READINESS.setdefault(app.conf.id, {})[name] = check


def health_of(app: faust.App) -> dict[str, Any]:
    """Faust's readiness (not rebalancing, table recovery finished, no agent crashed) and the
    registered services' readiness."""
    recovery_done = bool(app.tables.recovery.completed.is_set())  # type: ignore[attr-defined]
    crashed = crashed_agents(app)
    rebalancing = bool(getattr(app, "rebalancing", False))
    try:
        assigned = sorted(f"{tp.topic}:{tp.partition}" for tp in app.consumer.assignment())
    except Exception:  # the consumer does not exist before the worker starts
        assigned = []
    worker_ready = recovery_done and not rebalancing and not crashed
    services = {name: check() for name, check in _READINESS.get(app.conf.id, {}).items()}
    return {
        "app": app.conf.id,
        "ready": worker_ready and all(bool(s.get("ready")) for s in services.values()),
        "worker_ready": worker_ready,
        "services": services,
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


def install_metrics_page(
    app: faust.App, path: str, registry: Callable[[], CollectorRegistry | None]
) -> None:
    """The Prometheus text exposition of ``registry()`` at ``path`` (503 before it exists)."""

    async def metrics_page(web: View, request: Request) -> Response:
        reg = registry()
        if reg is None:
            return web.text("", status=503)
        body = generate_latest(reg).decode()
        return web.text(body, content_type=CONTENT_TYPE_LATEST.split(";")[0])

    app.page(path, name=f"metrics{path.replace('/', '_')}")(metrics_page)


def install_health(app: faust.App) -> None:
    @app.page("/healthz")
    async def healthz(web: View, request: Request) -> Response:
        state = health_of(app)
        return web.json(state, status=200 if state["ready"] else 503)

    del healthz
