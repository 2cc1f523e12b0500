"""The mailbox app: MailboxNode (SessionProjection and badges arrive later).

Run with `faust -A qim.apps.mailbox worker`. The MailboxNode is a service of this app
(``qim.agents.mailbox.node``): its own consumer group ``qim-mailbox-nodes`` on ``qim.dispatch``
and ``qim.user-requests``, one RocksDB per owned MailboxShard under the worker's ``--datadir``
(``<datadir>/mailbox/shard-<n>``), replies on ``qim.to-gateway``.

Pages: ``/mailbox`` shows which shards this worker owns, serves and how far each has
materialized; ``/metrics`` is the Prometheus exposition of the MailboxNode's registry
(``/mailbox/metrics`` the same, kept for existing scrapers); ``/mailbox/user?tenant=&user=``
is what the node knows about one user (``qim user show``); ``/healthz`` is ready once every
owned shard was taken over and every lane reached its floor (per shard in the body).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from faust.web import Request, Response, View

from qim.agents.mailbox.node import MailboxNodeService
from qim.agents.mailbox.options import MailboxOptions
from qim.agents.mailbox.user import user_view
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


def mailbox_readiness() -> dict[str, Any]:
    """Ready: shards owned, each taken over (serving) with no lane below its floor; the body
    lists the owned shards and, for each one not ready, whether it serves and which lanes are
    still below their floor (SHARD_MOVED)."""
    service = _running.service
    if service is None:
        return {"ready": False, "started": False}
    owned = sorted(service.owned)
    not_ready = {
        str(p): {"serving": s.serving, "lanes_refused": s.refused()}
        for p, s in sorted(service.owned.items())
        if not s.serving or s.refused()
    }
    return {"ready": bool(owned) and not not_ready, "owned": owned, "not_ready": not_ready}


add_readiness(app, "mailbox_node", mailbox_readiness)
install_status_page(app, "/mailbox", _running)
for _path in ("/metrics", "/mailbox/metrics"):
    install_metrics_page(
        app, _path, lambda: None if _running.service is None else _running.service.registry
    )


@app.page("/mailbox/user")
async def mailbox_user(web: View, request: Request) -> Response:
    service = _running.service
    tenant, user = request.query.get("tenant", ""), request.query.get("user", "")
    if service is None:
        return web.json({"started": False}, status=503)
    if not tenant or not user:
        return web.json({"error": "tenant and user are required"}, status=400)
    config = service.options.config(0)
    try:
        body = user_view(
            service.owned, service.presence, config, tenant, user, int(time.time() * 1000)
        )
    except ValueError as exc:
        return web.json({"error": str(exc)}, status=400)
    return web.json(body)
