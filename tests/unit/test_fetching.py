"""The hot consumers' fetch settings: defaults, the environment, refusals (issue 13)."""

from __future__ import annotations

import pytest

from qim.streams.fetching import FETCH_MAX_WAIT_MS, FETCH_MIN_BYTES, hot_fetch


def test_without_the_environment_the_kafka_defaults_apply() -> None:
    assert hot_fetch({}) == {"fetch_min_bytes": FETCH_MIN_BYTES, "fetch_max_wait_ms": 100}
    assert FETCH_MAX_WAIT_MS == 100


def test_the_environment_sets_both_values() -> None:
    env = {"QIM_FETCH_MIN_BYTES": "16384", "QIM_FETCH_MAX_WAIT_MS": "10"}
    assert hot_fetch(env) == {"fetch_min_bytes": 16384, "fetch_max_wait_ms": 10}


@pytest.mark.parametrize(
    "env",
    [{"QIM_FETCH_MIN_BYTES": "0"}, {"QIM_FETCH_MAX_WAIT_MS": "-1"}, {"QIM_FETCH_MIN_BYTES": "x"}],
)
def test_nonsense_values_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        hot_fetch(env)
