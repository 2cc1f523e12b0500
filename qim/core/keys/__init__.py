"""Crypto-erasure (spec 21.3): key hierarchy, body envelope, DEK cache, encrypt/decrypt points.

* ``ids`` -- ``dek_id = (key_scope, key_id, key_version)`` and the scopes.
* ``envelope`` -- AES-256-GCM body ciphertext with its ``dek_id`` header and 21.3.1 AAD.
* ``ring`` -- the pure fold of the compacted key topic ``qim.keys``: wrap, unwrap, destroy.
* ``cache`` -- the per-decrypt-point DEK LRU (``dek_cache_ttl``, evicted on key-destroyed).
* ``points`` -- :func:`seal_message_body` (writer) and :func:`open_message_body` (read points).
"""

from qim.core.keys.cache import DekCache
from qim.core.keys.envelope import (
    EnvelopeError,
    body_aad,
    is_sealed,
    open_body,
    peek_dek_id,
    seal_body,
)
from qim.core.keys.ids import DekId, KeyScope, conversation_key_id, user_key_id
from qim.core.keys.points import (
    EXPIRED_PLACEHOLDER,
    open_message_body,
    seal_message_body,
    write_dek_id,
)
from qim.core.keys.ring import (
    KeyDestroyed,
    KeyRecord,
    KeyRing,
    KeyUnavailable,
    KeyWrapped,
    date_bucket,
    decode_key_record,
    encode_key_record,
    key_record_key,
    new_wrapped,
)

__all__ = [
    "EXPIRED_PLACEHOLDER",
    "DekCache",
    "DekId",
    "EnvelopeError",
    "KeyDestroyed",
    "KeyRecord",
    "KeyRing",
    "KeyScope",
    "KeyUnavailable",
    "KeyWrapped",
    "body_aad",
    "conversation_key_id",
    "date_bucket",
    "decode_key_record",
    "encode_key_record",
    "is_sealed",
    "key_record_key",
    "new_wrapped",
    "open_body",
    "open_message_body",
    "peek_dek_id",
    "seal_body",
    "seal_message_body",
    "user_key_id",
    "write_dek_id",
]
