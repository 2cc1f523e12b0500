"""The MailboxShard's state for the ``mention_only`` tier (spec 10.2.3): activity and heads.

Both are pure functions of the dispatch log, like the rest of the store (direction.md 4.2):

* ``A tenant 00 user -> u64``: the log time of the user's last activity this shard saw -- a
  message it sent (its own dispatch reaches its shard) or a user-state command (MARK_READ, pin,
  mute...), or a login (``ONLINE_ACTION``). A member is *active* while that is within
  ``active_window_days`` of log time; a send, a read or a login moves it into the active set
  at once, so the very next message writes its entry again (AT-42).
* ``H tenant 00 conversation_id -> TierHead``: per conversation, the latest message the shard
  received and its policy -- one write per shard per message, the 10.2.3 "delivered in
  batches per shard" ``delivered_conversation_seq`` of every silent member on the shard.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import msgspec

from qim.core.mailbox.kvstore import Overlay
from qim.core.mailbox.ports import KVReader
from qim.core.mailbox.values import decode_u64, encode_u64
from qim.core.session_list.read_diffusion import TierHead
from qim.schemas.hashing import validate_identifier
from qim.schemas.records.dispatch import GroupDispatch

__all__ = [
    "ACTIVITY",
    "ONLINE_ACTION",
    "TIER_HEAD",
    "activity_key",
    "advance_head",
    "heads_of",
    "is_active",
    "load_head",
    "note_activity",
    "tier_head_key",
]

ONLINE_ACTION: Final = "online"
"""A ``UserStateCommand`` that only says "this user came online" (10.2.3: a come-online moves
a member into the active set at once). The MailboxNode appends one per login of a user who is
an active member of a ``mention_only`` conversation (AUTH_OK ``projection_complete = false``),
so the active set stays a function of the log; it changes no conversation state."""
ACTIVITY: Final = b"A"
TIER_HEAD: Final = b"H"
_HEAD: Final = msgspec.msgpack.Decoder(TierHead)
_ENCODER: Final = msgspec.msgpack.Encoder()


def _text(value: str, name: str) -> bytes:
    validate_identifier(value, name)
    return value.encode("utf-8")


def activity_key(tenant_id: str, user_id: str) -> bytes:
    return ACTIVITY + _text(tenant_id, "tenant_id") + b"\x00" + _text(user_id, "user_id")


def tier_head_key(tenant_id: str, conversation_id: str) -> bytes:
    return TIER_HEAD + _text(tenant_id, "tenant_id") + b"\x00" + _text(conversation_id, "conv")


def note_activity(kv: Overlay, tenant_id: str, user_id: str, at_ms: int) -> None:
    """Raise the user's last activity to ``at_ms`` (log time); never lowers it."""
    key = activity_key(tenant_id, user_id)
    if at_ms > decode_u64(kv.get(key)):
        kv.put(key, encode_u64(at_ms))


def is_active(kv: KVReader, tenant_id: str, user_id: str, now_ms: int, window_ms: int) -> bool:
    last = decode_u64(kv.get(activity_key(tenant_id, user_id)))
    return last > 0 and now_ms - last < window_ms


def load_head(kv: KVReader, tenant_id: str, conversation_id: str) -> TierHead | None:
    raw = kv.get(tier_head_key(tenant_id, conversation_id))
    return None if raw is None else _HEAD.decode(raw)


def advance_head(kv: Overlay, d: GroupDispatch) -> None:
    """Fold a group message's dispatch into its conversation's head on this shard. Written for
    ``mention_only`` messages and, once a head exists, for later ``always`` ones too (so the
    read path sees the conversation return to full writes)."""
    key = tier_head_key(d.tenant_id, d.conversation_id)
    raw = kv.get(key)
    old = None if raw is None else _HEAD.decode(raw)
    if old is None and d.write_policy != "mention_only":
        return
    old = old or TierHead()
    if d.conversation_seq <= old.latest_conversation_seq:
        return  # a redelivery or an older dispatch resolved late: the head only moves forward
    switched = old.switched_at_conversation_seq
    if d.write_policy != old.write_policy:
        switched = d.conversation_seq
    new = TierHead(
        write_policy=d.write_policy,
        latest_conversation_seq=d.conversation_seq,
        last_activity_id=max(old.last_activity_id, d.last_activity_id),
        last_message_id=d.message_id,
        switched_at_conversation_seq=switched,
    )
    kv.put(key, _ENCODER.encode(new))


def heads_of(kv: KVReader, tenant_id: str, conversation_ids: Iterable[str]) -> dict[str, TierHead]:
    """The read-diffusion heads this shard keeps for ``conversation_ids`` (those it has)."""
    out = {}
    for conv in conversation_ids:
        head = load_head(kv, tenant_id, conv)
        if head is not None and head.read_diffusion:
            out[conv] = head
    return out
