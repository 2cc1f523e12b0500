"""A Redis 7 server from Debian's package, on loopback, with its own folder and AOF on.

Redis holds only auth and session state (session_epoch counters, token revocation, route
tokens): it is used at login, never on the per-message path (design rule, spec section 3 item 9).
"""

from __future__ import annotations

import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from qim.devstack import procs


@dataclass(frozen=True)
class RedisConfig:
    base_dir: Path
    port: int = 16379

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid_file(self) -> Path:
        return self.base_dir / "redis.pid"

    @property
    def log_file(self) -> Path:
        return self.base_dir / "redis.out"


def _conf(cfg: RedisConfig) -> str:
    return f"""\
bind 127.0.0.1
protected-mode yes
port {cfg.port}
daemonize no
dir {cfg.base_dir / "data"}
appendonly yes
appendfsync everysec
appendfilename "qim.aof"
save ""
logfile ""
"""


def server_conf(cfg: RedisConfig) -> str:
    """The server's ``redis.conf``; the suite's container backend reuses it."""
    return _conf(cfg)


def ping(port: int, timeout_s: float = 0.5) -> bool:
    """A raw RESP PING, so readiness needs no client library."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start(cfg: RedisConfig, *, timeout_s: float = 20.0) -> None:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError(
            "redis-server is not installed: scripts/bootstrap.sh installs Debian's redis-server"
        )
    (cfg.base_dir / "data").mkdir(parents=True, exist_ok=True)
    if procs.read_pid(cfg.pid_file) is None:
        if procs.port_open("127.0.0.1", cfg.port):
            raise RuntimeError(f"port {cfg.port} is taken by a process this stack did not start")
        conf = cfg.base_dir / "redis.conf"
        conf.write_text(_conf(cfg))
        procs.spawn([binary, str(conf)], pid_file=cfg.pid_file, log_file=cfg.log_file)
    pid = procs.read_pid(cfg.pid_file)
    try:
        procs.wait_until(
            lambda: ping(cfg.port),
            timeout_s=timeout_s,
            what="Redis PING",
            alive=lambda: pid is not None and procs.pid_alive(pid),
        )
    except (TimeoutError, RuntimeError) as exc:
        raise RuntimeError(f"Redis did not start: {exc}\n{procs.tail(cfg.log_file)}") from exc


def is_running(cfg: RedisConfig) -> bool:
    return procs.read_pid(cfg.pid_file) is not None


def stop(cfg: RedisConfig) -> bool:
    # SIGTERM makes Redis flush the AOF and exit cleanly.
    return procs.stop_pid(cfg.pid_file, timeout_s=15.0)
