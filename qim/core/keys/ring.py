"""The key hierarchy of spec 21.3.1 as pure state: wrapped keys in, plaintext DEKs out.

Root key (``QIM_ROOT_KEY_FILE``) -> TenantMasterKey -> ConversationDEK / UserDEK, and
``EphemeralDEK = KDF(ConversationDEK, date_bucket)`` (21.1). Every key below the root is random
and persisted only *wrapped* (AES-256-GCM under its parent, AAD = its ``dek_id``), as a
:class:`KeyWrapped` record of the compacted key topic keyed by ``(tenant, dek_id)``; a
:class:`KeyDestroyed` record replaces it (compaction then drops the wrapped bytes). The ring is
a pure fold of those records, so every process and a rebuild see the same keys.

Decisions (spec deviations written down):

* Keys are random, not derived from the root: a derived key could be re-derived after its
  "destruction", so destroying it would erase nothing.
* The EphemeralDEK is the HKDF of the ConversationDEK with ``info = date_bucket`` and a random
  per-bucket ``salt``; the salt is the wrapped record (scope EPHEMERAL, version = bucket), so
  destroying the bucket's record makes the sub-key underivable while the ConversationDEK lives
  on, as 21.1 requires. A pure KDF without that salt could be recomputed from the live DEK.
* Rotation only adds a higher ``key_version`` (:func:`new_wrapped`); writes take the highest
  live version, reads keep every live one (21.3.2 trade-off 2: rotation is not deletion).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Final

import msgspec
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from qim.core.keys.ids import DekId, KeyScope

__all__ = [
    "DAY_MS",
    "KEY_BYTES",
    "KeyDestroyed",
    "KeyRecord",
    "KeyRing",
    "KeyUnavailable",
    "KeyWrapped",
    "date_bucket",
    "decode_key_record",
    "encode_key_record",
    "key_record_key",
    "new_wrapped",
]

KEY_BYTES: Final = 32
DAY_MS: Final = 86_400_000
_NONCE: Final = 12


class KeyWrapped(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="wrapped", omit_defaults=True
):
    """A live key: ``wrapped`` = nonce + AES-GCM(parent, key, aad=dek_id). ``parent_version``
    is the TMK version that wraps a conversation/user/ephemeral key (0 for a TMK: the root)."""

    tenant_id: str
    key_scope: int
    key_id: str
    key_version: int
    parent_version: int = 0
    wrapped: bytes
    created_at: int = 0


class KeyDestroyed(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    tag_field="kind",
    tag="destroyed",
    omit_defaults=True,
):
    """The key-destroyed event of 21.3.3 step 5; it replaces the wrapped record in the log."""

    tenant_id: str
    key_scope: int
    key_id: str
    key_version: int
    ticket_id: str = ""
    destroyed_at: int = 0
    due_at: int = 0
    """When the destruction became due (end of cool-down, or bucket + 24 h): ``destroyed_at -
    due_at`` is the ``key_destroy_lag`` sample."""


KeyRecord = KeyWrapped | KeyDestroyed
_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODER: Final[msgspec.msgpack.Decoder[KeyWrapped | KeyDestroyed]] = msgspec.msgpack.Decoder(
    KeyWrapped | KeyDestroyed
)


def encode_key_record(record: KeyRecord) -> bytes:
    return _ENCODER.encode(record)


def decode_key_record(data: bytes) -> KeyRecord:
    return _DECODER.decode(data)


def key_record_key(tenant_id: str, dek_id: DekId) -> bytes:
    """The compaction key: one slot per key version, so a destroy replaces its wrap."""
    return _ENCODER.encode((tenant_id, int(dek_id.key_scope), dek_id.key_id, dek_id.key_version))


def date_bucket(at_ms: int) -> int:
    """The EphemeralDEK ``key_version``: days since the Unix epoch (UTC) of the commit time."""
    return at_ms // DAY_MS


def _aad(tenant_id: str, dek_id: DekId) -> bytes:
    return key_record_key(tenant_id, dek_id)


def _wrap(parent: bytes, tenant_id: str, dek_id: DekId, key: bytes) -> bytes:
    nonce = os.urandom(_NONCE)
    return nonce + AESGCM(parent).encrypt(nonce, key, _aad(tenant_id, dek_id))


def _unwrap(parent: bytes, tenant_id: str, dek_id: DekId, wrapped: bytes) -> bytes:
    return AESGCM(parent).decrypt(wrapped[:_NONCE], wrapped[_NONCE:], _aad(tenant_id, dek_id))


def new_wrapped(
    parent: bytes,
    tenant_id: str,
    dek_id: DekId,
    *,
    parent_version: int,
    created_at: int,
) -> KeyWrapped:
    """A fresh random key (or ephemeral salt) for ``dek_id``, wrapped under ``parent``."""
    return KeyWrapped(
        tenant_id=tenant_id,
        key_scope=int(dek_id.key_scope),
        key_id=dek_id.key_id,
        key_version=dek_id.key_version,
        parent_version=parent_version,
        wrapped=_wrap(parent, tenant_id, dek_id, os.urandom(KEY_BYTES)),
        created_at=created_at,
    )


class KeyUnavailable(LookupError):
    """No live key: never created, or destroyed (the read shows "message expired")."""


def _record_id(record: KeyRecord) -> tuple[str, DekId]:
    return record.tenant_id, DekId(KeyScope(record.key_scope), record.key_id, record.key_version)


@dataclass
class KeyRing:
    """Every wrapped key and tombstone of the key topic, and the root to unwrap them with.

    The ring never holds a plaintext DEK itself: :meth:`dek` unwraps on demand (callers cache
    in a :class:`~qim.core.keys.cache.DekCache`), so nothing here is ever written anywhere.
    """

    root: bytes
    wrapped: dict[tuple[str, DekId], KeyWrapped] = field(default_factory=dict)
    destroyed: dict[tuple[str, DekId], KeyDestroyed] = field(default_factory=dict)

    def __repr__(self) -> str:  # never print the root key (spec 20: keys never in logs)
        return f"KeyRing(keys={len(self.wrapped)}, destroyed={len(self.destroyed)})"

    def apply(self, record: KeyRecord | None, key: tuple[str, DekId] | None = None) -> None:
        """Fold one record of the key topic (``None`` = a compaction tombstone for ``key``).
        A destroyed key never comes back: a later wrap of the same id is ignored."""
        if record is None:
            if key is not None:
                self.wrapped.pop(key, None)
            return
        rid = _record_id(record)
        if isinstance(record, KeyDestroyed):
            self.wrapped.pop(rid, None)
            self.destroyed[rid] = record
        elif rid not in self.destroyed:
            self.wrapped[rid] = record

    def is_destroyed(self, tenant_id: str, dek_id: DekId) -> bool:
        """True when a key-destroyed event for exactly ``dek_id`` has been folded."""
        return (tenant_id, dek_id) in self.destroyed

    @staticmethod
    def tmk_id(tenant_id: str, version: int) -> DekId:
        return DekId(KeyScope.TENANT, tenant_id, version)

    def latest(self, tenant_id: str, scope: KeyScope, key_id: str) -> DekId | None:
        """The highest live version of a key: what a new write uses (rotation, 21.3.2 rule 2)."""
        versions = [
            d.key_version
            for (t, d) in self.wrapped
            if t == tenant_id and d.key_scope == scope and d.key_id == key_id
        ]
        return DekId(scope, key_id, max(versions)) if versions else None

    def _raw(self, tenant_id: str, dek_id: DekId) -> bytes:
        rec = self.wrapped.get((tenant_id, dek_id))
        if rec is None:
            raise KeyUnavailable(dek_id)
        if dek_id.key_scope == KeyScope.TENANT:
            parent = self.root
        else:
            parent = self._raw(tenant_id, self.tmk_id(tenant_id, rec.parent_version))
        return _unwrap(parent, tenant_id, dek_id, rec.wrapped)

    def dek(self, tenant_id: str, dek_id: DekId) -> bytes:
        """The plaintext key of ``dek_id``; :class:`KeyUnavailable` when it (or its parent) is
        destroyed or unknown. An EphemeralDEK is HKDF(ConversationDEK, salt, date_bucket),
        with the ConversationDEK's highest live version (the bucket's salt record names none:
        conversation keys are not rotated while ephemeral buckets exist, a documented limit)."""
        if dek_id.key_scope != KeyScope.EPHEMERAL:
            return self._raw(tenant_id, dek_id)
        salt = self._raw(tenant_id, dek_id)
        conv = self.latest(tenant_id, KeyScope.CONVERSATION, dek_id.key_id)
        if conv is None:
            raise KeyUnavailable(dek_id)
        return HKDF(
            algorithm=hashes.SHA256(),
            length=KEY_BYTES,
            salt=salt,
            info=b"qim/ephemeral/" + str(dek_id.key_version).encode(),
        ).derive(self._raw(tenant_id, conv))
