"""Every `qim` command agrees with the local stack's partition counts (issue 13, decision 22).

`qim up` records the counts its topics get; a command run from a shell adopts them unless it
targets another Kafka, refuses a variable that contradicts them, and `qim up` refuses to reuse a
stack folder with other counts (its topics keep their partitions).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qim.devstack.stack import (
    LOCAL_PARTITION_COUNTS,
    PARTITION_ENV,
    Stack,
    StackConfig,
    adopt_local_stack,
    default_partition_counts,
    local_partition_counts,
    recorded_partitions,
)
from qim.params import Settings

_VARS = tuple(PARTITION_ENV.values())


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (*_VARS, "QIM_KAFKA_BOOTSTRAP"):
        monkeypatch.delenv(var, raising=False)


def _recorded_stack(base: Path, counts: dict[str, int]) -> StackConfig:
    cfg = StackConfig(base_dir=base, partition_counts={**counts, "single_partition": 1})
    Stack(cfg).record_partitions()
    return cfg


def test_the_local_stack_defaults_differ_from_the_parameters_and_respect_spec_5_2() -> None:
    counts = local_partition_counts()
    assert {k: counts[k] for k in LOCAL_PARTITION_COUNTS} == LOCAL_PARTITION_COUNTS
    assert counts["connection_shard_count"] % counts["mailbox_shard_count"] == 0
    params = Settings.load()
    assert counts["mailbox_shard_count"] != params.mailbox_shard_count
    # the test suite's private stacks keep the parameters' defaults
    test_cfg = StackConfig().for_tests(Path("/nonexistent"))
    assert test_cfg.partition_counts == default_partition_counts()
    assert test_cfg.partition_counts["mailbox_shard_count"] == params.mailbox_shard_count


def test_every_process_of_the_stack_gets_the_counts_in_its_environment(tmp_path: Path) -> None:
    env = StackConfig(base_dir=tmp_path).env()
    assert env["QIM_MAILBOX_SHARD_COUNT"] == str(LOCAL_PARTITION_COUNTS["mailbox_shard_count"])
    assert env["QIM_CONNECTION_SHARD_COUNT"] == str(
        LOCAL_PARTITION_COUNTS["connection_shard_count"]
    )
    assert env["QIM_CONVERSATION_PARTITION_COUNT"] == str(
        LOCAL_PARTITION_COUNTS["conversation_partition_count"]
    )
    loaded = Settings.load(env=env)
    assert loaded.mailbox_shard_count == LOCAL_PARTITION_COUNTS["mailbox_shard_count"]


def test_a_command_adopts_the_recorded_counts_of_the_stack_it_targets(tmp_path: Path) -> None:
    counts = {
        "conversation_partition_count": 2,
        "mailbox_shard_count": 4,
        "connection_shard_count": 8,
    }
    cfg = _recorded_stack(tmp_path, counts)
    rec = recorded_partitions(tmp_path)
    assert rec == {"counts": counts, "bootstrap": cfg.kafka.bootstrap}
    environ: dict[str, str] = {}
    adopt_local_stack(tmp_path, environ)
    assert environ == {PARTITION_ENV[k]: str(v) for k, v in counts.items()}
    same_kafka = {"QIM_KAFKA_BOOTSTRAP": cfg.kafka.bootstrap}
    adopt_local_stack(tmp_path, same_kafka)
    assert same_kafka["QIM_MAILBOX_SHARD_COUNT"] == "4"


def test_a_command_aimed_at_another_kafka_ignores_the_local_stack(tmp_path: Path) -> None:
    _recorded_stack(tmp_path, dict(LOCAL_PARTITION_COUNTS))
    environ = {"QIM_KAFKA_BOOTSTRAP": "127.0.0.1:1"}
    adopt_local_stack(tmp_path, environ)
    assert environ == {"QIM_KAFKA_BOOTSTRAP": "127.0.0.1:1"}


def test_a_contradicting_variable_is_refused_with_both_values(tmp_path: Path) -> None:
    _recorded_stack(tmp_path, dict(LOCAL_PARTITION_COUNTS))
    with pytest.raises(ValueError, match=r"QIM_MAILBOX_SHARD_COUNT=64.*created with 8"):
        adopt_local_stack(tmp_path, {"QIM_MAILBOX_SHARD_COUNT": "64"})


def test_no_recorded_stack_changes_nothing(tmp_path: Path) -> None:
    environ = {"QIM_MAILBOX_SHARD_COUNT": "64"}
    adopt_local_stack(tmp_path, environ)
    assert environ == {"QIM_MAILBOX_SHARD_COUNT": "64"}


def test_qim_up_refuses_other_counts_for_an_existing_stack_folder(tmp_path: Path) -> None:
    _recorded_stack(tmp_path, dict(LOCAL_PARTITION_COUNTS))
    (tmp_path / "kafka").mkdir()  # its topics exist
    other = {**LOCAL_PARTITION_COUNTS, "mailbox_shard_count": 16, "connection_shard_count": 32}
    with pytest.raises(RuntimeError, match="keep their partitions"):
        _recorded_stack(tmp_path, other)
    assert json.loads((tmp_path / "partitions.json").read_text())["counts"] == dict(
        LOCAL_PARTITION_COUNTS
    )
    _recorded_stack(tmp_path, dict(LOCAL_PARTITION_COUNTS))  # the same counts: fine


def test_an_invalid_local_override_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QIM_MAILBOX_SHARD_COUNT", "8")
    monkeypatch.setenv("QIM_CONNECTION_SHARD_COUNT", "12")  # not a multiple, not a power of 2
    with pytest.raises(Exception, match="connection_shard_count"):
        local_partition_counts()
