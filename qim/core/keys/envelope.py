"""Body ciphertext of spec 21.3.1: AES-256-GCM, AAD ``(tenant_id, conversation_id,
conversation_seq)``, the ``dek_id`` header stored beside the ciphertext.

Why a self-describing envelope: every copy of a body (outbox, dispatch log, MessageStore, mailbox
body store) already carries ``payload`` bytes; putting ``dek_id`` and the nonce in a header of
those same bytes means no copy can lose the key reference, and a decrypt point needs only the
envelope and the coordinates it already has for the AAD. Layout (all big-endian)::

    magic b"QE1" | scope u8 | len(key_id) u16 | key_id utf-8 | key_version u64 | nonce 12 | ct+tag

The nonce is random (96 bits, one per seal, as AES-GCM requires); ciphertext is never
re-derived on replay, consumers copy it. Cryptography comes from ``cryptography`` (AESGCM).
"""

from __future__ import annotations

import os
import struct
from typing import Final

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from qim.core.keys.ids import DekId, KeyScope

__all__ = [
    "MAGIC",
    "EnvelopeError",
    "body_aad",
    "is_sealed",
    "open_body",
    "peek_dek_id",
    "seal_body",
]

MAGIC: Final = b"QE1"
_NONCE: Final = 12
_AAD_ENCODER: Final = msgspec.msgpack.Encoder()


class EnvelopeError(ValueError):
    """A sealed body that cannot be opened: bad header, wrong key, wrong AAD or tampered."""


def body_aad(tenant_id: str, conversation_id: str, conversation_seq: int) -> bytes:
    """The spec 21.3.1 AAD: binds a body to its conversation position, so a blob moved to
    another conversation or seq does not open."""
    return _AAD_ENCODER.encode((tenant_id, conversation_id, conversation_seq))


def is_sealed(data: bytes) -> bool:
    """True for bytes written by :func:`seal_body` (E2EE ciphertext and legacy bodies are not)."""
    return data.startswith(MAGIC)


def _header(dek_id: DekId) -> bytes:
    key_id = dek_id.key_id.encode()
    return (
        MAGIC
        + struct.pack(">BH", int(dek_id.key_scope), len(key_id))
        + key_id
        + struct.pack(">Q", dek_id.key_version)
    )


def seal_body(dek: bytes, dek_id: DekId, plaintext: bytes, aad: bytes) -> bytes:
    """Encrypt ``plaintext`` under ``dek`` with ``aad``; the header carries ``dek_id``."""
    nonce = os.urandom(_NONCE)
    return _header(dek_id) + nonce + AESGCM(dek).encrypt(nonce, plaintext, aad)


def _split(data: bytes) -> tuple[DekId, bytes, bytes]:
    if not is_sealed(data) or len(data) < len(MAGIC) + 3:
        raise EnvelopeError("not a sealed body")
    pos = len(MAGIC)
    scope, key_len = struct.unpack_from(">BH", data, pos)
    pos += 3
    end = pos + key_len
    if len(data) < end + 8 + _NONCE + 16:
        raise EnvelopeError("truncated sealed body")
    try:
        key_id = data[pos:end].decode()
        dek_id = DekId(KeyScope(scope), key_id, struct.unpack_from(">Q", data, end)[0])
    except ValueError as exc:
        raise EnvelopeError("bad sealed body header") from exc
    pos = end + 8
    return dek_id, data[pos : pos + _NONCE], data[pos + _NONCE :]


def peek_dek_id(data: bytes) -> DekId:
    """The ``dek_id`` of a sealed body, read from its header without any key."""
    return _split(data)[0]


def open_body(dek: bytes, data: bytes, aad: bytes) -> bytes:
    """Decrypt a sealed body; :class:`EnvelopeError` on a wrong key, AAD or tampering."""
    _, nonce, ct = _split(data)
    try:
        return AESGCM(dek).decrypt(nonce, ct, aad)
    except InvalidTag as exc:
        raise EnvelopeError("sealed body does not authenticate") from exc
