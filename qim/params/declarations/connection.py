"""B.4 Connection and heartbeat (token parameters are canonical in §15.3)."""

from __future__ import annotations

from qim.params.param import Param
from qim.params.units import DAY, HOUR, MINUTE, SECOND, KiB
from qim.params.values import (
    ExponentialBackoff,
    IdleTimeout,
    LatencyTarget,
    MsRange,
    PingBackoff,
    TcpKeepalive,
)

__all__ = ["ConnectionAndHeartbeat"]


class ConnectionAndHeartbeat:
    """B.4: heartbeat, timeouts, presence leases and tokens."""

    ping_interval_initial = Param(
        "ping_interval_initial",
        60 * SECOND,
        "ms",
        "B.4",
        "Starting heartbeat interval.",
    )
    ping_interval_max_foreground = Param(
        "ping_interval_max_foreground",
        120 * SECOND,
        "ms",
        "B.4",
        "Heartbeat interval ceiling in the foreground.",
    )
    ping_interval_max_background = Param(
        "ping_interval_max_background",
        240 * SECOND,
        "ms",
        "B.4",
        "Heartbeat interval ceiling in the background.",
    )
    ping_interval_step = Param(
        "ping_interval_step",
        30 * SECOND,
        "ms",
        "B.4",
        "Interval increase after 3 consecutive normal PONGs.",
    )
    ping_backoff_factor = Param(
        "ping_backoff_factor",
        PingBackoff(factor=0.8, lock_ms=30 * MINUTE),
        "composite",
        "B.4",
        "Interval shrink after a single missing PONG, then locked.",
    )
    ping_probe_timeout = Param(
        "ping_probe_timeout",
        3 * SECOND,
        "ms",
        "B.4",
        "Death timeout of PING{probe} after a missing PONG (§15.1.2); same after send_ack_timeout.",
    )
    idle_timeout = Param(
        "idle_timeout",
        IdleTimeout(ping_multiplier=2, margin_ms=10 * SECOND),
        "composite",
        "B.4",
        "Server-side idle cut: next_ping_interval × 2 + 10 s.",
    )
    send_ack_timeout = Param(
        "send_ack_timeout",
        3 * SECOND,
        "ms",
        "B.4",
        "No SEND_ACK within this -> active PING{probe}; another 3 s -> link dead.",
    )
    tcp_user_timeout = Param(
        "tcp_user_timeout",
        15 * SECOND,
        "ms",
        "B.4",
        "TCP_USER_TIMEOUT socket option.",
        per_tenant=False,
    )
    tcp_keepalive = Param(
        "tcp_keepalive",
        TcpKeepalive(idle_s=60, interval_s=10, count=3),
        "composite",
        "B.4",
        "Kernel keepalive (TCP_KEEPIDLE / TCP_KEEPINTVL / TCP_KEEPCNT).",
        per_tenant=False,
    )
    unauth_connection_timeout = Param(
        "unauth_connection_timeout",
        10 * SECOND,
        "ms",
        "B.4",
        "Close a connection with no valid AUTH within this (slowloris protection).",
        per_tenant=False,
    )
    takeover_admit_rate = Param(
        "takeover_admit_rate",
        0.05,
        "ratio_per_s",
        "B.4",
        "Share of a shard's target connections a takeover node admits per second.",
        per_tenant=False,
    )
    sync_delay_hint_ms = Param(
        "sync_delay_hint_ms",
        MsRange(low_ms=0, high_ms=30_000),
        "composite",
        "B.4",
        "Random delay hint that staggers post-login pulls.",
    )
    reconnect_backoff = Param(
        "reconnect_backoff",
        ExponentialBackoff(initial_ms=SECOND, factor=1.8, cap_ms=120 * SECOND, jitter=0.3),
        "composite",
        "B.4",
        "Client reconnect backoff.",
    )
    presence_lease_renew = Param(
        "presence_lease_renew",
        10 * SECOND,
        "ms",
        "B.4",
        "Presence lease renewal interval.",
        per_tenant=False,
    )
    presence_lease_ttl = Param(
        "presence_lease_ttl",
        30 * SECOND,
        "ms",
        "B.4",
        "Presence lease TTL.",
        per_tenant=False,
    )
    presence_propagation_target = Param(
        "presence_propagation_target",
        LatencyTarget(percentile=99, max_ms=SECOND),
        "composite",
        "B.4",
        "Presence propagation SLO.",
        per_tenant=False,
    )
    access_token_ttl = Param(
        "access_token_ttl",
        HOUR,
        "ms",
        "B.4",
        "Access token lifetime (§15.3).",
    )
    refresh_token_ttl = Param(
        "refresh_token_ttl",
        30 * DAY,
        "ms",
        "B.4",
        "Refresh token lifetime (§15.3).",
    )
    token_refresh_lead = Param(
        "token_refresh_lead",
        5 * MINUTE,
        "ms",
        "B.4",
        "Proactive renewal this long before expiry.",
    )
    token_expiry_grace = Param(
        "token_expiry_grace",
        5 * MINUTE,
        "ms",
        "B.4",
        "Read-only grace after expiry: PING / PULL_MAILBOX / PULL_HISTORY allowed; "
        "SEND_MESSAGE / MARK_READ / RECALL / EDIT rejected.",
    )
    revocation_propagation_target = Param(
        "revocation_propagation_target",
        LatencyTarget(percentile=99, max_ms=3 * SECOND),
        "composite",
        "B.4",
        "Token revocation propagation SLO.",
        per_tenant=False,
    )
    authz_recheck_interval = Param(
        "authz_recheck_interval",
        5 * MINUTE,
        "ms",
        "B.4",
        "Periodic authorization recheck of a live connection.",
    )
    transport_fallback_step_timeout = Param(
        "transport_fallback_step_timeout",
        5 * SECOND,
        "ms",
        "B.4",
        "Per-step timeout of the client's transport fallback order (§4).",
    )
    transport_choice_cache_ttl = Param(
        "transport_choice_cache_ttl",
        7 * DAY,
        "ms",
        "B.4",
        "Client cache of the last transport that worked (§4).",
    )
    heartbeat_wheel_tick = Param(
        "heartbeat_wheel_tick",
        SECOND,
        "ms",
        "B.4",
        "Heartbeat timing wheel tick (§15.1.4).",
        per_tenant=False,
    )
    heartbeat_wheel_slots = Param(
        "heartbeat_wheel_slots",
        512,
        "count",
        "B.4",
        "Heartbeat timing wheel slots (§15.1.4).",
        per_tenant=False,
    )
    pong_batch_window = Param(
        "pong_batch_window",
        10,
        "ms",
        "B.4",
        "PONGs are written together with other downlink frames within this window (§15.1.4).",
        per_tenant=False,
    )
    stream_scheduling_quantum = Param(
        "stream_scheduling_quantum",
        64 * KiB,
        "bytes",
        "B.4",
        "Multiplexing scheduling slice; larger bodies are fragmented (§15.4).",
        per_tenant=False,
    )
    revocation_record_retention = Param(
        "revocation_record_retention",
        2 * HOUR,
        "ms",
        "B.4",
        "Revocation records are kept access_token_ttl + margin (§15.3.3).",
        per_tenant=False,
    )
