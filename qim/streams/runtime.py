"""Which asyncio event loop every long-running qim process runs on.

uvloop by default: its transports make fewer syscalls and cost less per callback than the
selector loop's pure-Python ones, and a profile of the send path put a third of the writer's
samples in ``_SelectorSocketTransport.write`` (bench/README.md, issue 13). ``QIM_EVENT_LOOP=aio``
selects the standard loop (the A/B runs compare the two with the same code). Faust workers get
the same choice through ``faust --loop`` (``qim.devstack.stack.worker_argv``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")

EventLoopName = Literal["aio", "uvloop"]
EVENT_LOOP_ENV = "QIM_EVENT_LOOP"


def event_loop_name(environ: dict[str, str] | None = None) -> EventLoopName:
    """``QIM_EVENT_LOOP`` (``aio`` or ``uvloop``, default ``uvloop``); anything else is refused."""
    value = (os.environ if environ is None else environ).get(EVENT_LOOP_ENV, "uvloop")
    if value not in ("aio", "uvloop"):
        raise ValueError(f"{EVENT_LOOP_ENV} must be 'aio' or 'uvloop', not {value!r}")
    return "aio" if value == "aio" else "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on the configured loop."""
    if event_loop_name() == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)
    return asyncio.run(main)
