"""Configuration of one ConnectionNode: listeners, identity, and the App. B values it uses.

Every timing and limit default comes from :class:`qim.params.Settings` (App. B); the fields
that tests shrink (``unauth_connection_timeout_ms``, ``idle_timeout_ms`` ...) are explicit
overrides, None meaning "the Settings value".
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from qim.core.push import FlowLimits
from qim.gateway.session import SessionConfig
from qim.params import Settings
from qim.schemas.frames import HEADER_SIZE, Limits
from qim.streams.topics import (
    PREKEY_REQUESTS,
    PUSH_TASKS,
    REVOCATIONS,
    ROOM_REQUESTS,
    TO_GATEWAY,
    USER_REQUESTS,
)

__all__ = ["GatewayConfig", "is_loopback"]


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and 'localhost' (plain ws is only allowed there, §15.4.1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class GatewayConfig:
    """One node. Ports: None = listener off, 0 = a free port (tests)."""

    node_id: str
    host: str = "127.0.0.1"
    ws_port: int | None = 0
    tls_port: int | None = None
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None
    certfile: Path | None = None
    keyfile: Path | None = None
    advertised_endpoint: str = ""  # AUTH_OK.preferred_endpoint / REDIRECT.endpoint_hint
    kafka_bootstrap: str | None = None  # None: presence is not published (unit tests)
    presence_topic: str = "qim.presence"
    # Conversation requests (issue 4): off unless asked, so a node can be tested as a pure
    # connection layer; ``qim gateway`` turns it on whenever it has a Kafka bootstrap.
    route_requests: bool = False
    requests_topic: str = "qim.conversation-requests"
    conversation_partition_count: int = 16  # = the topic's partitions, checked at start
    request_linger_ms: int = 2  # producer batching; a send's budget is 150 ms p99 (§24.1.2)
    max_queued_requests: int = 10_000  # beyond it: ERROR{RATE_LIMITED} at once
    # Login sync (issue 5, §9.3): AUTH_OK waits for the MailboxNode's sync fields, PULL_MAILBOX
    # and SYNC_COMPLETE are served. Off unless asked, like routing (a node tested as a pure
    # connection layer has no MailboxNode to ask); ``qim gateway`` turns it on with routing.
    mailbox_sync: bool = False
    user_requests_topic: str = USER_REQUESTS.name
    to_gateway_topic: str = TO_GATEWAY.name  # RTC: the server's own CANCEL to a caller (13.5.3)
    # RTC 13.5.2: an invite for a callee with no online device becomes a ``voip`` PushTask for
    # the NotificationService; "" = none runs: the caller is answered cancel{offline} at once
    push_tasks_topic: str = PUSH_TASKS.name
    # 16.1.2: PUSHED / APPLIED evidence coalesced per device and flushed this often to the
    # user's MailboxShard (well under push_grace_window; not an Appendix B parameter)
    push_evidence_flush_ms: int = 250
    mailbox_sync_timeout_ms: int = 5_000  # no MailboxReply by then: ERROR{SHARD_MOVED} + close
    # a PULL_MAILBOX / PULL_SESSION_LIST with no MailboxReply by then: ERROR{SHARD_MOVED}
    mailbox_request_timeout_ms: int = 10_000
    # E2EE key distribution (issue 23, §22.2): PREKEY_PUBLISH / PREKEY_FETCH to the key worker
    # (``qim.apps.keys``). Off unless asked, like login sync; ``qim gateway`` turns it on with
    # routing. Without it the frames are answered "not offered".
    prekeys: bool = False
    # live revocation (issue 21, 15.3.2): follow qim.revocations and kick the sessions a
    # revocation ends. Off unless asked; ``qim gateway`` turns it on when it has Kafka.
    follow_revocations: bool = False
    revocations_topic: str = REVOCATIONS.name
    prekey_requests_topic: str = PREKEY_REQUESTS.name
    prekey_partition_count: int = 8  # = the topic's partitions, checked at start
    settings: Settings = field(default_factory=Settings.load)
    # per-tenant views (QIM_TENANT_OVERRIDES), for the per-user limits this node enforces
    tenant_settings: Mapping[str, Settings] = field(default_factory=dict)
    unauth_connection_timeout_ms: int | None = None
    next_ping_interval_ms: int | None = None
    idle_timeout_ms: int | None = None
    wheel_tick_ms: int | None = None
    presence_lease_renew_ms: int | None = None
    close_flush_timeout_ms: int = 2_000
    # Flow control (11.3): SO_SNDBUF of accepted sockets (None: the kernel's default). Kept
    # small, the measured send buffer tracks the client and stream 0 is not stuck behind
    # kernel-held push bytes (C11); not an Appendix B parameter.
    socket_send_buffer_bytes: int | None = None
    drain_poll_ms: int = 50  # how often a connection with pending pushes re-reads its buffer
    # 12.6.3: SESSION_DELTA / BADGE_UPDATE held per connection this long (None: the low end of
    # ``session_delta_merge_window``; 0: sent at once, no merge).
    session_delta_merge_window_ms: int | None = None
    # Chatrooms (spec 14): ROOM_* frames and sends into ``r:`` ids go to the RoomWriter. Off
    # unless asked, like routing; ``qim gateway`` turns it on with routing (QIM_ROOMS=0: off).
    rooms: bool = False
    room_requests_topic: str = ROOM_REQUESTS.name
    room_partition_count: int = 4  # = the topic's partitions, checked at start
    # every (room, shard) with a member is renewed this often; the RoomWriter's lease is 3x
    room_target_renew_ms: int = 10_000

    def __post_init__(self) -> None:
        tls = self.certfile is not None and self.keyfile is not None
        if (self.certfile is None) != (self.keyfile is None):
            raise ValueError("certfile and keyfile go together")
        if self.ws_port is not None and not tls and not is_loopback(self.host):
            raise ValueError(
                "plain ws only on loopback: no link without TLS may carry traffic (§15.4.1)"
            )
        if self.tls_port is not None and not tls:
            raise ValueError("the qim/1 TCP listener needs certfile and keyfile (TLS, §20.1)")
        if self.route_requests and not self.kafka_bootstrap:
            raise ValueError("routing conversation requests needs a Kafka bootstrap")
        if self.conversation_partition_count < 1:
            raise ValueError("conversation_partition_count must be positive")
        if self.mailbox_sync and not self.route_requests:
            raise ValueError("mailbox sync rides the request routing: it needs route_requests")
        if self.mailbox_request_timeout_ms < 1:
            raise ValueError("mailbox_request_timeout_ms must be positive")
        if self.prekeys and not self.route_requests:
            raise ValueError("prekey requests ride the request routing: they need route_requests")
        if self.mailbox_sync_timeout_ms < 1:
            raise ValueError("mailbox_sync_timeout_ms must be positive")
        if self.rooms and not self.route_requests:
            raise ValueError("rooms ride the request routing: they need route_requests")
        if (self.session_delta_merge_window_ms or 0) < 0:
            raise ValueError("session_delta_merge_window_ms must be >= 0")

    @property
    def tls(self) -> bool:
        return self.certfile is not None

    @property
    def ping_interval_ms(self) -> int:
        """The ceiling the server issues in PONG/AUTH_OK (§15.1.3); background max by default,
        so a client may climb to any tier of §15.1.2 and the idle cut still covers it."""
        if self.next_ping_interval_ms is not None:
            return self.next_ping_interval_ms
        return int(self.settings.ping_interval_max_background)

    def session_config(self) -> SessionConfig:
        s = self.settings
        unauth = self.unauth_connection_timeout_ms
        idle = self.idle_timeout_ms
        return SessionConfig(
            unauth_timeout_ms=int(s.unauth_connection_timeout) if unauth is None else unauth,
            next_ping_interval_ms=self.ping_interval_ms,
            idle_timeout_ms=(
                s.idle_timeout.for_ping_interval(self.ping_interval_ms) if idle is None else idle
            ),
            frag_assembly_timeout_ms=int(s.frag_assembly_timeout),
            limits=Limits(
                max_frame_bytes=s.max_frame_bytes,
                custom_type_max_bytes=s.custom_type_max_bytes,
                rtc_signal_max_bytes=s.rtc_signal_max_bytes,
                presence_sub_max_targets=s.presence_sub_max_targets,
            ),
            flow=FlowLimits.from_settings(s),
            token_expiry_grace_ms=int(s.token_expiry_grace),
        )

    @property
    def max_message_bytes(self) -> int:
        """Largest WebSocket message: one frame of max_frame_bytes."""
        return HEADER_SIZE + int(self.settings.max_frame_bytes)

    @property
    def wheel_tick(self) -> int:
        tick = self.wheel_tick_ms
        return int(self.settings.heartbeat_wheel_tick) if tick is None else tick

    @property
    def delta_merge_window_ms(self) -> int:
        window = self.session_delta_merge_window_ms
        return self.settings.session_delta_merge_window.low_ms if window is None else window

    @property
    def lease_renew_ms(self) -> int:
        renew = self.presence_lease_renew_ms
        return int(self.settings.presence_lease_renew) if renew is None else renew
