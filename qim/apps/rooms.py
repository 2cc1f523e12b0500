"""The rooms app: the RoomWriter (spec 14).

Run with `faust -A qim.apps.rooms worker`. The RoomWriter is a service of this app
(``qim.agents.rooms.writer``): its own consumer group ``qim-room-writers`` on
``qim.room-requests``, RoomRecords to ``qim.room-log``, replies and one broadcast per
ConnectionShard to ``qim.to-gateway``, the room definitions read from ``qim.rooms``. No tables:
a room's log is lossy by design (7.12, "must not be a Faust table").

Pages: ``/rooms`` shows the partitions this worker owns; ``/metrics`` its series;
``/healthz`` is ready once the definitions are read and every assigned partition is served.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from qim.agents.rooms.writer import RoomWriterOptions, RoomWriterService
from qim.apps.base import (
    RunningService,
    add_readiness,
    install_metrics_page,
    install_status_page,
    kafka_bootstrap,
    make_app,
)
from qim.params import Settings

app = make_app("qim-rooms")
registry = CollectorRegistry()

_running: RunningService[RoomWriterService] = RunningService()


@app.service
class RoomWriter(RoomWriterService):
    """The RoomWriter of the room partitions the group gives this worker."""

    def __init__(self, **kwargs: Any) -> None:
        options = RoomWriterOptions.load(Settings.load(), bootstrap=kafka_bootstrap())
        super().__init__(options, registry=registry, **kwargs)
        _running.service = self


def room_writer_readiness() -> dict[str, Any]:
    service = _running.service
    if service is None:
        return {"ready": False, "started": False}
    status = service.status()
    assigned, serving = set(status["assigned"]), set(status["serving"])
    return {
        "ready": bool(assigned)
        and assigned <= serving
        and bool(status["lease_valid"])
        and bool(status["definitions_caught_up"]),
        "assigned": len(assigned),
        "serving": len(serving),
        "waiting": sorted(assigned - serving),
    }


add_readiness(app, "room_writer", room_writer_readiness)
install_status_page(app, "/rooms", _running)
install_metrics_page(app, "/metrics", lambda: registry)
