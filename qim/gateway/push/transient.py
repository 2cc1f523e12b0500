"""Transient frames onto this node's sockets (spec 13.2): TYPING and ephemeral-message relays.

A :class:`~qim.schemas.records.transient.TypingRelay` arrives on one of this node's
ConnectionShards (``qim.to-gateway``, explicit partition, the way replies and PushBatches
come); every live connection of each named user gets the downlink
``TYPING{conversation_id, user_id, expires_in_ms}`` with request_id 0 on its stream. Nothing is
queued for later or stored: a device not connected here now simply misses it (13.2: online
connections only), and a DEGRADED connection is skipped, transient frames being the first
dropped there (11.3).

An :class:`~qim.schemas.records.transient.EphemeralRelay` (an ``ephemeral`` custom message,
13.3) becomes ``PUSH_EVENTS{events=[entry], last_pushed_user_seq=0}`` with request_id 0 on the
same connections, the sender's own sending device excepted (its other devices get it: a
message, unlike a typing indicator, is shown on all of the sender's devices). The entry has
``mailbox_seq`` 0 and flags 0, and the frame's ``last_pushed_user_seq`` 0, so no client
cursor, unread count or session row moves. A connection still in its login sync (before
ONLINE_READY) misses it like an offline one: nothing is held for later.
"""

from __future__ import annotations

from qim.core.push import FlowState
from qim.gateway.actions import Send
from qim.gateway.devices import DeviceRegistry
from qim.gateway.transport.connection import Connection
from qim.schemas.frames.control import TypingDown
from qim.schemas.frames.messaging import PushEvents
from qim.schemas.records.transient import EphemeralRelay, TypingRelay

__all__ = ["deliver_ephemeral", "deliver_typing"]


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


def deliver_ephemeral(relay: EphemeralRelay, registry: DeviceRegistry[Connection]) -> int:
    """Write the relay's PUSH_EVENTS to its recipients' live, synced connections (never back
    to the sending device); how many were written."""
    body = PushEvents(events=(relay.entry,))
    written = 0
    for user in relay.recipients:
        for device, slot in registry.devices(relay.tenant_id, user).items():
            if user == relay.sender_id and device == relay.origin_device_id:
                continue
            conn = slot.conn
            session = conn.session
            if session.grant is None or conn.closing or session.closed:
                continue
            if session.flow_state is not FlowState.NORMAL:  # DEGRADED drops transients first
                continue
            if session.sync is not None and not session.sync.released:
                continue  # still before ONLINE_READY: not online yet for a transient
            conn.apply([Send(body, request_id=0, version=session.version)])
            written += 1
    return written
