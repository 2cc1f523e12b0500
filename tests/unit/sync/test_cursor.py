"""MailboxCursor token codec (spec 6.8, 20.2.1, case 26.7.2)."""

from __future__ import annotations

import pytest

from qim.core.sync import (
    CursorClaims,
    CursorKey,
    CursorKeyRing,
    CursorTokenError,
    sign_cursor,
    verify_cursor,
)

from .support import IDENTITY, KEY, KEY2, NOW, RING

CLAIMS = IDENTITY.claims(NOW)


def test_6_8_token_round_trips_the_signed_claims() -> None:
    token = sign_cursor(CLAIMS, RING)
    assert verify_cursor(token, RING) == CLAIMS
    assert token[0] == 1 and token[2:4] == b"k1"


def test_6_8_last_applied_seq_is_not_part_of_the_token() -> None:
    # The token depends only on the claims: the client advances its seq without re-issue.
    assert sign_cursor(CLAIMS, RING) == sign_cursor(IDENTITY.claims(NOW), RING)
    assert not hasattr(CLAIMS, "last_applied_mailbox_seq")


def test_26_7_2_a_flipped_bit_anywhere_is_rejected() -> None:
    token = sign_cursor(CLAIMS, RING)
    for index in range(len(token)):
        for bit in range(8):
            forged = bytearray(token)
            forged[index] ^= 1 << bit
            with pytest.raises(CursorTokenError):
                verify_cursor(bytes(forged), RING)


@pytest.mark.parametrize("cut", [0, 1, 2, 10, 33])
def test_6_8_truncated_token_is_rejected(cut: int) -> None:
    token = sign_cursor(CLAIMS, RING)
    with pytest.raises(CursorTokenError):
        verify_cursor(token[:cut], RING)
    with pytest.raises(CursorTokenError):
        verify_cursor(token[: len(token) - cut - 1], RING)


def test_20_2_1_rotation_verifies_with_any_kept_key_and_signs_with_the_first() -> None:
    old_token = sign_cursor(CLAIMS, RING)
    rotated = CursorKeyRing([KEY2, KEY])
    assert verify_cursor(old_token, rotated) == CLAIMS
    new_token = sign_cursor(CLAIMS, rotated)
    assert new_token[2:4] == b"k2"
    assert verify_cursor(new_token, rotated) == CLAIMS


def test_26_7_2_token_of_a_retired_key_is_rejected() -> None:
    old_token = sign_cursor(CLAIMS, RING)
    with pytest.raises(CursorTokenError, match="not in the ring"):
        verify_cursor(old_token, CursorKeyRing([KEY2]))


def test_6_8_same_kid_other_secret_is_a_bad_signature() -> None:
    token = sign_cursor(CLAIMS, RING)
    impostor = CursorKeyRing([CursorKey("k1", b"another-secret-0123456789abcdef")])
    with pytest.raises(CursorTokenError, match="bad signature"):
        verify_cursor(token, impostor)


def test_6_8_unicode_ids_round_trip() -> None:
    claims = CursorClaims("租户", "用户-1", "设备", 65535, 255, 0x7FFF, 2**64 - 1)
    assert verify_cursor(sign_cursor(claims, RING), RING) == claims


def test_6_5_epoch_above_15_bits_is_never_signed() -> None:
    claims = CursorClaims("t", "u", "d", 0, 0, 0x8000, 0)
    with pytest.raises(ValueError, match="shard_epoch"):
        sign_cursor(claims, RING)


def test_20_2_1_key_ring_rules() -> None:
    with pytest.raises(ValueError, match="at least one"):
        CursorKeyRing([])
    with pytest.raises(ValueError, match="duplicate"):
        CursorKeyRing([KEY, KEY])
    with pytest.raises(ValueError, match="kid"):
        CursorKey("bad kid", b"0" * 32)
    with pytest.raises(ValueError, match="secret"):
        CursorKey("k", b"short")
    assert "secret" not in repr(KEY) and "k1" in repr(KEY)
    assert list(CursorKeyRing([KEY2, KEY])) == ["k2", "k1"]
    assert "k1" in RING and "k2" not in RING
