"""Every long-running process runs on the configured event loop (decision 22): uvloop unless
``QIM_EVENT_LOOP=aio``; Faust workers get the same choice through ``faust --loop``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from qim.devstack.stack import worker_argv
from qim.streams import runtime


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_processes_run_on_uvloop_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(runtime.EVENT_LOOP_ENV, raising=False)
    assert runtime.run(_loop_module()).startswith("uvloop")
    argv = worker_argv("qim.apps.mailbox", Path("/d"), 1)
    assert argv[argv.index("--loop") + 1] == "uvloop"
    assert argv.index("--loop") < argv.index("worker")  # a faust option, not a worker one


def test_qim_event_loop_aio_selects_the_standard_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(runtime.EVENT_LOOP_ENV, "aio")
    assert runtime.run(_loop_module()).startswith("asyncio")
    argv = worker_argv("qim.apps.mailbox", Path("/d"), 1)
    assert argv[argv.index("--loop") + 1] == "aio"


def test_an_unknown_event_loop_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(runtime.EVENT_LOOP_ENV, "trio")
    with pytest.raises(ValueError, match="QIM_EVENT_LOOP"):
        runtime.event_loop_name()
