"""JSON log lines and the 24.2 trace id carried through writer -> fanout -> mailbox lines.

The chain test is the light version of the integration test: it feeds one committed message
through the real FanoutCoordinator core (``FanoutState``) and the real trace helpers of each
stage and checks that every line is one JSON object sharing ``trace_id``. It proves the
helpers derive the same id from the records each stage really has; that the services call
them is shown by ``tests/integration/test_observability.py`` on a running stack.
"""

from __future__ import annotations

import io
import json
import logging
import logging.config
from collections.abc import Iterator

import pytest

from qim.agents.trace_lines import committed, dispatched, mailboxed
from qim.core.fanout import FanoutState
from qim.observability.logging import (
    JsonFormatter,
    RepeatFilter,
    json_logging_config,
    sampled,
    trace,
    trace_id_of,
)
from qim.schemas.records import GroupDispatch
from tests.unit.fanout.support import Outbox, run


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter("unit"))
    log = logging.getLogger("qim.test.trace")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield out
    finally:
        log.removeHandler(handler)


def _objects(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_line_is_one_json_object_with_the_fixed_fields(lines: io.StringIO) -> None:
    log = logging.getLogger("qim.test.trace")
    log.warning("plain %s", "text")
    assert trace(log, "traced", percent=100, message_id=b"\x01" * 16, mailbox_shard=3)
    plain, traced = _objects(lines)
    assert set(plain) == {"ts", "level", "process", "logger", "msg"}
    assert plain["level"] == "warning" and plain["msg"] == "plain text"
    assert plain["process"] == "unit" and str(plain["ts"]).endswith("Z")
    assert traced["trace_id"] == "01" * 16 == traced["message_id"]
    assert traced["mailbox_shard"] == 3


def test_trace_refuses_fields_that_are_not_identifiers() -> None:
    log = logging.getLogger("qim.test.trace")
    with pytest.raises(ValueError, match="payload"):
        trace(log, "x", percent=100, message_id=b"\x00" * 16, payload=b"secret")


def test_sampling_is_a_stable_share_of_trace_ids() -> None:
    ids = [trace_id_of(i.to_bytes(16, "big")) for i in range(20_000)]
    picked = [t for t in ids if sampled(t, 1.0)]
    assert 100 < len(picked) < 300  # about 1 %
    assert picked == [t for t in ids if sampled(t, 1.0)]  # every process agrees
    assert all(sampled(t, 100) for t in ids[:50]) and not any(sampled(t, 0) for t in ids[:50])


def test_one_message_keeps_its_trace_id_through_commit_dispatch_and_mailbox(
    lines: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QIM_TRACE_SAMPLE_PERCENT", "100")
    log = logging.getLogger("qim.test.trace")
    outbox = Outbox(shards=64)
    record = outbox.direct("alice", "bob")
    dispatches = run(FanoutState(), [record])
    assert dispatches and all(isinstance(d, GroupDispatch) for d in dispatches)

    committed(log, [(record, 41)])
    dispatched(log, dispatches)
    mailboxed(log, dispatches[0].partition, 1, [(7, dispatches[0])], "node-a")

    got = _objects(lines)
    assert [g["stage"] for g in got] == ["committed"] + ["dispatched"] * len(dispatches) + [
        "mailboxed"
    ]
    assert {g["trace_id"] for g in got} == {trace_id_of(record.message_id)}
    assert got[0]["conversation_seq"] == record.conversation_seq
    assert got[-1]["mailbox_seq"] == (1 << 48) | 7 and got[-1]["mailbox_node_id"] == "node-a"


def test_faust_gets_a_dict_config_with_the_json_formatter() -> None:
    """The formatter entry builds through dictConfig's ``()`` factory, with the process."""
    config = json_logging_config("qim-mailbox")
    configurator = logging.config.DictConfigurator(config)
    formatter = configurator.configure_formatter(dict(config["formatters"]["json"]))
    assert isinstance(formatter, JsonFormatter) and formatter.process == "qim-mailbox"
    assert config["handlers"]["default"]["stream"] == "ext://sys.stdout"


def _record(name: str, msg: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, None, None)


def test_repeat_filter_passes_one_client_line_per_window_and_counts_the_rest() -> None:
    now = [100.0]
    f = RepeatFilter(window_s=1.0, clock=lambda: now[0])
    outage = "Unable to update metadata from [1]"
    assert f.filter(_record("aiokafka", outage))
    held = [f.filter(_record("aiokafka", outage)) for _ in range(500)]
    assert not any(held)
    assert f.filter(_record("aiokafka", "Unable connect to node with id 1"))  # another text
    now[0] += 1.5
    after = _record("aiokafka", outage)
    assert f.filter(after)
    line = json.loads(JsonFormatter("qim-test").format(after))
    assert line["repeated"] == 500
    assert f.filter(_record("aiokafka", outage)) is False


def test_repeat_filter_never_holds_back_qim_lines() -> None:
    f = RepeatFilter(window_s=60.0, clock=lambda: 0.0)
    assert all(f.filter(_record("qim.agents.writer", "same line")) for _ in range(50))


def test_json_logging_config_filters_repeats_on_its_handler() -> None:
    config = json_logging_config("qim-test")
    assert config["handlers"]["default"]["filters"] == ["repeats"]
    assert config["filters"]["repeats"]["()"] is RepeatFilter
