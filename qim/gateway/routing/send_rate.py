"""``per_user_msg_rate`` at the ConnectionNode: one bucket per user, across conversations.

Why here (spec 8.2 L1b, 20.4.1 "Enforced at: ConnectionNode"; issue 14 item 6): the writer's
L1b cell is per outbox partition (``qim.core.conversation.admission``), so a user writing to
conversations on P partitions got up to P x 20 msg/s -- one sender reached 320 peers in
0.56 s. Every send of a user passes the node that owns the user's ConnectionShard (a device
that reaches another node gets REDIRECT there), so one in-memory bucket per ``(tenant, user)``
here covers every device and every conversation of the user, with no Redis call per message
(spec 3 item 9) and no second hop. The writer's per-partition limits stay as they are.

A send over the bucket is answered ``ERROR{RATE_LIMITED, retry_after_ms, detail=
"per_user_msg_rate"}`` before anything is produced (20.4.1 rule 1: reject, never accept then
drop); ``retry_after_ms`` is the bucket's refill time of the next token nobody was promised
(``qim.core.ratelimit``). Rate and burst are the B.5 parameters ``per_user_msg_rate`` and
``per_user_msg_rate_burst``, per tenant when ``QIM_TENANT_OVERRIDES`` sets them (as for the
writer). A retry of the same ``client_message_id`` takes a token like any send: the node cannot
tell it from a new message without asking the writer.

Limit, written down: while a ConnectionShard moves to another node (a takeover), the new owner
starts with a full bucket for its users.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from qim.core.ratelimit import Admit, KeyedBuckets
from qim.params import Settings

__all__ = ["UserMsgRate", "tenant_views"]


def tenant_views(settings: Settings, raw: str | None) -> dict[str, Settings]:
    """Per-tenant settings from ``QIM_TENANT_OVERRIDES`` (``{tenant: {param: value}}``)."""
    if not raw:
        return {}
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("QIM_TENANT_OVERRIDES must be a JSON object {tenant: {param: value}}")
    return {tenant: settings.for_tenant(tenant, values) for tenant, values in data.items()}


def _buckets(settings: Settings) -> KeyedBuckets[tuple[str, str]]:
    rate = settings.per_user_msg_rate
    return KeyedBuckets(rate.per_second, int(settings.per_user_msg_rate_burst))


class UserMsgRate:
    """The node's ``per_user_msg_rate`` buckets: the default one, one per overriding tenant."""

    def __init__(self, settings: Settings, tenants: Mapping[str, Settings] | None = None) -> None:
        self._default = _buckets(settings)
        self._tenants = {tenant: _buckets(s) for tenant, s in sorted((tenants or {}).items())}

    def take(self, tenant_id: str, user_id: str, now_ms: int) -> Admit:
        """Admit one send of the user at ``now_ms`` (taking a token) or refuse it."""
        buckets = self._tenants.get(tenant_id, self._default)
        return buckets.take((tenant_id, user_id), now_ms)
