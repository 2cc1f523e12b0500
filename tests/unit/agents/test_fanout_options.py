"""FanoutOptions and ``register``: the values the FanoutCoordinator runs with (issue 5).

The group session is the shard lease (direction.md 4.1, B.1 ``shard_lease_ttl``); the routing
and caps are Appendix B's through ``FanoutConfig`` so a replay uses the same ones; ``register``
needs nothing but the app.
"""

from __future__ import annotations

import faust
import pytest

from qim.agents.fanout.coordinator import FanoutCoordinatorService, register
from qim.agents.fanout.options import GROUP_ID, FanoutOptions
from qim.core.fanout import FanoutConfig
from qim.params import Settings
from qim.streams.topics import DISPATCH, OUTBOX, WRITER_SNAPSHOTS


def test_options_take_the_lease_and_the_appendix_b_values() -> None:
    settings = Settings.load(env={})
    opts = FanoutOptions.from_settings(settings, bootstrap="h:1")
    assert opts.session_timeout_ms == settings.shard_lease_ttl
    assert 0 < opts.heartbeat_interval_ms <= settings.shard_lease_ttl // 3
    assert opts.config == FanoutConfig.from_settings(settings)
    assert (opts.group_id, opts.outbox_topic, opts.dispatch_topic, opts.snapshots_topic) == (
        GROUP_ID,
        OUTBOX.name,
        DISPATCH.name,
        WRITER_SNAPSHOTS.name,
    )
    assert FanoutOptions.from_settings(settings, bootstrap="h:1", max_records=7).max_records == 7


def test_options_refuse_empty_batches() -> None:
    with pytest.raises(ValueError):
        FanoutOptions(bootstrap="h:1", max_records=0)


async def test_register_builds_the_service_from_the_apps_broker_list() -> None:
    app = faust.App("fanout-register-test", broker="kafka://h1:9092;kafka://h2:9093")
    cls = register(app)
    service = cls()
    assert isinstance(service, FanoutCoordinatorService)
    assert service.options.bootstrap == "h1:9092,h2:9093"
    assert service.options.session_timeout_ms == Settings.load().shard_lease_ttl
