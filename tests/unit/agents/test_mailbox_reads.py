"""The MailboxNode's answers to SyncAuthRequest and PullMailboxRequest (spec 9.3.1, 9.3.3).

Wiring invariants, the rules themselves are tested in ``tests/unit/sync``: AUTH_OK's
``sync_to_seq`` is the lane's served ``W``; the cursor token names this shard, lane and epoch;
a cursor below the trim line is CURSOR_EXPIRED at AUTH and at PULL; bodies are joined before the
batch is cut; a request for a user of another shard, or for a shard not owned, is SHARD_MOVED.
"""

from __future__ import annotations

import pytest

from qim.agents.mailbox import reads as mailbox_reads
from qim.agents.mailbox.reads import ReadContext, answer
from qim.agents.mailbox.shard import OwnedShard
from qim.core.mailbox import DAY_MS, MemoryMailboxStore
from qim.core.sync import CursorKey, CursorKeyRing, PullLimits, verify_cursor
from qim.schemas import lane_id
from qim.schemas.frames import ErrorCode, MailboxCursor, PullMailbox
from qim.schemas.records.dispatch import GroupDispatch
from qim.schemas.records.user_requests import MailboxReply, PullMailboxRequest, SyncAuthRequest
from tests.unit.mailbox.support import (
    BASE_TIME,
    CONFIG,
    EPOCH,
    T,
    dispatch,
    local_users,
    numbered,
    remote_user,
    seq,
)

RING = CursorKeyRing([CursorKey("k1", b"unit-test-cursor-key-0123456789")])
NOW = 1_800_000_000_000
CTX = ReadContext(keys=RING, limits=PullLimits(), retry_after_ms=500, now_ms=lambda: NOW)
A, B = local_users(2)


def serving(records: list[GroupDispatch]) -> OwnedShard:
    shard = OwnedShard(CONFIG.mailbox_shard, MemoryMailboxStore(), CONFIG, EPOCH)
    shard.take_over(None, None)
    if records:
        shard.write(shard.materialize(numbered(records)))
    shard.mark_published(shard.floor_to_publish())
    return shard


def auth(user: str, cursor: MailboxCursor | None = None, device: str = "phone") -> SyncAuthRequest:
    return SyncAuthRequest(
        tenant_id=T,
        user_id=user,
        device_id=device,
        session_epoch=7,
        connection_shard=9,
        request_id=5,
        cursor=cursor,
    )


def pull(user: str, after: int = 0) -> PullMailboxRequest:
    return PullMailboxRequest(
        tenant_id=T,
        user_id=user,
        device_id="phone",
        session_epoch=7,
        connection_shard=9,
        request_id=5,
        correlation_id="c-1",
        message=PullMailbox(after_seq=after),
    )


def ask(shard: OwnedShard | None, request: SyncAuthRequest | PullMailboxRequest) -> MailboxReply:
    return answer(shard, CONFIG.mailbox_shard, request, CTX)


def test_9_3_1_new_device_gets_sync_to_seq_w_and_a_token_for_this_shard_lane_epoch() -> None:
    shard = serving(
        [dispatch(1, sender=A, participants=(A, B)), dispatch(2, sender=A, participants=(A, B))]
    )
    reply = ask(shard, auth(B))
    sync = reply.auth_sync
    assert sync is not None, reply
    lane = lane_id(T, B, CONFIG.lane_count)
    assert sync.sync_to_seq == sync.lane_watermark == shard.served_watermark(lane) == seq(1)
    assert (sync.kind, sync.start_seq, sync.has_offline) == ("new_device", 0, True)
    assert sync.pending_entry_count_hint == 2 and sync.pending_bytes_hint > 0
    claims = verify_cursor(sync.mailbox_cursor_token, RING)
    assert (claims.user_id, claims.device_id, claims.mailbox_shard_id) == (B, "phone", 0)
    assert (claims.lane_id, claims.shard_epoch, claims.issued_at) == (lane, EPOCH, NOW)
    assert (reply.session_epoch, reply.connection_shard, reply.request_id) == (7, 9, 5)
    assert sync.auth_ok(session_epoch=7).mailbox_cursor_token == sync.mailbox_cursor_token

    resumed = ask(
        shard,
        auth(B, MailboxCursor(token=sync.mailbox_cursor_token, last_applied_mailbox_seq=seq(1))),
    )
    assert resumed.auth_sync is not None
    assert (resumed.auth_sync.kind, resumed.auth_sync.has_offline) == ("resume", False)
    other = ask(
        shard,
        auth(
            B,
            MailboxCursor(token=sync.mailbox_cursor_token, last_applied_mailbox_seq=1),
            device="tablet",
        ),
    )
    assert other.error is not None and other.error.code == ErrorCode.CURSOR_INVALID


def claims_token(reply: MailboxReply) -> bytes:
    assert reply.auth_sync is not None
    return reply.auth_sync.mailbox_cursor_token


def test_26_2_6_cursor_below_the_trim_line_is_expired_at_auth_and_at_pull() -> None:
    records = [
        dispatch(1, sender=A, participants=(A, B), committed_at=BASE_TIME),
        dispatch(2, sender=A, participants=(A, B), committed_at=BASE_TIME + 3_600_000),
        dispatch(3, sender=A, participants=(A, B), committed_at=BASE_TIME + 12 * DAY_MS),
    ]
    shard = serving(records)
    token = claims_token(ask(shard, auth(B)))
    swept = shard.sweep(NOW)  # clamped to the log time: BASE + 12 days
    assert swept.metrics["mailbox_entries_expired_total"] == 4  # two groups of A and of B
    reply = ask(shard, auth(B, MailboxCursor(token=token, last_applied_mailbox_seq=seq(0))))
    assert reply.error is not None and reply.error.code == ErrorCode.CURSOR_EXPIRED
    assert reply.error.trim_watermark == seq(1) and reply.error.rebuild_required is True
    pulled = ask(shard, pull(B, after=seq(0)))
    assert pulled.error is not None and pulled.error.code == ErrorCode.CURSOR_EXPIRED
    fine = ask(shard, pull(B, after=seq(1)))
    assert fine.mailbox_batch is not None and [
        e.mailbox_seq for e in fine.mailbox_batch.entries
    ] == [seq(2)]


def test_18_3_1_pull_joins_the_shard_body_and_keeps_inline_bodies() -> None:
    shard = serving(
        [
            dispatch(1, sender=A, participants=(A, B), payload=b"joined"),
            dispatch(2, sender=A, participants=(A, B), payload=b"inline", inline_body=True),
        ]
    )
    reply = ask(shard, pull(B))
    batch = reply.mailbox_batch
    assert batch is not None and reply.correlation_id == "c-1"
    assert [(e.body_included, e.payload_or_ciphertext) for e in batch.entries] == [
        (True, b"joined"),
        (True, b"inline"),
    ]
    assert batch.covered_through_seq == batch.lane_watermark == seq(1) and not batch.has_more


def test_requests_for_another_shard_or_an_unowned_shard_are_shard_moved() -> None:
    shard = serving([dispatch(1, sender=A, participants=(A, B))])
    for reply in (ask(shard, pull(remote_user())), ask(None, auth(A))):
        assert reply.error is not None and reply.error.code == ErrorCode.SHARD_MOVED
        assert reply.error.retry_after_ms == 500


def test_pending_hints_are_extrapolated_past_the_scan_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    shard = serving([dispatch(n, sender=A, participants=(A, B)) for n in range(1, 6)])
    monkeypatch.setattr(mailbox_reads, "HINT_SCAN_CAP", 2)
    sync = ask(shard, auth(B)).auth_sync
    assert sync is not None and sync.has_offline
    assert sync.pending_entry_count_hint == 5  # the user's live entry count
