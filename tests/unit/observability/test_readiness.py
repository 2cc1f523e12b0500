"""``/healthz`` readiness of the two apps, from their services' state (no Kafka needed).

The services are replaced by stand-ins exposing the same state the checks read; the apps are
the real modules (importing one builds its Faust app, which opens no connection).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from qim.apps import conversation, mailbox
from qim.apps.base import health_of


@dataclass
class Shard:
    serving: bool
    lanes: list[int] = field(default_factory=list)

    def refused(self) -> list[int]:
        return self.lanes


@dataclass
class Node:
    owned: dict[int, Shard]


@dataclass
class Service:
    state: dict[str, Any]

    def status(self) -> dict[str, Any]:
        return self.state


@pytest.fixture(autouse=True)
def _no_services() -> Any:
    yield
    mailbox._running.service = None
    conversation._running.service = None
    conversation._fanout.service = None


def test_a_mailbox_node_is_ready_only_when_every_lane_reached_its_floor() -> None:
    assert mailbox.mailbox_readiness() == {"ready": False, "started": False}
    mailbox._running.service = Node({})  # type: ignore[assignment]
    assert mailbox.mailbox_readiness()["ready"] is False  # nothing owned yet (takeover)
    node = Node({0: Shard(True), 1: Shard(True, [3, 9]), 2: Shard(False)})
    mailbox._running.service = node  # type: ignore[assignment]
    state = mailbox.mailbox_readiness()
    assert state["ready"] is False and state["owned"] == [0, 1, 2]
    assert state["not_ready"] == {
        "1": {"serving": True, "lanes_refused": [3, 9]},
        "2": {"serving": False, "lanes_refused": []},
    }
    node.owned = {0: Shard(True), 1: Shard(True), 2: Shard(True)}
    assert mailbox.mailbox_readiness() == {"ready": True, "owned": [0, 1, 2], "not_ready": {}}
    # /healthz needs Faust's own readiness too: a worker that has not started is not ready
    health = health_of(mailbox.app)
    assert health["services"]["mailbox_node"]["ready"] is True
    assert health["worker_ready"] is False and health["ready"] is False


def test_the_conversation_worker_waits_for_every_partition_of_both_services() -> None:
    writer = Service({"assigned": [1, 2], "serving": [1], "restoring": [2], "lease_valid": True})
    fanout = Service({"assigned": [1, 2], "serving": [1, 2], "recovering": [], "stalled": {}})
    conversation._running.service = writer  # type: ignore[assignment]
    conversation._fanout.service = fanout  # type: ignore[assignment]
    assert conversation.writer_readiness()["waiting"] == [2]
    assert conversation.writer_readiness()["ready"] is False
    assert conversation.fanout_readiness()["ready"] is True
    writer.state.update(serving=[1, 2], restoring=[])
    assert conversation.writer_readiness()["ready"] is True
    writer.state["lease_valid"] = False
    assert conversation.writer_readiness()["ready"] is False
    fanout.state["stalled"] = {2: 17}
    assert conversation.fanout_readiness()["ready"] is False
    writer.state.update(assigned=[], serving=[], lease_valid=True)
    assert conversation.writer_readiness()["ready"] is False  # given nothing: serves nothing
    services = health_of(conversation.app)["services"]
    assert set(services) == {"conversation_writer", "fanout_coordinator"}
