"""What a MailboxNode knows about one user, for ``qim user show`` (the ``/mailbox/user`` page).

The user's MailboxShard and lane (5.2, 6.5.1), whether this node owns the shard, the lane's
watermark ``W[lane]`` with the floor it must reach before it is served (direction.md 4.1), the
devices the presence cache holds (the compacted presence topic as this node applied it), and
the cursor positions the server knows. A device's mailbox cursor lives on the device (6.8);
what the server holds are the bounds a cursor is judged against: the lane watermark a login
would sync to, the user's effective trim (a cursor below it is CURSOR_EXPIRED) and the first
and last ``mailbox_seq`` of the user's entries. Reads only; nothing here changes the store.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from qim.agents.mailbox.presence import NodePresence
from qim.agents.mailbox.shard import OwnedShard
from qim.core.mailbox import keys
from qim.core.mailbox.config import MailboxConfig
from qim.core.mailbox.values import decode_u64
from qim.schemas.routing import lane_id
from qim.schemas.seqs import split_mailbox_seq

__all__ = ["user_view"]

_MAX_SCAN = 100_000


def _seq(seq: int) -> dict[str, int]:
    epoch, offset = split_mailbox_seq(seq)
    return {"mailbox_seq": seq, "shard_epoch": epoch, "log_offset": offset}


def user_view(
    owned: Mapping[int, OwnedShard],
    presence: NodePresence,
    config: MailboxConfig,
    tenant_id: str,
    user_id: str,
    now_ms: int,
) -> dict[str, Any]:
    """The JSON body of ``/mailbox/user?tenant=..&user=..``; ``config`` gives the counts."""
    shard_no = config.shard_of(tenant_id, user_id)
    lane = lane_id(tenant_id, user_id, config.lane_count)
    view: dict[str, Any] = {
        "tenant_id": tenant_id,
        "user_id": user_id,
        "mailbox_shard": shard_no,
        "lane_id": lane,
        "owned_here": shard_no in owned,
    }
    shard = owned.get(shard_no)
    if shard is None:
        return view
    w = shard.watermarks[lane]
    served = shard.served_watermark(lane)
    view["lane"] = {
        "watermark": _seq(w),
        "floor": _seq(shard.required[lane]),
        "served": served is not None,
        "shard_serving": shard.serving,
        "shard_epoch": shard.epoch,
    }
    first = last = None
    prefix = keys.user_entry_prefix(tenant_id, user_id)
    for scanned, (key, _) in enumerate(shard.store.scan(prefix, prefix, False), 1):
        seq = keys.parse_entry_key(key).mailbox_seq
        first = seq if first is None else first
        last = seq
        if scanned >= _MAX_SCAN:
            break
    view["cursor_bounds"] = {
        "sync_to": _seq(served) if served is not None else None,
        "effective_trim": _seq(shard.reader.effective_trim(tenant_id, user_id)),
        "first_entry": None if first is None else _seq(first),
        "last_entry": None if last is None else _seq(last),
        "entry_count": decode_u64(shard.store.get(keys.count_key(tenant_id, user_id))),
    }
    cache = presence.cache(shard_no)
    view["presence_ready"] = cache is not None
    view["devices"] = [
        {
            "device_id": d.device_id,
            "node_id": d.node_id,
            "connection_shard": d.connection_shard,
            "session_epoch": d.session_epoch,
            "client_platform": d.client_platform,
            "lease_expire_at": d.lease_expire_at,
        }
        for d in (cache.devices(tenant_id, user_id, now_ms) if cache is not None else ())
    ]
    return view
