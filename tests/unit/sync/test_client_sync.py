"""The SDK's device cursor and sync phases (spec 6.8, 6.10.1, 9.3.2, 9.4, 9.6.3; seed 003 M-7)."""

from __future__ import annotations

import msgspec
import pytest

from qim.client.errors import IllegalTransition
from qim.client.sync import (
    TRANSITIONS,
    DeviceCursor,
    MailboxSync,
    SyncEvent,
    SyncPhase,
    SyncProtocolError,
)
from qim.core.sync import AuthSync, cursor_expired, cursor_invalid, cursor_rebased, sign_cursor
from qim.schemas.frames import (
    AuthOk,
    Error,
    ErrorCode,
    MailboxBatch,
    MailboxCursor,
    OnlineReady,
    Pong,
    PullMailbox,
    PushEvents,
    SyncComplete,
)

from .support import IDENTITY, NOW, RING, Mailbox, ServerSession, entry

TOKEN = sign_cursor(IDENTITY.claims(NOW), RING)


def phase(sync: MailboxSync) -> SyncPhase:
    return sync.phase  # read through a call so mypy does not keep an earlier narrowing


def online(sync: MailboxSync, sync_to: int = 1_000) -> None:
    sync.auth_cursor()
    assert sync.on_auth_ok(AuthOk(sync_to_seq=sync_to, has_offline=False)) == []
    assert sync.sync_complete() == SyncComplete(sync_to_seq=sync_to)
    sync.on_online_ready(NOW)


def test_style6_illegal_events_raise_and_leave_the_phase() -> None:
    sync = MailboxSync()
    with pytest.raises(IllegalTransition):
        sync.on_online_ready(NOW)
    with pytest.raises(IllegalTransition):
        sync.on_push(PushEvents(), NOW)
    assert sync.phase is SyncPhase.OFFLINE
    assert (SyncPhase.ONLINE, SyncEvent.ONLINE_READY) not in TRANSITIONS


def test_t28_cursor_moves_only_through_contiguous_subranges() -> None:
    sync = MailboxSync(DeviceCursor(TOKEN, 100), max_items=10)
    assert sync.auth_cursor() == MailboxCursor(token=TOKEN, last_applied_mailbox_seq=100)
    pulls = sync.on_auth_ok(
        AuthOk(sync_to_seq=1_000, has_offline=True, pending_entry_count_hint=50)
    )
    assert [(p.after_seq, p.up_to_seq) for p in pulls] == [
        (100, 325),
        (325, 550),
        (550, 775),
        (775, 1_000),
    ]
    done = {p.after_seq: MailboxBatch(covered_through_seq=p.up_to_seq) for p in pulls}
    sync.on_batch(pulls[3], done[775], NOW)  # sub-range 4 first
    assert sync.cursor.last_applied_mailbox_seq == 100
    part = MailboxBatch(entries=(entry(200),), covered_through_seq=200, has_more=True)
    sync.on_batch(pulls[0], part, NOW)
    assert sync.cursor.last_applied_mailbox_seq == 200  # the batch started at the cursor
    sync.on_batch(pulls[2], done[550], NOW)
    assert sync.cursor.last_applied_mailbox_seq == 200
    (cont,) = [p for p in sync.next_requests() if p.after_seq == 200]
    sync.on_batch(cont, MailboxBatch(covered_through_seq=325), NOW)
    assert sync.cursor.last_applied_mailbox_seq == 325
    assert sync.sync_complete() is None
    sync.on_batch(pulls[1], done[325], NOW)
    assert sync.cursor.last_applied_mailbox_seq == 1_000
    assert sync.sync_complete() == SyncComplete(sync_to_seq=1_000)


def test_9_3_5_small_backlog_is_one_range() -> None:
    sync = MailboxSync(DeviceCursor(TOKEN, 100))
    sync.auth_cursor()
    pulls = sync.on_auth_ok(AuthOk(sync_to_seq=1_000, has_offline=True, pending_entry_count_hint=3))
    assert [(p.after_seq, p.up_to_seq, p.max_items) for p in pulls] == [(100, 1_000, 500)]


def test_9_4_3_t33_pushes_before_online_ready_are_staged_and_never_move_the_cursor() -> None:
    sync = MailboxSync(DeviceCursor(TOKEN, 100))
    sync.auth_cursor()
    (pull,) = sync.on_auth_ok(AuthOk(sync_to_seq=1_000, has_offline=True))
    assert sync.on_push(PushEvents(events=(entry(1_500),), last_pushed_user_seq=1_500), NOW) == []
    assert sync.cursor.last_applied_mailbox_seq == 100
    pulled = sync.on_batch(
        pull, MailboxBatch(entries=(entry(300),), covered_through_seq=1_000), NOW
    )
    assert [e.mailbox_seq for e in pulled] == [300]
    released = sync.on_online_ready(NOW)
    assert [e.mailbox_seq for e in released] == [1_500]
    assert sync.cursor.last_applied_mailbox_seq == 1_000  # the push at 1500 never counted


def test_26_2_4_pushes_when_online_are_delivered_once_and_never_advance_the_cursor() -> None:
    sync = MailboxSync(DeviceCursor(TOKEN, 500))
    online(sync)
    before = sync.cursor
    first = sync.on_push(
        PushEvents(events=(entry(1_100), entry(1_200)), last_pushed_user_seq=1_200), NOW
    )
    again = sync.on_push(PushEvents(events=(entry(1_200),), last_pushed_user_seq=1_200), NOW)
    assert ([e.mailbox_seq for e in first], again) == ([1_100, 1_200], [])
    assert sync.cursor == before and sync.last_pushed_user_seq == 1_200


def test_11_1_1_dedup_is_by_message_id_and_event_id() -> None:
    sync = MailboxSync(DeviceCursor(TOKEN, 500))
    online(sync)
    same_message_other_seq = msgspec.structs.replace(
        entry(1_300, message=1_100), event_id=entry(1_100).event_id
    )
    assert sync.on_push(PushEvents(events=(entry(1_100),)), NOW) != []
    assert sync.on_push(PushEvents(events=(same_message_other_seq,)), NOW) == []
    assert sync.on_push(PushEvents(events=(entry(1_100, 1),)), NOW) != []  # another event


def test_6_10_1_15_1_1_no_pull_without_a_legal_reason() -> None:
    sync = MailboxSync(DeviceCursor(TOKEN, 500))
    online(sync)
    assert sync.cursor.last_applied_mailbox_seq == 1_000  # quiet login: implicit empty batch
    sync.on_pong(Pong(last_pushed_user_seq=1_000))
    assert sync.fallback_pull(NOW) is None  # a moving shard watermark is no reason
    sync.on_push(PushEvents(events=(entry(1_100),), last_pushed_user_seq=1_100), NOW)
    pull = sync.fallback_pull(NOW)
    assert pull is not None and (pull.after_seq, pull.up_to_seq) == (1_000, 0)
    sync.on_batch(
        pull,
        MailboxBatch(entries=(entry(1_100),), covered_through_seq=9_000, lane_watermark=9_000),
        NOW,
    )
    assert sync.cursor.last_applied_mailbox_seq == 9_000
    assert sync.fallback_pull(NOW + 10_000) is None


def test_9_4_4_t34_mailbox_dirty_resyncs_with_staging_and_rate_limit() -> None:
    sync = MailboxSync(DeviceCursor(TOKEN, 500))
    online(sync)
    sync.on_pong(Pong(mailbox_dirty=True))
    assert sync.phase is SyncPhase.RESYNCING
    first = sync.fallback_pull(NOW)
    assert first is not None and sync.fallback_pull(NOW) is None
    assert sync.on_push(PushEvents(events=(entry(2_100),), last_pushed_user_seq=2_100), NOW) == []
    more = MailboxBatch(
        entries=(entry(1_500),), covered_through_seq=1_500, lane_watermark=2_000, has_more=True
    )
    sync.on_batch(first, more, NOW)
    (cont,) = sync.next_requests()
    assert (cont.after_seq, cont.up_to_seq) == (1_500, 2_000)
    out = sync.on_batch(
        cont,
        MailboxBatch(entries=(entry(2_000),), covered_through_seq=2_000, lane_watermark=2_100),
        NOW,
    )
    assert [e.mailbox_seq for e in out] == [2_000, 2_100]
    assert phase(sync) is SyncPhase.ONLINE
    assert sync.fallback_pull(NOW + 1_000) is None  # client_resync_min_interval
    assert sync.fallback_pull(NOW + 5_000) is not None  # 2_000 < last_pushed 2_100


def test_9_3_3_malformed_batches_are_refused_without_moving_the_cursor() -> None:
    sync = MailboxSync(DeviceCursor(TOKEN, 100))
    sync.auth_cursor()
    (pull,) = sync.on_auth_ok(AuthOk(sync_to_seq=1_000, has_offline=True))
    bad = [
        MailboxBatch(covered_through_seq=100, has_more=True),  # empty, not final
        MailboxBatch(covered_through_seq=1_001),  # beyond up_to_seq
        MailboxBatch(covered_through_seq=900),  # has_more=false short of up_to_seq
        MailboxBatch(entries=(entry(950),), covered_through_seq=900, has_more=True),
    ]
    for batch in bad:
        with pytest.raises(SyncProtocolError):
            sync.on_batch(pull, batch, NOW)
    with pytest.raises(SyncProtocolError):
        sync.on_batch(PullMailbox(after_seq=5, up_to_seq=1_000), MailboxBatch(), NOW)
    assert sync.cursor.last_applied_mailbox_seq == 100 and sync.phase is SyncPhase.SYNCING


def test_m7_26_2_6_rebuild_resumes_from_sync_to_seq_without_re_pulling() -> None:
    box = Mailbox(lane_watermark=20_000, trim_watermark=5_000)
    for seq in range(6_000, 20_000, 1_000):
        box.add(seq)
    server = ServerSession(box)
    sync = MailboxSync(DeviceCursor(TOKEN, 100))
    expired = server.authenticate(sync.auth_cursor())
    assert isinstance(expired, Error) and expired.code == ErrorCode.CURSOR_EXPIRED
    sync.on_error(expired)
    assert sync.phase is SyncPhase.OFFLINE and sync.cursor == DeviceCursor(TOKEN, 0, True)
    handshake = sync.auth_cursor()
    assert handshake == MailboxCursor(token=TOKEN, last_applied_mailbox_seq=0)
    ok = server.authenticate(handshake)
    assert isinstance(ok, AuthSync) and not ok.has_offline and ok.sync_to_seq == 20_000
    assert sync.on_auth_ok(ok.auth_ok()) == []  # (trim, sync_to_seq] is not pulled again
    complete = sync.sync_complete()
    assert complete is not None and isinstance(server.complete(complete), OnlineReady)
    sync.on_online_ready(NOW)
    assert sync.cursor == DeviceCursor(TOKEN, 20_000, rebuild_pending=True)
    assert box.reads == []
    sync.rebuild_done()
    sync.disconnect()
    box.lane_watermark = 21_000
    assert isinstance(ServerSession(box).authenticate(sync.auth_cursor()), AuthSync)  # no re-expiry


def test_5_5_3_rebased_adopts_the_new_token_and_replays_from_its_seq() -> None:
    sync = MailboxSync(DeviceCursor(TOKEN, 100))
    sync.auth_cursor()
    sync.on_error(cursor_rebased(b"new-token", 7_000))
    assert sync.cursor == DeviceCursor(b"new-token", 7_000)
    assert sync.auth_cursor() == MailboxCursor(token=b"new-token", last_applied_mailbox_seq=7_000)


def test_a6_cursor_invalid_drops_the_cursor_and_logs_in_as_a_new_device() -> None:
    sync = MailboxSync(DeviceCursor(TOKEN, 100))
    sync.auth_cursor()
    sync.on_error(cursor_invalid("forged"))
    assert sync.cursor == DeviceCursor() and sync.auth_cursor() is None


def test_9_6_1_new_device_pulls_from_zero_over_the_trim_line() -> None:
    sync = MailboxSync(window=2, max_items=1)
    assert sync.auth_cursor() is None
    pulls = sync.on_auth_ok(
        AuthOk(sync_to_seq=1_000, trim_watermark=600, has_offline=True, pending_entry_count_hint=9)
    )
    assert [(p.after_seq, p.up_to_seq) for p in pulls] == [(0, 800), (800, 1_000)]


def test_t30_sync_incomplete_pulls_the_session_range_again() -> None:
    sync = MailboxSync(DeviceCursor(TOKEN, 100))
    sync.auth_cursor()
    (pull,) = sync.on_auth_ok(AuthOk(sync_to_seq=1_000, has_offline=True))
    sync.on_batch(pull, MailboxBatch(covered_through_seq=1_000), NOW)
    again = sync.on_error(Error(code=int(ErrorCode.SYNC_INCOMPLETE)))
    assert [(p.after_seq, p.up_to_seq) for p in again] == [(100, 1_000)]
    assert sync.sync_complete() is None


def test_9_3_3_rule_3_cursor_expired_mid_pull_goes_to_rebuild() -> None:
    sync = MailboxSync(DeviceCursor(TOKEN, 100))
    sync.auth_cursor()
    sync.on_auth_ok(AuthOk(sync_to_seq=1_000, has_offline=True))
    sync.on_error(cursor_expired(500))
    assert sync.cursor.rebuild_pending and sync.phase is SyncPhase.OFFLINE
