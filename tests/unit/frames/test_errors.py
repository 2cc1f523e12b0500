"""App. A.6 error codes: 16 stable values, their extras, and the unknown-code rule of §27.1.2."""

from __future__ import annotations

from qim.schemas.frames import (
    ERROR_CODES,
    ClientAction,
    Error,
    ErrorCode,
    FrameTooLarge,
    LimitExceeded,
    MalformedBody,
    Role,
    encode_frame,
    for_code,
)
from qim.schemas.frames.errors import RETRY_AFTER_NEVER_MS
from tests.unit.frames.support import body_of

A6_ORDER = [
    "CURSOR_EXPIRED",
    "CURSOR_REBASED",
    "CURSOR_INVALID",
    "MAILBOX_DIRTY",
    "SYNC_INCOMPLETE",
    "SHARD_MOVED",
    "REGION_FAILOVER",
    "RATE_LIMITED",
    "FANOUT_QUOTA_EXCEEDED",
    "TOKEN_EXPIRED",
    "TOKEN_REVOKED",
    "UPGRADE_REQUIRED",
    "CLOCK_UNSAFE",
    "PAYLOAD_TOO_LARGE",
    "PERMISSION_DENIED",
    "PREKEY_EXHAUSTED",
]


def test_sixteen_codes_numbered_by_their_a6_row() -> None:
    """Wire values are frozen: row n of A.6 is value n, forever (§27.2.1 rule 2)."""
    assert [c.name for c in ErrorCode] == A6_ORDER
    assert [int(c) for c in ErrorCode] == list(range(1, 17))
    assert set(ERROR_CODES) == set(range(1, 17))


def test_code_specific_extras_are_declared_and_exist_on_error() -> None:
    assert for_code(ErrorCode.CURSOR_EXPIRED).extras == ("trim_watermark", "rebuild_required")
    assert for_code(ErrorCode.CURSOR_REBASED).extras == ("new_cursor", "replay_from_seq")
    assert for_code(ErrorCode.UPGRADE_REQUIRED).extras == ("minimum_client_version",)
    assert "retry_after_ms" in for_code(ErrorCode.RATE_LIMITED).extras
    for spec in ERROR_CODES.values():
        for extra in spec.extras:
            assert extra in Error.__struct_fields__


def test_cursor_expired_round_trips_with_its_extras() -> None:
    error = Error(
        code=ErrorCode.CURSOR_EXPIRED,
        detail="cursor behind trim",
        request_id=9,
        trim_watermark=2**60,
        rebuild_required=True,
    )
    assert body_of(encode_frame(error, request_id=9), Role.CLIENT) == error


def test_unknown_error_code_decodes_and_means_back_off() -> None:
    """§27.1.2: back off per retry_after_ms (else reconnect_backoff); never fatal."""
    body = body_of(encode_frame(Error(code=4242, retry_after_ms=1500)), Role.CLIENT)
    assert isinstance(body, Error) and body.code == 4242
    spec = for_code(body.code)
    assert not spec.known and spec.action is ClientAction.BACKOFF_RETRY
    assert for_code(ErrorCode.TOKEN_REVOKED).action is ClientAction.WIPE_AND_LOGIN


def test_absent_retry_after_is_distinguishable_from_zero() -> None:
    body = body_of(encode_frame(Error(code=8)), Role.CLIENT)
    assert isinstance(body, Error) and body.retry_after_ms is None
    body = body_of(encode_frame(Error(code=8, retry_after_ms=0)), Role.CLIENT)
    assert isinstance(body, Error) and body.retry_after_ms == 0


def test_protocol_errors_carry_the_code_to_answer_with() -> None:
    """h11-style verdicts: what ERROR to send, and whether to close."""
    assert FrameTooLarge("x").code is ErrorCode.PAYLOAD_TOO_LARGE and FrameTooLarge.close
    assert MalformedBody("x").code is ErrorCode.UPGRADE_REQUIRED and MalformedBody.close
    limited = LimitExceeded("x", request_id=3, code=ErrorCode.RATE_LIMITED)
    assert not limited.close
    # a size refusal answered RATE_LIMITED says "do not retry" (20.4.1 rule 2, issue 15.3)
    assert limited.to_error_frame() == Error(
        code=ErrorCode.RATE_LIMITED,
        retry_after_ms=RETRY_AFTER_NEVER_MS,
        detail="x",
        request_id=3,
    )
    assert RETRY_AFTER_NEVER_MS == 2**32 - 1  # the largest u32 the field can carry
