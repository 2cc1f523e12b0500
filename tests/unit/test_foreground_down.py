"""`qim down` from a second terminal stops a foreground `qim up` (README, issue 14 item 7).

The foreground process records its pid; ``stop_foreground`` sends it SIGTERM (its Ctrl-C) and
waits until it has exited, because only it can reap the services it started.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from qim.devstack.procs import FOREGROUND_PID, pid_alive, stop_foreground

_FOREGROUND = """
import signal, sys, threading
from pathlib import Path
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
Path(sys.argv[1]).write_text("ready")
stop.wait()
Path(sys.argv[1]).write_text("stopped its stack")
"""


def test_qim_down_asks_the_foreground_stack_to_stop_and_waits_for_it(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", _FOREGROUND, str(marker)])
    try:
        while (marker.read_text() if marker.exists() else "") != "ready":
            if proc.poll() is not None:
                raise AssertionError("the stand-in exited early")
        (tmp_path / FOREGROUND_PID).write_text(f"{proc.pid}\n")
        assert stop_foreground(tmp_path, timeout_s=30) == proc.pid
        assert marker.read_text() == "stopped its stack"
        assert not pid_alive(proc.pid)
        assert not (tmp_path / FOREGROUND_PID).exists()
        assert stop_foreground(tmp_path) is None  # nothing in the foreground any more
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
