"""The async Python SDK of the qim client protocol (App. A frames over WebSocket or TLS/TCP).

Usage::

    from qim.client import QimClient, login_and_sync

    # AUTH with the saved cursor, pipelined PULL_MAILBOX, SYNC_COMPLETE -> ONLINE_READY (§9.3)
    result = await login_and_sync(QimClient(), url, access_token, "phone-1", saved_cursor)
    store(result.entries)  # then persist result.cursor (a DeviceCursor, token included)
    async with result.client as client:
        ack = await client.send_message("g:team", b"hello")
        ack = await client.send_direct("bob", b"hi")  # one-to-one: the id is derived
        async for frame in client.events():  # PUSH_EVENTS, KICKED, SESSION_DELTA, ...
            print(frame.name, frame.body)

URL schemes (:mod:`qim.client.dial`): ``ws://``, ``wss://`` (one frame per binary message) and
``qim+tls://host[:443]`` (TLS 1.3, ALPN ``qim/1``, a byte stream of frames). In-process servers
and unit tests use :class:`MemoryNetwork` / :class:`MemoryTransport` through ``dial=``.

The client follows one REDIRECT (presenting its route token, see :mod:`qim.client.auth`),
raises :class:`QimError` for ERROR frames, sends PING every ``next_ping_interval_ms``
(:class:`HeartbeatConfig`), and fails every pending request with
:class:`ConnectionClosedError` when the connection ends. :func:`retry_delay_ms` says how long
to wait before retrying a refused or unanswered request: never earlier than the server's
``retry_after_ms``, jittered, growing on repeated failures, None when a wait cannot help
(:mod:`qim.client.retry`, spec 20.4.1 rule 2).
"""

from qim.client.auth import encode_auth, route_token_of
from qim.client.client import DEFAULT_CLIENT_VERSION, QimClient
from qim.client.correlate import EXPECTED_REPLIES, RequestTable
from qim.client.dial import Dialer, Endpoint, open_transport, parse_url, resolve_hint
from qim.client.errors import (
    ConnectionClosedError,
    IllegalTransition,
    QimClientError,
    QimError,
    RequestTimeout,
    TooManyRedirects,
    TransportClosed,
    TransportError,
    UnexpectedFrame,
)
from qim.client.framing import FramedConnection
from qim.client.heartbeat import HeartbeatConfig, HeartbeatState
from qim.client.identity import Identity, direct_conversation_id, identity_from_token
from qim.client.login import SyncResult, catch_up, login_and_sync
from qim.client.retry import retry_delay_ms
from qim.client.sessions import SessionList
from qim.client.state import TRANSITIONS, ClientEvent, ClientState, ClientStateMachine
from qim.client.sync import DeviceCursor, MailboxSync
from qim.client.timeline import Timeline, TimelineRow, anchor_of
from qim.client.transport import (
    ALPN_QIM,
    MAX_MESSAGE_BYTES,
    MemoryNetwork,
    MemoryTransport,
    TlsTransport,
    Transport,
    WebSocketTransport,
    tls_client_context,
)

__all__ = [
    "ALPN_QIM",
    "DEFAULT_CLIENT_VERSION",
    "EXPECTED_REPLIES",
    "MAX_MESSAGE_BYTES",
    "TRANSITIONS",
    "ClientEvent",
    "ClientState",
    "ClientStateMachine",
    "ConnectionClosedError",
    "DeviceCursor",
    "Dialer",
    "Endpoint",
    "FramedConnection",
    "HeartbeatConfig",
    "HeartbeatState",
    "Identity",
    "IllegalTransition",
    "MailboxSync",
    "MemoryNetwork",
    "MemoryTransport",
    "QimClient",
    "QimClientError",
    "QimError",
    "RequestTable",
    "RequestTimeout",
    "SessionList",
    "SyncResult",
    "Timeline",
    "TimelineRow",
    "TlsTransport",
    "TooManyRedirects",
    "Transport",
    "TransportClosed",
    "TransportError",
    "UnexpectedFrame",
    "WebSocketTransport",
    "anchor_of",
    "catch_up",
    "direct_conversation_id",
    "encode_auth",
    "identity_from_token",
    "login_and_sync",
    "open_transport",
    "parse_url",
    "resolve_hint",
    "retry_delay_ms",
    "route_token_of",
    "tls_client_context",
]
