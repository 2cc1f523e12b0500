"""One PushBatch onto this node's sockets (11.1.1), encoding the shared body once (10.3).

Why here and not per connection: :func:`~qim.core.push.expand_batch` builds the batch's
common fragment (message coordinates + ``common_encoded_body``, referenced, never decoded)
exactly once, and every connection's :class:`~qim.core.push.PendingPush` points at that same
object; a socket only splices its personal fragment and its frame header around it
(:mod:`~qim.gateway.session_push`, :mod:`~qim.gateway.transport.sendbuf`). ``body_encode_count``
counts the distinct common fragments of a batch's deliveries -- measured, not assumed: a change that
re-encoded per socket would show up as more than one (26.3, I-19).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from qim.core.push import Expansion, LocalConnection, expand_batch
from qim.gateway.actions import SendPush
from qim.gateway.push.metrics import PushMetrics
from qim.schemas.records.push import PushBatch

if TYPE_CHECKING:
    from qim.gateway.transport.connection import Connection

__all__ = ["deliver_push_batch"]


def deliver_push_batch(
    batch: PushBatch,
    live: Mapping[str, LocalConnection],
    connections: Mapping[str, Connection],
    now_ms: int,
    metrics: PushMetrics | None = None,
) -> Expansion:
    """Expand ``batch`` against ``live`` and feed each delivery to its connection."""
    expansion = expand_batch(batch, live)
    written = 0
    for delivery in expansion.deliveries:
        conn = connections[delivery.connection_id]
        actions = conn.session.push(delivery.pending, now_ms)
        written += sum(1 for action in actions if isinstance(action, SendPush))
        conn.apply(actions)
    if metrics is not None:
        encodes = len({id(d.pending.common) for d in expansion.deliveries})
        metrics.on_batch(encodes=encodes, sockets=written, created_at_ms=batch.created_at)
    return expansion
