"""The mailbox app: MailboxNode (SessionProjection and badges arrive later).

Run with `faust -A qim.apps.mailbox worker`. The MailboxNode is a service of this app
(``qim.agents.mailbox_node``): its own consumer group ``qim-mailbox-nodes`` on ``qim.dispatch``
and ``qim.user-requests``, one RocksDB per owned MailboxShard under the worker's ``--datadir``
(``<datadir>/mailbox/shard-<n>``), replies on ``qim.to-gateway``.

``/mailbox`` shows which shards this worker owns, serves and how far each has materialized
(tests wait on it; ``/healthz`` only covers Faust's own readiness); ``/mailbox/metrics`` is the
Prometheus exposition of the MailboxNode's registry.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from faust.web import Request, Response, View
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from qim.agents.mailbox_node import MailboxNodeService
from qim.agents.mailbox_options import MailboxOptions
from qim.apps.base import (
    ROCKSDB_OPTIONS,
    RunningService,
    install_status_page,
    kafka_bootstrap,
    make_app,
)
from qim.params import Settings

app = make_app("qim-mailbox")


_running: RunningService[MailboxNodeService] = RunningService()


@app.service
class MailboxNode(MailboxNodeService):
    """The MailboxNode of the shards the group gives this worker."""

    def __init__(self, **kwargs: Any) -> None:
        options = MailboxOptions.load(
            Settings.load(),
            os.environ,
            bootstrap=kafka_bootstrap(),
            datadir=Path(app.conf.datadir),
            store_caps=ROCKSDB_OPTIONS,
        )
        super().__init__(options, **kwargs)
        _running.service = self


install_status_page(app, "/mailbox", _running)


@app.page("/mailbox/metrics")
async def mailbox_metrics(web: View, request: Request) -> Response:
    service = _running.service
    if service is None:
        return web.text("", status=503)
    body = generate_latest(service.registry).decode()
    return web.text(body, content_type=CONTENT_TYPE_LATEST.split(";")[0])
