"""Connection and session frames, opcodes 0x0000-0x00FF (App. A.2).

AUTH, AUTH_OK, PING, PONG, REDIRECT, KICKED, ERROR. Times are Unix epoch milliseconds (u64).
"""

from __future__ import annotations

from qim.schemas.frames.base import U8, U32, U64, Body

__all__ = [
    "Auth",
    "AuthOk",
    "Error",
    "Kicked",
    "MailboxCursor",
    "Ping",
    "Pong",
    "Redirect",
]


class MailboxCursor(Body):
    """§6.8: the signed, opaque token plus the plaintext seq the server checks against W[lane]."""

    token: bytes = b""
    last_applied_mailbox_seq: U64 = 0


class Auth(Body):
    """AUTH (A.3 #1): first frame; header version = the client's highest Vc (§27.1.1)."""

    access_token: str = ""
    device_id: str = ""
    client_version: str = ""
    capabilities: U64 = 0  # Capability bits
    mailbox_cursor: MailboxCursor | None = None  # None = empty cursor (new device, §9.6.1)
    # Not in A.3 #1, but §5.3.2 / §15.2.1 (3) make a redirected client present its route token
    # on the next AUTH. Empty = none and omitted on the wire, so other AUTHs keep A.3's shape.
    route_token: bytes = b""


class AuthOk(Body):
    """AUTH_OK (A.4 #1): absorbs v1 SYNC_REQUIRED/SYNC_EMPTY; header carries Ve."""

    session_epoch: U64 = 0
    lane_id: U8 = 0
    lane_watermark: U64 = 0
    trim_watermark: U64 = 0
    sync_to_seq: U64 = 0
    has_offline: bool = False
    pending_entry_count_hint: U32 = 0
    pending_bytes_hint: U64 = 0
    total_unread: U32 = 0
    total_mention: U32 = 0
    muted_unread: U32 = 0
    badge_projection_mailbox_seq: U64 = 0
    projection_complete: bool = False
    preferred_endpoint: str = ""
    sync_delay_hint_ms: U32 = 0
    next_ping_interval_ms: U32 = 0
    # Not in A.4 #1: the signed MailboxCursor token (6.8) a device keeps and presents in its next
    # AUTH; without a carrier a device could never hold one. Omitted when empty.
    mailbox_cursor_token: bytes = b""


class Ping(Body):
    """PING (A.3 #12): no session_epoch (constant per connection); probe only for metrics."""

    ping_id: U64 = 0
    client_time: U64 = 0
    last_applied_mailbox_seq: U64 = 0
    network_type: str = ""  # e.g. "wifi", "cellular"; free-form for forward compatibility
    probe: bool = False


class Pong(Body):
    """PONG (A.4 #11): carries no watermark of any kind (§6.10.1)."""

    ping_id: U64 = 0
    server_time: U64 = 0
    echo_client_time: U64 = 0
    last_pushed_user_seq: U64 = 0
    mailbox_dirty: bool = False
    next_ping_interval_ms: U32 = 0
    idle_timeout_ms: U32 = 0


class Redirect(Body):
    """REDIRECT (A.4 #12): single-use route token, TTL <= 60 s; ``exp`` in epoch ms."""

    route_token: bytes = b""
    connection_shard: U32 = 0
    endpoint_hint: str = ""
    exp: U64 = 0


class Kicked(Body):
    """KICKED (A.4 #13): reason is one of replaced|admin|banned|token_revoked (kept as str)."""

    reason: str = ""
    replaced_by_device: str | None = None


class Error(Body):
    """ERROR (A.4 #21): the unified error channel.

    ``code`` is an :class:`~qim.schemas.frames.errors.ErrorCode` value but typed ``int`` so an
    unknown code decodes (§27.1.2). ``request_id`` repeats the header's for echo (A.4 lists it
    as a body field). ``retry_after_ms`` is None when absent - the client then falls back to
    reconnect_backoff, which differs from "retry immediately". The extras below are the union
    of A.6's code-specific fields; each code uses only its own (``errors.for_code(c).extras``).
    """

    code: U32 = 0
    retry_after_ms: U32 | None = None
    detail: str = ""
    request_id: U32 = 0
    trim_watermark: U64 | None = None  # CURSOR_EXPIRED
    rebuild_required: bool | None = None  # CURSOR_EXPIRED
    new_cursor: bytes | None = None  # CURSOR_REBASED: the re-signed MailboxCursor token
    replay_from_seq: U64 | None = None  # CURSOR_REBASED
    minimum_client_version: str | None = None  # UPGRADE_REQUIRED
