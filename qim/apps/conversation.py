"""The conversation app: ConversationWriter, GroupMembership, HistoryArchiver.

Run with `faust -A qim.apps.conversation worker`. The ConversationWriter is a service of this
app (``qim.agents.conversation_writer``): its own consumer group ``qim-conversation-writers``
on ``qim.conversation-requests``, one transactional producer per owned partition, and the
MessageStore (RocksDB per partition) under the worker's ``--datadir``. GroupMembership and the
HistoryArchiver run inside it, on the same outbox records. The FanoutCoordinator is a second
service (``qim.agents.fanout_coordinator``, consumer group ``qim-fanout`` on ``qim.outbox``,
read_committed) turning each committed record into one GroupDispatch per target MailboxShard.

``/writer`` shows which partitions this worker owns and serves (tests wait on it; ``/healthz``
only covers Faust's own readiness).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from qim.agents.conversation_writer import ConversationWriterService
from qim.agents.fanout_coordinator import register as register_fanout
from qim.agents.writer_options import WriterOptions
from qim.apps.base import (
    ROCKSDB_OPTIONS,
    RunningService,
    install_status_page,
    kafka_bootstrap,
    make_app,
)
from qim.params import Settings

app = make_app("qim-conversation")
register_fanout(app)


_running: RunningService[ConversationWriterService] = RunningService()


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
        super().__init__(options, **kwargs)
        _running.service = self


install_status_page(app, "/writer", _running)
