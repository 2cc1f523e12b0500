"""Transient frames onto this node's sockets (spec 13.2): TYPING relays from the writer.

A :class:`~qim.schemas.records.transient.TypingRelay` arrives on one of this node's
ConnectionShards (``qim.to-gateway``, explicit partition, the way replies and PushBatches
come); every live connection of each named user gets the downlink
``TYPING{conversation_id, user_id, expires_in_ms}`` with request_id 0 on its stream. Nothing is
queued for later or stored: a device not connected here now simply misses it (13.2: online
connections only), and a DEGRADED connection is skipped, transient frames being the first
dropped there (11.3).
"""

from __future__ import annotations

from qim.core.push import FlowState
from qim.gateway.actions import Send
from qim.gateway.devices import DeviceRegistry
from qim.gateway.transport.connection import Connection
from qim.schemas.frames.control import TypingDown
from qim.schemas.records.transient import TypingRelay

__all__ = ["deliver_typing"]


def deliver_typing(relay: TypingRelay, registry: DeviceRegistry[Connection]) -> int:
    """Write the relay's TYPING to its recipients' live connections; how many were written."""
    body = TypingDown(
        conversation_id=relay.conversation_id,
        user_id=relay.user_id,
        expires_in_ms=relay.expires_in_ms,
    )
    written = 0
    for user in relay.recipients:
        if user == relay.user_id:  # never to the typist's own devices (13.2), whatever came in
            continue
        for slot in registry.devices(relay.tenant_id, user).values():
            conn = slot.conn
            session = conn.session
            if session.grant is None or conn.closing or session.closed:
                continue
            if session.flow_state is FlowState.DEGRADED:
                continue
            conn.apply([Send(body, request_id=0, version=session.version)])
            written += 1
    return written
