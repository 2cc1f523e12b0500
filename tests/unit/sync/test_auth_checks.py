"""AUTH-time cursor checks in the fixed order of spec 9.3.1 (cases T24, 26.1.6, 26.2.6, 26.7.2)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from qim.core.sync import (
    AuthSync,
    BoundaryLookup,
    CursorClaims,
    CursorKind,
    SyncInvariantError,
    check_auth_cursor,
    sign_cursor,
    verify_cursor,
)
from qim.schemas.frames import Error, ErrorCode, MailboxCursor, OnlineReady, SyncComplete

from .support import IDENTITY, NOW, RING, Mailbox, no_boundary

W, TRIM = 10_500, 9_000


def mailbox() -> Mailbox:
    box = Mailbox(lane_watermark=W, trim_watermark=TRIM)
    for seq in (9_500, 10_008, 10_217):
        box.add(seq)
    return box


def token(**changes: int | str) -> bytes:
    return sign_cursor(replace(IDENTITY.claims(NOW - 1000), **changes), RING)  # type: ignore[arg-type]


def auth(
    cursor: MailboxCursor | None,
    box: Mailbox | None = None,
    boundary: BoundaryLookup = no_boundary,
    identity: object = IDENTITY,
) -> AuthSync | Error:
    box = box or mailbox()
    return check_auth_cursor(
        cursor,
        identity=identity,  # type: ignore[arg-type]
        lane_watermark=box.lane_watermark,
        trim_watermark=box.trim_watermark,
        keys=RING,
        now_ms=NOW,
        resolve_boundary=boundary,
        pending=box.pending,
    )


def code(result: AuthSync | Error) -> ErrorCode:
    assert isinstance(result, Error), result
    return ErrorCode(result.code)


def test_9_3_1_resume_gives_sync_to_seq_equal_to_the_lane_watermark() -> None:
    result = auth(MailboxCursor(token=token(), last_applied_mailbox_seq=10_000))
    assert isinstance(result, AuthSync)
    assert result.kind is CursorKind.RESUME
    assert (result.sync_to_seq, result.lane_watermark, result.trim_watermark) == (W, W, TRIM)
    assert result.lane_id == IDENTITY.lane_id and result.start_seq == 10_000
    assert result.has_offline and result.pending_entry_count_hint == 2
    ok = result.auth_ok(session_epoch=5)
    assert (ok.session_epoch, ok.sync_to_seq, ok.has_offline, ok.lane_id) == (5, W, True, 15)
    assert verify_cursor(result.cursor_token, RING) == IDENTITY.claims(NOW)


def test_26_2_1_hints_come_from_the_pending_summary_only() -> None:
    result = auth(MailboxCursor(token=token(), last_applied_mailbox_seq=9_000))
    assert isinstance(result, AuthSync)
    assert (result.pending_entry_count_hint, result.has_offline) == (3, True)
    assert result.pending_bytes_hint > 0


def test_t22_nothing_pending_means_has_offline_false_and_an_immediate_sync_complete() -> None:
    result = auth(MailboxCursor(token=token(), last_applied_mailbox_seq=10_300))
    assert isinstance(result, AuthSync) and not result.has_offline
    assert isinstance(result.progress().complete(SyncComplete(sync_to_seq=W)), OnlineReady)


def test_9_6_1_new_device_starts_at_the_effective_trim() -> None:
    for cursor in (None, MailboxCursor(), MailboxCursor(token=b"", last_applied_mailbox_seq=77)):
        result = auth(cursor)
        assert isinstance(result, AuthSync)
        assert result.kind is CursorKind.NEW_DEVICE
        assert (result.start_seq, result.sync_to_seq, result.has_offline) == (TRIM, W, True)
        assert result.pending_entry_count_hint == 3


def test_m7_rebuild_handshake_is_an_empty_range_at_sync_to_seq() -> None:
    def no_pending(after: int, up_to: int) -> object:
        raise AssertionError("an empty range needs no pending lookup")

    box = mailbox()
    box.pending = no_pending  # type: ignore[assignment,method-assign]
    old_epoch = token(shard_epoch=0)
    result = auth(MailboxCursor(token=old_epoch, last_applied_mailbox_seq=0), box=box)
    assert isinstance(result, AuthSync)
    assert result.kind is CursorKind.REBUILD_HANDSHAKE
    assert (result.start_seq, result.sync_to_seq, result.has_offline) == (W, W, False)
    assert isinstance(result.progress().complete(SyncComplete(sync_to_seq=W)), OnlineReady)


@pytest.mark.parametrize(
    "cursor",
    [
        MailboxCursor(
            token=b"\x01garbage-token-that-is-long-enough-to-parse", last_applied_mailbox_seq=1
        ),
        MailboxCursor(token=token(user_id="u43"), last_applied_mailbox_seq=10_000),
        MailboxCursor(token=token(tenant_id="t2"), last_applied_mailbox_seq=10_000),
        MailboxCursor(token=token(device_id="tablet"), last_applied_mailbox_seq=10_000),
        MailboxCursor(token=token(lane_id=16), last_applied_mailbox_seq=10_000),
        MailboxCursor(token=token(), last_applied_mailbox_seq=W + 1),
        MailboxCursor(token=token(mailbox_shard_id=8), last_applied_mailbox_seq=10_000),
        MailboxCursor(token=token(user_id="u43"), last_applied_mailbox_seq=0),
    ],
    ids=["forged", "user", "tenant", "device", "lane", "seq>W", "shard", "rebuild-other-user"],
)
def test_t24_26_7_2_cursor_invalid(cursor: MailboxCursor) -> None:
    assert code(auth(cursor)) is ErrorCode.CURSOR_INVALID


def test_t24_epoch_from_the_future_is_invalid() -> None:
    cursor = MailboxCursor(token=token(shard_epoch=1), last_applied_mailbox_seq=10_000)
    assert code(auth(cursor)) is ErrorCode.CURSOR_INVALID


def test_9_3_1_check_order_invalid_before_expired() -> None:
    forged = bytearray(token())
    forged[-1] ^= 1
    cursor = MailboxCursor(token=bytes(forged), last_applied_mailbox_seq=100)  # also < trim
    assert code(auth(cursor)) is ErrorCode.CURSOR_INVALID


def test_26_2_6_cursor_below_trim_is_expired_never_auth_ok() -> None:
    result = auth(MailboxCursor(token=token(), last_applied_mailbox_seq=TRIM - 1))
    assert code(result) is ErrorCode.CURSOR_EXPIRED
    assert isinstance(result, Error)
    assert (result.trim_watermark, result.rebuild_required) == (TRIM, True)
    at_trim = auth(MailboxCursor(token=token(), last_applied_mailbox_seq=TRIM))
    assert isinstance(at_trim, AuthSync)


def rebasing_identity() -> object:
    return replace(IDENTITY, shard_epoch=3)


def test_9_3_1_check_order_expired_before_rebased() -> None:
    cursor = MailboxCursor(token=token(shard_epoch=2), last_applied_mailbox_seq=100)
    assert code(auth(cursor, identity=rebasing_identity())) is ErrorCode.CURSOR_EXPIRED


def test_t24_stale_epoch_with_resolvable_boundary_is_rebased() -> None:
    seen: list[tuple[CursorClaims, int]] = []

    def boundary(claims: CursorClaims, seq: int) -> int | None:
        seen.append((claims, seq))
        return 10_100

    cursor = MailboxCursor(token=token(shard_epoch=2), last_applied_mailbox_seq=9_900)
    result = auth(cursor, boundary=boundary, identity=rebasing_identity())
    assert code(result) is ErrorCode.CURSOR_REBASED
    assert isinstance(result, Error) and result.new_cursor is not None
    assert result.replay_from_seq == 10_100
    assert verify_cursor(result.new_cursor, RING) == replace(IDENTITY.claims(NOW), shard_epoch=3)
    assert seen == [(replace(IDENTITY.claims(NOW - 1000), shard_epoch=2), 9_900)]


def test_5_5_3_shard_split_rebases_onto_the_new_shard_keeping_the_lane() -> None:
    moved = replace(IDENTITY, mailbox_shard_id=135, shard_epoch=4)
    cursor = MailboxCursor(
        token=token(mailbox_shard_id=7, shard_epoch=3), last_applied_mailbox_seq=9_900
    )
    result = auth(cursor, boundary=lambda claims, seq: 10_050, identity=moved)
    assert code(result) is ErrorCode.CURSOR_REBASED
    assert isinstance(result, Error) and result.new_cursor is not None
    claims = verify_cursor(result.new_cursor, RING)
    assert (claims.mailbox_shard_id, claims.shard_epoch, claims.lane_id) == (135, 4, 15)


@pytest.mark.parametrize("replay_from", [None, TRIM - 1])
def test_5_5_3_unresolvable_boundary_is_expired(replay_from: int | None) -> None:
    cursor = MailboxCursor(token=token(shard_epoch=2), last_applied_mailbox_seq=9_900)
    result = auth(cursor, boundary=lambda claims, seq: replay_from, identity=rebasing_identity())
    assert code(result) is ErrorCode.CURSOR_EXPIRED


def test_5_5_3_boundary_above_the_watermark_is_our_bug_not_the_clients() -> None:
    cursor = MailboxCursor(token=token(shard_epoch=2), last_applied_mailbox_seq=9_900)
    with pytest.raises(SyncInvariantError):
        auth(cursor, boundary=lambda claims, seq: W + 1, identity=rebasing_identity())
