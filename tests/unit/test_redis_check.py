"""The AuthService's judgement of its Redis (issue 21, M-6): every unsafe setting is named."""

from __future__ import annotations

from typing import Any

from qim.auth.redis_check import judge_redis

SAFE: dict[str, Any] = {
    "redis_version": "7.0.15",
    "cluster_enabled": 0,
    "maxmemory_policy": "noeviction",
    "aof_enabled": 1,
}


def test_the_suites_kind_of_redis_is_safe() -> None:
    assert judge_redis(SAFE, "") == []
    assert judge_redis({**SAFE, "aof_enabled": 0}, "3600 1") == []  # RDB snapshots suffice


def test_each_unsafe_setting_is_named() -> None:
    bad = {"redis_version": "6.2.14", "cluster_enabled": 1, "maxmemory_policy": "allkeys-lru",
           "aof_enabled": 0}  # fmt: skip
    problems = judge_redis(bad, "")
    assert len(problems) == 4, problems
    text = " ".join(problems)
    for needle in ("6.2.14", "cluster", "allkeys-lru", "appendonly"):
        assert needle in text


def test_without_config_rights_aof_is_required() -> None:
    assert judge_redis(SAFE, None) == []
    (problem,) = judge_redis({**SAFE, "aof_enabled": 0}, None)
    assert "CONFIG is not allowed" in problem
