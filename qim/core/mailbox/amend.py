"""A recall / edit / moderation delete on this shard's per-message copies (spec 13.4.1 step 5).

An amend dispatch (``GroupDispatch.amend_action``) is a CONTROL event with its own seq; besides
its recipients' CONTROL entries (``expand``) it rewrites, in the same WriteBatch, the shard's
two per-message copies of its TARGET, when this shard holds them:

* the ``R`` facts row (``session_store.StoredFacts``), which the recount and the session
  preview read: a recall / delete marks it removed *as of this mailbox_seq* (a recount or a
  replay as of an earlier record still sees it counted: log-consistent, 12.5.2, 12.5.5) and
  its preview becomes ``preview_or_placeholder`` (the placeholder, or the edited text). The
  amend itself writes no facts row: it is not a message.
* the one ``StoredBody`` copy (read-time join, direction.md 4.4), so a later PULL_MAILBOX or
  push of the ORIGINAL entry no longer serves recalled content: recall / delete empty the
  payload (type kept), an edit stores the new payload. Copies *inline* in entries
  (``inline_body``, ADR-0005) stay as written (entries are immutable); the read path serves
  neither kind of a recalled message (``reader.join_bodies`` checks the facts row). An edited
  inline entry still carries its first text: the edit's CONTROL entry that follows it carries
  the new one (13.4.2).

A target this shard never held (expired, or another shard's message) is left alone: the
CONTROL entries still carry every ``target_*`` field the consumers need (INV-17). A message
dispatch re-applied after its dedup row expired does not undo an amend (:func:`amended`).
"""

from __future__ import annotations

import msgspec

from qim.core.mailbox import keys
from qim.core.mailbox.kvstore import Overlay
from qim.core.mailbox.ports import KVReader
from qim.core.mailbox.session_store import (
    REMOVING,
    amended_facts,
    decode_facts,
    encode_facts,
    facts_key,
)
from qim.core.mailbox.values import StoredBody, decode_value, encode_value
from qim.schemas.records.dispatch import GroupDispatch

__all__ = ["amend_target", "amended"]


def amend_target(kv: Overlay, d: GroupDispatch, mailbox_seq: int) -> None:
    """Apply the amend ``d`` (at ``mailbox_seq``) to its target's facts row and body copy."""
    mid, seq = d.target_message_id, d.target_conversation_seq
    if d.amend_action is None or mid is None or seq is None:
        return
    fkey = facts_key(d.tenant_id, d.conversation_id, seq, mid)
    raw = kv.get(fkey)
    removed_before = False
    if raw is not None:
        facts = decode_facts(raw)
        removed_before = facts.removed_mailbox_seq != 0
        new = amended_facts(facts, d, mailbox_seq)
        if new != facts:
            kv.put(fkey, encode_facts(new))
    bkey = keys.body_key(d.tenant_id, mid)
    braw = kv.get(bkey)
    if braw is None:
        return
    body = decode_value(braw, StoredBody)
    if d.amend_action in REMOVING:
        new_body = msgspec.structs.replace(body, payload=b"")
    elif removed_before:
        return  # an edit cannot bring recalled content back
    else:
        new_body = msgspec.structs.replace(body, payload=d.payload)
    if new_body != body:
        kv.put(bkey, encode_value(new_body))


def amended(kv: KVReader, d: GroupDispatch) -> bool:
    """True when the message ``d`` already has an amend applied on this shard: its re-applied
    dispatch then rewrites neither the facts row nor the body copy."""
    raw = kv.get(facts_key(d.tenant_id, d.conversation_id, d.conversation_seq, d.message_id))
    return raw is not None and decode_facts(raw).amended_mailbox_seq != 0
