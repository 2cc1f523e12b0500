"""Crypto-erasure core (spec 21.3): seal/open, AAD binding, destruction, ephemeral buckets."""

from __future__ import annotations

from qim.core.keys import (
    EXPIRED_PLACEHOLDER,
    DekCache,
    DekId,
    KeyDestroyed,
    KeyRing,
    KeyScope,
    decode_key_record,
    encode_key_record,
    new_wrapped,
    open_message_body,
    seal_message_body,
    write_dek_id,
)

ROOT = bytes(range(32))
T = "t1"


def _ring() -> KeyRing:
    ring = KeyRing(root=ROOT)
    tmk = DekId(KeyScope.TENANT, T, 1)
    ring.apply(new_wrapped(ROOT, T, tmk, parent_version=0, created_at=0))
    conv = DekId(KeyScope.CONVERSATION, "c1", 1)
    rec = new_wrapped(ring.dek(T, tmk), T, conv, parent_version=1, created_at=0)
    ring.apply(decode_key_record(encode_key_record(rec)))
    return ring


def _open(ring: KeyRing, data: bytes, seq: int = 7, conv: str = "c1") -> bytes:
    cache = DekCache(ttl_ms=300_000)
    return open_message_body(
        ring, cache, data, tenant_id=T, conversation_id=conv, conversation_seq=seq, now_ms=0
    )


def _seal(ring: KeyRing, dek_id: DekId, text: bytes) -> bytes:
    return seal_message_body(
        ring, dek_id, tenant_id=T, conversation_id="c1", conversation_seq=7, plaintext=text
    )


def test_sealed_body_holds_no_plaintext_and_opens_at_its_position_only() -> None:
    ring = _ring()
    dek_id = write_dek_id("c1", "default", 0, ring, T)
    assert dek_id == DekId(KeyScope.CONVERSATION, "c1", 1)
    sealed = _seal(ring, dek_id, b"hello secret")
    assert b"hello secret" not in sealed
    assert _open(ring, sealed) == b"hello secret"
    assert _open(ring, sealed, seq=8) == EXPIRED_PLACEHOLDER
    assert _open(ring, sealed, conv="c2") == EXPIRED_PLACEHOLDER


def test_unsealed_bytes_pass_through_untouched() -> None:
    assert _open(_ring(), b"e2ee-ciphertext") == b"e2ee-ciphertext"


def test_destroyed_conversation_key_reads_as_expired_and_never_returns() -> None:
    ring = _ring()
    dek_id = DekId(KeyScope.CONVERSATION, "c1", 1)
    sealed = _seal(ring, dek_id, b"gone soon")
    ring.apply(KeyDestroyed(tenant_id=T, key_scope=2, key_id="c1", key_version=1))
    assert _open(ring, sealed) == EXPIRED_PLACEHOLDER
    ring.apply(new_wrapped(ROOT, T, dek_id, parent_version=1, created_at=1))
    assert ring.latest(T, KeyScope.CONVERSATION, "c1") is None


def test_destroyed_ephemeral_bucket_is_unreadable_while_conversation_key_lives() -> None:
    ring = _ring()
    tmk = ring.dek(T, DekId(KeyScope.TENANT, T, 1))
    eph = DekId(KeyScope.EPHEMERAL, "c1", 20_000)
    ring.apply(new_wrapped(tmk, T, eph, parent_version=1, created_at=0))
    assert write_dek_id("c1", "ephemeral_24h", 20_000 * 86_400_000, ring, T) == eph
    sealed = _seal(ring, eph, b"ephemeral text")
    assert _open(ring, sealed) == b"ephemeral text"
    ring.apply(KeyDestroyed(tenant_id=T, key_scope=4, key_id="c1", key_version=20_000))
    assert _open(ring, sealed) == EXPIRED_PLACEHOLDER
    normal = _seal(ring, DekId(KeyScope.CONVERSATION, "c1", 1), b"still here")
    assert _open(ring, normal) == b"still here"


def test_dek_cache_evicts_on_destroy_and_counts_hits() -> None:
    cache = DekCache(ttl_ms=10)
    d = DekId(KeyScope.CONVERSATION, "c1", 1)
    assert cache.get(T, d, 0, lambda _t, _d: b"k" * 32) == b"k" * 32
    assert cache.get(T, d, 5, lambda _t, _d: b"x" * 32) == b"k" * 32
    assert (cache.hits, cache.misses) == (1, 1)
    assert cache.evict(T, d) is True
    assert cache.get(T, d, 6, lambda _t, _d: b"x" * 32) == b"x" * 32
    assert "k" not in repr(cache).replace("DekCache", "")
