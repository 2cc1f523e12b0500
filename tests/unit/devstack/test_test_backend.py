"""``QIM_TEST_BACKEND``: which Kafka and Redis the suite's ``stack`` fixture starts.

No Docker engine exists here, so the container backend is checked up to the containers it
would start (a fake ``DockerContainer``): images of the jar backend's versions, the test
config's ports, the jar broker's own properties.
"""

from __future__ import annotations

import importlib
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest

from qim.devstack import kafka, procs
from qim.devstack.stack import Stack, StackConfig
from tests import backends
from tests.backends import (
    BACKEND_ENV,
    ContainerBrokers,
    JarBrokers,
    brokers_for,
    kafka_container_env,
    redis_container_command,
    selected_backend,
)


def _stack(tmp_path: Path) -> Stack:
    return Stack(StackConfig().for_tests(tmp_path))


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, "jar"),
        ({BACKEND_ENV: ""}, "jar"),
        ({BACKEND_ENV: "jar"}, "jar"),
        ({BACKEND_ENV: "testcontainers"}, "testcontainers"),
        ({BACKEND_ENV: " testcontainers\n"}, "testcontainers"),
    ],
)
def test_the_variable_selects_the_backend_and_the_jar_broker_is_the_default(
    environ: dict[str, str], expected: str
) -> None:
    assert selected_backend(environ) == expected


@pytest.mark.parametrize("value", ["docker", "Testcontainers", "containers"])
def test_an_unknown_backend_is_an_error_not_the_default(value: str) -> None:
    with pytest.raises(ValueError, match=BACKEND_ENV):
        selected_backend({BACKEND_ENV: value})


def test_each_backend_gets_its_brokers_and_nothing_starts(tmp_path: Path) -> None:
    stack = _stack(tmp_path)
    assert isinstance(brokers_for("jar", stack), JarBrokers)
    assert isinstance(brokers_for("testcontainers", stack), ContainerBrokers)
    assert list(tmp_path.iterdir()) == []


def test_the_container_broker_runs_the_jar_brokers_properties_on_the_same_ports(
    tmp_path: Path,
) -> None:
    cfg = _stack(tmp_path).cfg.kafka
    env = kafka_container_env(cfg)
    jar = dict(line.partition("=")[::2] for line in kafka.server_properties(cfg).splitlines())
    assert {k: v for k, v in env.items() if k != "CLUSTER_ID"}.keys() == {
        "KAFKA_" + k.upper().replace(".", "_") for k in jar
    }
    changed = {"KAFKA_LISTENERS", "KAFKA_LOG_DIRS"}
    for key, value in jar.items():
        name = "KAFKA_" + key.upper().replace(".", "_")
        if name not in changed:
            assert env[name] == value, name
    assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{cfg.bootstrap}"
    assert env["KAFKA_LISTENERS"] == (
        f"PLAINTEXT://0.0.0.0:{cfg.port},CONTROLLER://0.0.0.0:{cfg.controller_port}"
    )
    assert not env["KAFKA_LOG_DIRS"].startswith(str(tmp_path))
    assert len(env["CLUSTER_ID"]) == 22


def test_the_container_redis_keeps_the_jar_config_and_binds_the_container(
    tmp_path: Path,
) -> None:
    cfg = _stack(tmp_path).cfg.redis
    command = redis_container_command(cfg)
    pairs = dict(zip(command[1::2], command[2::2], strict=True))
    assert command[0] == "redis-server"
    assert pairs["--port"] == str(cfg.port)
    assert pairs["--appendonly"] == "yes" and pairs["--appendfsync"] == "everysec"
    assert pairs["--save"] == "" and pairs["--bind"] == "0.0.0.0"
    assert "--dir" not in pairs and "--daemonize" not in pairs


def test_without_the_extra_the_container_backend_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing(name: str) -> Any:
        raise ImportError(name)

    monkeypatch.setattr(importlib, "import_module", missing)
    with pytest.raises(RuntimeError, match=r"\.\[containers\]"):
        ContainerBrokers(_stack(tmp_path)).start()


class _FakeContainer:
    made: ClassVar[list[_FakeContainer]] = []

    def __init__(self, image: str) -> None:
        self.image = image
        self.ports: dict[int, int] = {}
        self.env: dict[str, str] = {}
        self.command: list[str] = []
        self.state = "new"
        _FakeContainer.made.append(self)

    def with_bind_ports(self, container: int, host: int) -> _FakeContainer:
        self.ports[container] = host
        return self

    def with_env(self, key: str, value: str) -> _FakeContainer:
        self.env[key] = value
        return self

    def with_command(self, command: list[str]) -> _FakeContainer:
        self.command = command
        return self

    def start(self) -> None:
        self.state = "started"

    def stop(self) -> None:
        self.state = "stopped"


def test_the_container_backend_starts_both_images_on_the_configs_ports_and_stops_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _FakeContainer.made = []
    module = types.SimpleNamespace(DockerContainer=_FakeContainer)
    monkeypatch.setattr(importlib, "import_module", lambda name: module)
    waited: list[str] = []
    monkeypatch.setattr(procs, "wait_until", lambda check, *, timeout_s, what: waited.append(what))
    topics: list[str] = []

    async def ensure_topics(bootstrap: str, *args: object) -> None:
        topics.append(bootstrap)

    monkeypatch.setattr(backends, "ensure_topics", ensure_topics)
    stack = _stack(tmp_path)
    brokers = ContainerBrokers(stack)
    brokers.start()

    by_image = {c.image: c for c in _FakeContainer.made}
    assert set(by_image) == {f"apache/kafka:{kafka.KAFKA_VERSION}", backends.REDIS_IMAGE}
    broker = by_image[backends.KAFKA_IMAGE]
    assert broker.ports == {stack.cfg.kafka.port: stack.cfg.kafka.port}
    assert broker.env == {
        **kafka_container_env(stack.cfg.kafka),
        "CLUSTER_ID": broker.env["CLUSTER_ID"],
    }
    store = by_image[backends.REDIS_IMAGE]
    assert store.ports == {stack.cfg.redis.port: stack.cfg.redis.port}
    assert store.command == redis_container_command(stack.cfg.redis)
    assert {c.state for c in _FakeContainer.made} == {"started"}
    assert waited == ["Redis PING", "Kafka metadata"]
    assert topics == [stack.cfg.kafka.bootstrap]

    brokers.stop()
    assert {c.state for c in _FakeContainer.made} == {"stopped"}
