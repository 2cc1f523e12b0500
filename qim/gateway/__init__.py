"""ConnectionNode: the client-facing gateway (spec §5.1, §5.3-5.4, §15, §20.1, App. A).

Layers, pure first:

* ``states`` / ``session`` / ``login`` / ``actions``: one connection as a sans-I/O object
  (bytes and time in, actions out), its lifecycle as a transition table; ``sync_barrier``:
  the login-sync barrier of a session (served ranges, SYNC_COMPLETE -> ONLINE_READY, §9.3.4);
* ``session_push`` (a session's online pushes: raw PUSH_EVENTS out, ledger drained only
  when bytes left the socket, 11.3), ``sendbuf`` (what is really pending in a send buffer),
  ``budget`` (the node's send-buffer budget, 11.3.3), ``push_delivery`` (a PushBatch onto
  the sockets, shared body encoded once, 10.3);
* ``outbound`` (stream scheduling), ``devices`` (replacement, device cap), ``admission``
  (per-IP rate), ``wheel`` (lazy timeouts), ``presence`` (the PresenceEntry record),
  ``windows`` (windowed metrics): pure rules, time as an argument;
* ``routing`` (frame -> conversation-request envelope and partition) and ``replies`` (a
  to-gateway record -> the connection and frame it is for): pure;
* ``connection``, ``ws``, ``tcp``, ``listeners``, ``node``, ``logins``, ``presence_writer``,
  ``forwarder`` (requests to Kafka), ``router`` (ConversationRouter: requests out, replies in),
  ``mailbox_requests`` (login sync's user requests to the MailboxNode, its replies back),
  ``metrics``, ``push_metrics``, ``routing_metrics``, ``cli``: the thin I/O around them.

``ownership`` (Kafka group ownership of ConnectionShards) plugs into the ``Ownership`` seam.
"""

from qim.gateway.actions import Action, Authenticate, Close, CloseReason, Count, Forward, Send
from qim.gateway.admission import ConnectAdmission, Refusal
from qim.gateway.auth_memory import MemoryAuthenticator
from qim.gateway.config import GatewayConfig
from qim.gateway.devices import Admission, DeviceRegistry, Kick
from qim.gateway.metrics import GatewayMetrics
from qim.gateway.node import ConnectionNode
from qim.gateway.ports import (
    Authenticator,
    AuthGrant,
    AuthRejected,
    AuthRequest,
    MailboxLogin,
    OwnAll,
    Ownership,
    PresenceSink,
    RouteToken,
)
from qim.gateway.presence_writer import KafkaPresenceWriter, MemoryPresence
from qim.gateway.routing.forwarder import RequestForwarder, RequestProducer
from qim.gateway.routing.mailbox_requests import MailboxRequests
from qim.gateway.routing.replies import ReplyVerdict, resolve_reply
from qim.gateway.routing.router import ConversationRouter, ReplySource
from qim.gateway.routing.rules import Routed, route_frame
from qim.gateway.session import Session, SessionConfig
from qim.gateway.states import TRANSITIONS, ConnState, Event, IllegalTransition
from qim.gateway.sync_barrier import LoginBarrier
from qim.gateway.transport.connection import Connection, Transport
from qim.gateway.transport.outbound import OutboundQueue
from qim.gateway.wheel import TimingWheel
from qim.schemas.records.presence import (
    PresenceEntry,
    PresenceKey,
    decode_presence,
    encode_presence,
)

__all__ = [
    "TRANSITIONS",
    "Action",
    "Admission",
    "AuthGrant",
    "AuthRejected",
    "AuthRequest",
    "Authenticate",
    "Authenticator",
    "Close",
    "CloseReason",
    "ConnState",
    "ConnectAdmission",
    "Connection",
    "ConnectionNode",
    "ConversationRouter",
    "Count",
    "DeviceRegistry",
    "Event",
    "Forward",
    "GatewayConfig",
    "GatewayMetrics",
    "IllegalTransition",
    "KafkaPresenceWriter",
    "Kick",
    "LoginBarrier",
    "MailboxLogin",
    "MailboxRequests",
    "MemoryAuthenticator",
    "MemoryPresence",
    "OutboundQueue",
    "OwnAll",
    "Ownership",
    "PresenceEntry",
    "PresenceKey",
    "PresenceSink",
    "Refusal",
    "ReplySource",
    "ReplyVerdict",
    "RequestForwarder",
    "RequestProducer",
    "RouteToken",
    "Routed",
    "Send",
    "Session",
    "SessionConfig",
    "TimingWheel",
    "Transport",
    "decode_presence",
    "encode_presence",
    "resolve_reply",
    "route_frame",
]
