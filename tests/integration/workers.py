"""Run a real `faust worker` process in a test and wait on its readiness, never on sleeps."""

from __future__ import annotations

import json
import os
import shutil
import signal
import urllib.request
from pathlib import Path
from typing import Any

from qim.devstack import procs
from qim.devstack.stack import ROOT, Stack, wait_worker_ready, worker_argv, worker_health


class FaustWorker:
    """One worker of `module` with its own datadir and web port, stopped by `stop()`."""

    def __init__(self, stack: Stack, module: str, workdir: Path, env: dict[str, str]) -> None:
        self.stack = stack
        self.module = module
        self.workdir = workdir
        self.env = env
        self.web_port = procs.free_port()
        self.pid_file = workdir / "worker.pid"
        self.log_file = workdir / "worker.log"

    @property
    def datadir(self) -> Path:
        return self.workdir / "data"

    def start(self, timeout_s: float = 120.0) -> None:
        argv = worker_argv(self.module, self.datadir, self.web_port)
        env = {**os.environ, **self.stack.cfg.env(), **self.env}
        pid = procs.spawn(argv, pid_file=self.pid_file, log_file=self.log_file, cwd=ROOT, env=env)
        wait_worker_ready(
            self.web_port, pid, self.log_file, timeout_s=timeout_s, what=f"{self.module} ready"
        )

    def stop(self) -> None:
        procs.stop_pid(self.pid_file, timeout_s=30.0)

    def kill(self) -> None:
        """SIGKILL: no shutdown hook, no last commit or flush; returns once the pid is gone."""
        pid = procs.read_pid(self.pid_file)
        assert pid is not None, f"{self.module} is not running"
        os.kill(pid, signal.SIGKILL)
        procs.wait_until(lambda: not procs.pid_alive(pid), timeout_s=10, what=f"{pid} dead")

    def wipe_state(self) -> None:
        """Delete the local RocksDB stores, so only the changelog can bring the state back."""
        shutil.rmtree(self.datadir, ignore_errors=True)

    def health(self) -> dict[str, Any]:
        """The `/healthz` body, whether it says ready (200) or not (503)."""
        h = worker_health(self.web_port)
        assert h is not None, f"worker on {self.web_port} does not answer /healthz"
        return h

    def log_tail(self, lines: int = 80) -> str:
        return f"--- {self.log_file} ---\n{procs.tail(self.log_file, lines)}"

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}{path}", timeout=5) as r:
            return json.loads(r.read())
