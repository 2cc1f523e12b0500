"""A Faust app that runs only the FanoutCoordinator, on a test's private topics.

``register(app, options)`` is the same call the conversation app makes with default options;
the environment names the test's app id and topic prefix, and may set ``max_records`` (small
rounds, so a SIGKILL lands while a round is in flight).
"""

from __future__ import annotations

import os

from qim.agents.fanout.coordinator import register
from qim.agents.fanout.options import FanoutOptions
from qim.apps.base import kafka_bootstrap, make_app
from qim.core.fanout import FanoutConfig

app = make_app(os.environ["QIM_TEST_APP_ID"])
_name = os.environ["QIM_TEST_FANOUT"]
register(
    app,
    FanoutOptions(
        bootstrap=kafka_bootstrap(),
        config=FanoutConfig(mailbox_shard_count=64),
        group_id=f"{_name}.fanout",
        client_id=_name,
        outbox_topic=f"{_name}.outbox",
        dispatch_topic=f"{_name}.dispatch",
        snapshots_topic=f"{_name}.writer-snapshots",
        max_records=int(os.environ.get("QIM_TEST_FANOUT_MAX_RECORDS", "500")),
    ),
)
