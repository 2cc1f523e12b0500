"""Heartbeat settings and what PONG tells the client (§15.1), as plain data.

The loop itself lives in :class:`~qim.client.QimClient`: every ``next_ping_interval_ms`` (from
AUTH_OK, then from each PONG) it sends PING; without a PONG within ``ping_probe_timeout``
(3 s) it sends ``PING{probe=true}``, and without a PONG to that either the link is declared
dead and the connection closed (§15.1.2 / §15.1.4). Tests disable the loop or shorten it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from qim.schemas.frames import AuthOk, Pong

__all__ = ["PING_INTERVAL_INITIAL_MS", "HeartbeatConfig", "HeartbeatState"]

PING_INTERVAL_INITIAL_MS: Final = 60_000  # B ping_interval_initial, when AUTH_OK gives none


@dataclass(frozen=True, slots=True)
class HeartbeatConfig:
    """``interval_s`` overrides the server's interval; ``enabled=False`` sends no PING."""

    enabled: bool = True
    interval_s: float | None = None
    pong_timeout_s: float = 3.0  # ping_probe_timeout
    network_type: str = ""


@dataclass(slots=True)
class HeartbeatState:
    """The latest values the server sent; read by the application, written by the client."""

    next_ping_interval_ms: int = PING_INTERVAL_INITIAL_MS
    idle_timeout_ms: int = 0
    last_pushed_user_seq: int = 0
    mailbox_dirty: bool = False  # PONG says pushes were dropped: PULL_MAILBOX again (A.6 #4)
    pongs: int = 0
    last_rtt_ms: int | None = None
    server_time_offset_ms: int | None = None  # server_time - midpoint of the round trip

    def on_auth_ok(self, auth_ok: AuthOk) -> None:
        if auth_ok.next_ping_interval_ms:
            self.next_ping_interval_ms = auth_ok.next_ping_interval_ms

    def on_pong(self, pong: Pong, now_ms: int) -> None:
        self.pongs += 1
        if pong.next_ping_interval_ms:
            self.next_ping_interval_ms = pong.next_ping_interval_ms
        if pong.idle_timeout_ms:
            self.idle_timeout_ms = pong.idle_timeout_ms
        self.last_pushed_user_seq = pong.last_pushed_user_seq
        self.mailbox_dirty = pong.mailbox_dirty
        if pong.echo_client_time and pong.echo_client_time <= now_ms:
            self.last_rtt_ms = now_ms - pong.echo_client_time
            midpoint = pong.echo_client_time + self.last_rtt_ms // 2
            self.server_time_offset_ms = pong.server_time - midpoint
