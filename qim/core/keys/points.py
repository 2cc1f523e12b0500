"""The fixed encrypt and decrypt points of spec 21.3.4, as pure functions over a ring.

``seal_message_body`` is what the ConversationWriter calls where it builds a record;
``open_message_body`` is what MailboxNode, the history reader and the preview fill call before
encoding a frame. E2EE bodies pass through untouched (the caller does not seal them, and bytes
without the envelope magic are returned as they are). A destroyed key gives
:data:`EXPIRED_PLACEHOLDER`, never an error, so a sync never stalls on erased history.
"""

from __future__ import annotations

from typing import Final

import msgspec

from qim.core.keys.cache import DekCache
from qim.core.keys.envelope import (
    EnvelopeError,
    body_aad,
    is_sealed,
    open_body,
    peek_dek_id,
    seal_body,
)
from qim.core.keys.ids import DekId, KeyScope, conversation_key_id
from qim.core.keys.ring import KeyRing, KeyUnavailable, date_bucket

__all__ = ["EXPIRED_PLACEHOLDER", "open_message_body", "seal_message_body", "write_dek_id"]

EXPIRED_PLACEHOLDER: Final = msgspec.msgpack.encode({"state": "expired"})
"""The spec 21.1 "message expired" placeholder: a preview-style msgpack map the client renders."""


def write_dek_id(
    conversation_id: str, retention_class: str, committed_at: int, ring: KeyRing, tenant_id: str
) -> DekId | None:
    """The key a new write uses: the conversation's highest live DEK version, or for
    ``ephemeral_24h`` the EphemeralDEK of the commit's date bucket; ``None`` when that key
    does not exist yet (the shell creates it first)."""
    key_id = conversation_key_id(conversation_id)
    if retention_class == "ephemeral_24h":
        eph = DekId(KeyScope.EPHEMERAL, key_id, date_bucket(committed_at))
        return eph if (tenant_id, eph) in ring.wrapped else None
    return ring.latest(tenant_id, KeyScope.CONVERSATION, key_id)


def seal_message_body(
    ring: KeyRing,
    dek_id: DekId,
    *,
    tenant_id: str,
    conversation_id: str,
    conversation_seq: int,
    plaintext: bytes,
) -> bytes:
    """Encrypt a body or preview once, at the writer, bound to its conversation position."""
    aad = body_aad(tenant_id, conversation_id, conversation_seq)
    return seal_body(ring.dek(tenant_id, dek_id), dek_id, plaintext, aad)


def open_message_body(
    ring: KeyRing,
    cache: DekCache,
    data: bytes,
    *,
    tenant_id: str,
    conversation_id: str,
    conversation_seq: int,
    now_ms: int,
) -> bytes:
    """The plaintext of a sealed body, ``data`` unchanged when it is not sealed (E2EE), or
    :data:`EXPIRED_PLACEHOLDER` when its key is destroyed or it does not authenticate."""
    if not is_sealed(data):
        return data
    try:
        dek_id = peek_dek_id(data)
        dek = cache.get(tenant_id, dek_id, now_ms, ring.dek)
        return open_body(dek, data, body_aad(tenant_id, conversation_id, conversation_seq))
    except (KeyUnavailable, EnvelopeError):
        return EXPIRED_PLACEHOLDER
