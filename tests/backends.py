"""Where the suite's Kafka and Redis come from: ``QIM_TEST_BACKEND`` picks one of two.

* ``jar`` (the default, and the only one this machine can run): the devstack's own broker
  from the Kafka jars and Debian's ``redis-server``, as ``Stack.start_services`` starts them.
* ``testcontainers``: for machines with Docker and no local jars, the same versions as
  containers (``apache/kafka:4.1.1``, ``redis:7.0.15``) through the optional ``containers``
  extra (``pip install -e '.[containers]'``). The broker gets the jar broker's own
  ``server.properties`` as the image's ``KAFKA_*`` variables, and each container publishes the
  very loopback port the test ``StackConfig`` picked, so ``stack.cfg`` (bootstrap, Redis URL)
  is the same object for both and every other line of the fixture is shared. What it cannot
  do: the tests that drive the broker's or Redis's own processes through
  ``qim.devstack.kafka`` / ``redis`` (``test_foundation_stack.py``).

Why the testcontainers module is imported by name at start: it is an optional dependency, so
importing this module (and choosing a backend) must work without it.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, get_args

from qim.devstack import kafka, procs, redis
from qim.devstack.stack import Stack, ensure_topics
from qim.streams.topics import ALL_TOPICS

__all__ = [
    "BACKEND_ENV",
    "KAFKA_IMAGE",
    "REDIS_IMAGE",
    "Backend",
    "Brokers",
    "ContainerBrokers",
    "JarBrokers",
    "brokers_for",
    "kafka_container_env",
    "redis_container_command",
    "selected_backend",
]

BACKEND_ENV: Final = "QIM_TEST_BACKEND"
Backend = Literal["jar", "testcontainers"]
KAFKA_IMAGE: Final = f"apache/kafka:{kafka.KAFKA_VERSION}"
REDIS_IMAGE: Final = "redis:7.0.15"  # Debian bookworm's redis-server, which the jar backend runs
_KAFKA_DATA: Final = "/var/lib/kafka/data"
_START_TIMEOUT_S: Final = 120.0


def selected_backend(environ: Mapping[str, str]) -> Backend:
    """The backend ``environ`` names; unset or empty is ``jar``; anything else is an error
    (a typo must not silently run the other backend)."""
    value = environ.get(BACKEND_ENV, "").strip() or "jar"
    for backend in get_args(Backend):
        if value == backend:
            return backend  # type: ignore[no-any-return]
    raise ValueError(f"{BACKEND_ENV}={value!r}: expected one of {', '.join(get_args(Backend))}")


class Brokers(Protocol):
    """Starts Kafka (with the declared topics) and Redis for ``stack``; stops what it started."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass
class JarBrokers:
    """The default: the devstack's processes, stopped by ``Stack.down`` like everything else."""

    stack: Stack

    def start(self) -> None:
        self.stack.start_services()

    def stop(self) -> None:
        """Nothing: ``Stack.down`` stops the broker and Redis by their pid files."""


def kafka_container_env(cfg: kafka.KafkaConfig) -> dict[str, str]:
    """The jar broker's ``server.properties`` as the image's ``KAFKA_*`` variables.

    Two lines differ: the listeners bind every interface of the container (a published port
    reaches it on its own address, not on its loopback), and the log dir lives in the
    container. The ports stay the configured ones, so the advertised ``127.0.0.1:port`` works
    from inside and from the host alike."""
    env = {"CLUSTER_ID": kafka.new_cluster_id()}
    for line in kafka.server_properties(cfg).splitlines():
        key, _, value = line.partition("=")
        if key == "listeners":
            value = value.replace("//127.0.0.1:", "//0.0.0.0:")
        elif key == "log.dirs":
            value = _KAFKA_DATA
        env["KAFKA_" + key.upper().replace(".", "_")] = value
    return env


def redis_container_command(cfg: redis.RedisConfig) -> list[str]:
    """``redis-server`` with the jar backend's config as arguments, minus what is the
    container's own business (bind address, data dir, daemonizing, the log file)."""
    args = ["redis-server"]
    for line in redis.server_conf(cfg).splitlines():
        key, _, value = line.partition(" ")
        if key in {"bind", "dir", "daemonize", "logfile"}:
            continue
        args += [f"--{key}", value.strip('"')]
    args += ["--bind", "0.0.0.0", "--protected-mode", "no"]
    return args


def _docker_container() -> Any:
    try:
        module = importlib.import_module("testcontainers.core.container")
    except ImportError as exc:
        raise RuntimeError(
            f"{BACKEND_ENV}=testcontainers needs the optional extra: pip install -e '.[containers]'"
        ) from exc
    return module.DockerContainer


@dataclass
class ContainerBrokers:
    """Kafka and Redis containers on the ports of ``stack.cfg``; the topics as for the jar."""

    stack: Stack
    _running: list[Any] = field(default_factory=list)

    def start(self) -> None:
        container = _docker_container()
        cfg = self.stack.cfg
        broker = container(KAFKA_IMAGE).with_bind_ports(cfg.kafka.port, cfg.kafka.port)
        for key, value in kafka_container_env(cfg.kafka).items():
            broker = broker.with_env(key, value)
        store = container(REDIS_IMAGE).with_bind_ports(cfg.redis.port, cfg.redis.port)
        store = store.with_command(redis_container_command(cfg.redis))
        for c in (store, broker):
            c.start()
            self._running.append(c)
        procs.wait_until(
            lambda: redis.ping(cfg.redis.port), timeout_s=_START_TIMEOUT_S, what="Redis PING"
        )
        procs.wait_until(
            lambda: kafka.metadata_ok("127.0.0.1", cfg.kafka.port),
            timeout_s=_START_TIMEOUT_S,
            what="Kafka metadata",
        )
        asyncio.run(ensure_topics(cfg.kafka.bootstrap, ALL_TOPICS, cfg.partition_counts))

    def stop(self) -> None:
        while self._running:
            self._running.pop().stop()


def brokers_for(backend: Backend, stack: Stack) -> Brokers:
    """The :class:`Brokers` of ``backend`` for ``stack`` (nothing is started yet)."""
    if backend == "testcontainers":
        return ContainerBrokers(stack)
    return JarBrokers(stack)
