"""Push tokens sealed at rest (spec 16.6): AES-GCM bound to the record key, key rotation."""

from __future__ import annotations

import pytest

from qim.agents.notify.sealing import SealError, TokenSealer

KEY_A = TokenSealer.parse(TokenSealer.generate_line("a"))
AAD = b"t\x00alice\x00phone"


def test_a_sealed_token_opens_only_for_its_own_record() -> None:
    sealed = KEY_A.seal("ab" * 32, AAD)
    assert b"ab" * 32 not in sealed and bytes.fromhex("ab" * 32) not in sealed
    assert KEY_A.open(sealed, AAD) == "ab" * 32
    with pytest.raises(SealError):
        KEY_A.open(sealed, b"t\x00alice\x00tablet")


def test_a_tampered_or_foreign_ciphertext_does_not_open() -> None:
    sealed = bytearray(KEY_A.seal("tok", AAD))
    sealed[-1] ^= 1
    with pytest.raises(SealError):
        KEY_A.open(bytes(sealed), AAD)
    other = TokenSealer.parse(TokenSealer.generate_line("b"))
    with pytest.raises(SealError):
        other.open(KEY_A.seal("tok", AAD), AAD)


def test_a_rotated_ring_still_opens_tokens_sealed_by_the_old_key() -> None:
    sealed = KEY_A.seal("tok", AAD)
    rotated = TokenSealer((*TokenSealer.parse(TokenSealer.generate_line("b")).keys, *KEY_A.keys))
    assert rotated.open(sealed, AAD) == "tok"
    assert rotated.seal("tok", AAD)[3:4] == b"b"


def test_the_fingerprint_is_stable_and_not_the_token() -> None:
    assert KEY_A.fingerprint("tok") == KEY_A.fingerprint("tok") != KEY_A.fingerprint("tok2")
    assert "tok" not in KEY_A.fingerprint("tok")
