"""The conversation app: ConversationWriter, GroupMembership, HistoryArchiver.

Run with `faust -A qim.apps.conversation worker`. The ConversationWriter is a service of this
app (``qim.agents.writer.conversation_writer``): its own consumer group ``qim-conversation-writers``
on ``qim.conversation-requests``, one transactional producer per owned partition, and the
MessageStore (RocksDB per partition) under the worker's ``--datadir``. GroupMembership and the
HistoryArchiver run inside it, on the same outbox records. The FanoutCoordinator is a second
service (``qim.agents.fanout.coordinator``, consumer group ``qim-fanout`` on ``qim.outbox``,
read_committed) turning each committed record into one GroupDispatch per target MailboxShard.

Pages: ``/writer`` shows which partitions this worker owns and serves, ``/fanout`` the
FanoutCoordinator's; ``/metrics`` exports both services' series (one registry); ``/healthz``
is ready once every assigned conversation partition is restored and serving and every
assigned outbox partition is recovered by the FanoutCoordinator.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from qim.agents.fanout.coordinator import FanoutCoordinatorService
from qim.agents.fanout.options import FanoutOptions
from qim.agents.writer.conversation_writer import ConversationWriterService
from qim.agents.writer.options import WriterOptions
from qim.apps.base import (
    ROCKSDB_OPTIONS,
    RunningService,
    add_readiness,
    install_metrics_page,
    install_status_page,
    kafka_bootstrap,
    make_app,
)
from qim.params import Settings

app = make_app("qim-conversation")
registry = CollectorRegistry()
"""The worker's ``/metrics``: the ConversationWriter's and the FanoutCoordinator's series."""

_running: RunningService[ConversationWriterService] = RunningService()
_fanout: RunningService[FanoutCoordinatorService] = RunningService()


@app.service
class ConversationWriter(ConversationWriterService):
    """The ConversationWriter of the partitions the group gives this worker."""

    def __init__(self, **kwargs: Any) -> None:
        options = WriterOptions.load(
            Settings.load(),
            os.environ,
            bootstrap=kafka_bootstrap(),
            datadir=Path(app.conf.datadir),
            store_caps=ROCKSDB_OPTIONS,
        )
        super().__init__(options, registry=registry, **kwargs)
        _running.service = self


@app.service
class FanoutCoordinator(FanoutCoordinatorService):
    """The FanoutCoordinator of the outbox partitions the group gives this worker."""

    def __init__(self, **kwargs: Any) -> None:
        opts = FanoutOptions.from_settings(Settings.load(), bootstrap=kafka_bootstrap())
        super().__init__(opts, registry=registry, **kwargs)
        _fanout.service = self


def _owned(status: dict[str, Any], done: str, busy: str) -> dict[str, Any]:
    assigned, serving = set(status["assigned"]), set(status[done])
    waiting = sorted(assigned - serving)
    return {
        "ready": bool(assigned) and not waiting and not status[busy],
        "assigned": len(assigned),
        done: len(serving),
        "waiting": waiting,
    }


def writer_readiness() -> dict[str, Any]:
    """Every assigned conversation partition restored and serving, the lease valid."""
    service = _running.service
    if service is None:
        return {"ready": False, "started": False}
    status = service.status()
    state = _owned(status, "serving", "restoring")
    state["ready"] = state["ready"] and bool(status["lease_valid"])
    return state


def fanout_readiness() -> dict[str, Any]:
    """Every assigned outbox partition recovered; none stalled at a record it refuses."""
    service = _fanout.service
    if service is None:
        return {"ready": False, "started": False}
    status = service.status()
    state = _owned(status, "serving", "recovering")
    state["stalled"] = status["stalled"]
    state["ready"] = state["ready"] and not status["stalled"]
    return state


add_readiness(app, "conversation_writer", writer_readiness)
add_readiness(app, "fanout_coordinator", fanout_readiness)
install_status_page(app, "/writer", _running)
install_status_page(app, "/fanout", _fanout)
install_metrics_page(app, "/metrics", lambda: registry)
