"""Detached child processes with pid files: the one mechanism every local service uses.

Each service writes its pid into its own run folder, so `qim down` (or a crashed test run's next
start) can find and stop exactly what it started, and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final


def read_pid(pid_file: Path) -> int | None:
    """The pid recorded in `pid_file` if that process is still alive."""
    try:
        pid = int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); reap it if it is ours.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def spawn(
    argv: Sequence[str],
    *,
    pid_file: Path,
    log_file: Path,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """Start `argv` in its own session (so signals to us do not hit it) and record its pid."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
    pid_file.write_text(f"{proc.pid}\n")
    return proc.pid


def stop_pid(pid_file: Path, *, timeout_s: float = 20.0, sig: int = signal.SIGTERM) -> bool:
    """Stop the process behind `pid_file`: `sig` first, SIGKILL after `timeout_s`.

    Returns True when a live process was stopped.
    """
    pid = read_pid(pid_file)
    if pid is None:
        pid_file.unlink(missing_ok=True)
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            break
        time.sleep(0.05)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not pid_alive(pid), timeout_s=5.0, what=f"pid {pid} to die")
    pid_file.unlink(missing_ok=True)
    return True


def wait_until(
    check: Callable[[], bool],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.1,
    alive: Callable[[], bool] | None = None,
) -> None:
    """Poll `check` until true; fail on timeout or when `alive` says the process died."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check():
            return
        if alive is not None and not alive():
            raise RuntimeError(f"process died while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now (for tests' private stacks)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"(no log at {path})"


FOREGROUND_PID: Final = "foreground.pid"
"""Under the stack's base folder: the pid of a ``qim up --foreground`` (``scripts/run``)."""


def stop_foreground(base_dir: Path, *, timeout_s: float = 120.0) -> int | None:
    """Ask a foreground ``qim up`` to stop its stack (SIGTERM = its Ctrl-C) and wait until it
    has exited; the pid it stopped, or None when no foreground stack runs.

    Why not stop its children directly: they are the foreground process's children, so once
    killed they stay zombies until *it* reaps them, and ``kill(pid, 0)`` keeps answering."""
    pid_file = base_dir / FOREGROUND_PID
    pid = read_pid(pid_file)
    if pid is None or pid == os.getpid():
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not pid_alive(pid), timeout_s=timeout_s, what=f"qim up (pid {pid}) to stop")
    pid_file.unlink(missing_ok=True)
    return pid
