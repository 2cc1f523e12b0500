"""The fault plan of ``qim chaos run``: seeded (the same seed, the same run), every special
fault placed, every other slot a kill, each process killed in turn, nothing at or past the end."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from qim.chaos.faults import BrokerRestart, DiskFull, ProcessKill, ProcessPause, RedisRestart
from qim.chaos.soak import SoakParams, plan_faults
from qim.devstack.stack import Stack, StackConfig

PROCESSES = ["conversation-1", "mailbox-1", "notify-1", "gw-1"]
PAUSABLE = ["conversation-1", "mailbox-1"]


def test_the_same_seed_gives_the_same_plan_and_another_seed_may_not() -> None:
    params = SoakParams(duration_s=200, fault_every_s=10, seed=3)
    first = plan_faults(params, PROCESSES, PAUSABLE)
    assert first == plan_faults(params, PROCESSES, PAUSABLE)
    others = {tuple(plan_faults(SoakParams(duration_s=200, fault_every_s=10, seed=s), PROCESSES,
                                PAUSABLE)) for s in range(8)}  # fmt: skip
    assert len(others) > 1


def test_every_slot_inside_the_run_gets_one_fault_with_the_specials_and_kills_in_turn() -> None:
    params = SoakParams(
        duration_s=100, fault_every_s=10, broker_restarts=2, redis_restarts=1, pauses=2
    )
    plan = plan_faults(params, PROCESSES, PAUSABLE)
    times = [t for t, _ in plan]
    assert times == [10.0 * i for i in range(1, 10)]  # 100 itself is the end: no fault there
    kinds = Counter(type(f) for _, f in plan)
    assert kinds[BrokerRestart] == 2 and kinds[RedisRestart] == 1 and kinds[ProcessPause] == 2
    kills = [f.process for _, f in plan if isinstance(f, ProcessKill)]
    assert len(kills) == 4 and sorted(kills) == sorted(PROCESSES)  # each once, in a shuffle
    assert {f.process for _, f in plan if isinstance(f, ProcessPause)} <= set(PAUSABLE)


def test_more_special_faults_than_slots_is_refused() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        plan_faults(SoakParams(duration_s=30, fault_every_s=10, broker_restarts=3), PROCESSES, [])


def test_disk_fulls_go_to_the_disk_limited_workers_only() -> None:
    params = SoakParams(duration_s=100, fault_every_s=10, disk_fulls=2, pauses=0, broker_restarts=0)
    plan = plan_faults(params, PROCESSES, PAUSABLE, ["mailbox-1"])
    assert [f.process for _, f in plan if isinstance(f, DiskFull)] == ["mailbox-1", "mailbox-1"]
    assert not any(isinstance(f, DiskFull) for _, f in plan_faults(params, PROCESSES, PAUSABLE))


def test_a_disk_full_refuses_a_data_dir_on_the_stacks_own_filesystem(tmp_path: Path) -> None:
    stack = Stack(StackConfig(base_dir=tmp_path))
    (tmp_path / "workers" / "mailbox-1" / "data").mkdir(parents=True)
    with pytest.raises(RuntimeError, match="not a filesystem of its own"):
        asyncio.run(DiskFull("mailbox-1").run(stack))
