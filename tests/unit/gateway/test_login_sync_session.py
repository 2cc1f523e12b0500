"""The sans-I/O side of login sync: Session + LoginBarrier, frames in, actions out (spec 9.3).

Invariants: AUTH_OK carries the MailboxNode's sync fields and starts ``last_pushed_user_seq`` at
``sync_to_seq`` (9.3.1, 15.1.1); ONLINE_READY only when the served ranges cover
``(start_seq, sync_to_seq]`` in any arrival order (9.3.2, 9.3.4, I-21); SYNC_INCOMPLETE keeps
the connection; a cursor refusal closes with its own reason; a range the gateway cannot
attribute never counts.
"""

from __future__ import annotations

from qim.gateway.actions import Authenticate, CloseReason, Count, Forward, Send
from qim.gateway.routing.mailbox_requests import pull_after_seq, pull_correlation
from qim.gateway.session import Session
from qim.gateway.sync_barrier import LoginBarrier
from qim.schemas.frames import (
    AuthOk,
    Body,
    Error,
    ErrorCode,
    MailboxBatch,
    MailboxCursor,
    OnlineReady,
    Stream,
    SyncComplete,
    SyncEntry,
    spec_for_model,
)
from qim.schemas.records.user_requests import AuthSyncResult
from tests.unit.gateway.session_support import (
    GRANT,
    T0,
    auth_frame,
    authenticating,
    closes,
    sent,
    wire,
)

RESULT = AuthSyncResult(
    kind="resume",
    lane_id=9,
    lane_watermark=300,
    trim_watermark=50,
    sync_to_seq=300,
    has_offline=True,
    pending_entry_count_hint=3,
    pending_bytes_hint=900,
    start_seq=100,
    mailbox_cursor_token=b"signed",
    shard_epoch=1,
)


def synced(result: AuthSyncResult = RESULT) -> Session:
    session = authenticating()
    actions = session.auth_accepted(GRANT, now_ms=T0, lane_id=5, sync=result)
    (ok,) = sent(actions)
    assert isinstance(ok, AuthOk)
    return session


def complete(session: Session, sync_to_seq: int = 300, request_id: int = 8) -> list[Body]:
    frame = wire(SyncComplete(sync_to_seq=sync_to_seq), request_id)
    return sent(session.receive_message(frame, T0))


def batch(covered: int, *seqs: int) -> MailboxBatch:
    return MailboxBatch(
        entries=tuple(SyncEntry(mailbox_seq=s, event_id=s) for s in seqs),
        covered_through_seq=covered,
        lane_watermark=300,
    )


def test_auth_ok_is_built_from_the_mailbox_nodes_answer() -> None:
    session = authenticating()
    (ok,) = sent(session.auth_accepted(GRANT, now_ms=T0, lane_id=5, sync=RESULT))
    assert ok == AuthOk(
        session_epoch=GRANT.session_epoch,
        lane_id=9,  # the MailboxNode's lane (it signs it into the cursor), not a local guess
        lane_watermark=300,
        trim_watermark=50,
        sync_to_seq=300,
        has_offline=True,
        pending_entry_count_hint=3,
        pending_bytes_hint=900,
        next_ping_interval_ms=session.config.next_ping_interval_ms,
        mailbox_cursor_token=b"signed",
    )
    assert session.last_pushed_user_seq == 300 and session.lane_id == 9
    assert session.sync is not None and not session.sync.released


def test_sub_ranges_served_out_of_order_release_the_barrier_once_contiguous() -> None:
    """T28 seen from the server: (200, 300] first, then (100, 200]."""
    session = synced()
    barrier = session.sync
    assert barrier is not None
    actions = barrier.served(41, 200, batch(300, 250, 300), session.version)
    assert actions == [
        Count("mailbox_batch", "entries"),
        Send(batch(300, 250, 300), request_id=41, version=session.version),
    ]
    (early,) = complete(session)
    assert isinstance(early, Error) and early.code == int(ErrorCode.SYNC_INCOMPLETE)
    assert early.request_id == 8 and not session.closed
    barrier.served(40, 100, batch(200, 150), session.version)
    assert complete(session, request_id=9) == [OnlineReady()]
    assert barrier.released
    assert complete(session, request_id=10) == [OnlineReady()]  # a retry is harmless


def test_a_wrong_sync_to_seq_is_sync_incomplete_even_when_covered() -> None:
    session = synced()
    assert session.sync is not None
    session.sync.served(1, 100, batch(300), session.version)
    (wrong,) = complete(session, sync_to_seq=299)
    assert isinstance(wrong, Error) and wrong.code == int(ErrorCode.SYNC_INCOMPLETE)
    assert complete(session) == [OnlineReady()]


def test_nothing_offline_means_nothing_to_cover() -> None:
    quiet = AuthSyncResult(
        kind="resume", lane_id=9, lane_watermark=300, sync_to_seq=300, start_seq=120
    )
    session = synced(quiet)
    assert complete(session) == [OnlineReady()]


def test_a_batch_the_gateway_cannot_attribute_reaches_the_client_but_covers_nothing() -> None:
    session = synced()
    assert session.sync is not None
    assert sent(session.sync.served(3, None, batch(300), session.version)) == [batch(300)]
    (still,) = complete(session)
    assert isinstance(still, Error) and still.code == int(ErrorCode.SYNC_INCOMPLETE)


def test_pull_errors_carry_the_request_id_and_are_counted_by_code() -> None:
    session = synced()
    assert session.sync is not None
    expired = Error(code=int(ErrorCode.CURSOR_EXPIRED), trim_watermark=60, rebuild_required=True)
    actions = session.sync.served(7, 100, expired, session.version)
    assert actions[0] == Count("mailbox_batch", "cursor_expired")
    (error,) = sent(actions)
    assert isinstance(error, Error) and error.request_id == 7 and error.trim_watermark == 60
    assert session.sync.served(7, 100, RESULT, session.version) == [
        Count("mailbox_batch", "mismatched_reply")
    ]


def test_batches_ride_the_bulk_stream_and_online_ready_the_realtime_one() -> None:
    """A.5: MAILBOX_BATCH on stream 2; ONLINE_READY on 1 with the pushes it releases."""
    assert spec_for_model(MailboxBatch).stream == Stream.BULK
    assert spec_for_model(OnlineReady).stream == Stream.REALTIME
    session = synced()
    assert session.sync is not None
    (send,) = [a for a in session.sync.served(2, 100, batch(300), 1) if isinstance(a, Send)]
    assert send.stream is None  # the frame's A.5 default


def test_the_auth_cursor_travels_with_the_authenticate_action() -> None:
    session = Session(authenticating().config, now_ms=T0)
    cursor = MailboxCursor(token=b"tok", last_applied_mailbox_seq=42)
    (action,) = session.receive_message(auth_frame(mailbox_cursor=cursor, request_id=6), T0)
    assert isinstance(action, Authenticate) and action.cursor == cursor
    assert session.auth_request_id == 6


def test_a_cursor_refusal_closes_with_its_own_reason_and_echoes_the_auth() -> None:
    session = authenticating()
    expired = Error(code=int(ErrorCode.CURSOR_EXPIRED), trim_watermark=60, rebuild_required=True)
    actions = session.auth_rejected(expired, T0, CloseReason.CURSOR_REJECTED)
    (error,) = sent(actions)
    assert isinstance(error, Error) and error.request_id == 1 and error.rebuild_required
    assert closes(actions) == [CloseReason.CURSOR_REJECTED] and session.closed


def test_a_renewal_neither_syncs_again_nor_moves_the_barrier() -> None:
    session = synced()
    session.receive_message(auth_frame(), T0)  # silent renewal (15.3.1)
    other = AuthSyncResult(kind="resume", lane_id=1, lane_watermark=999, sync_to_seq=999)
    (ok,) = sent(session.auth_accepted(GRANT, now_ms=T0, sync=other))
    assert isinstance(ok, AuthOk) and ok.sync_to_seq == 300 and not ok.has_offline
    assert session.sync is not None and session.sync.sync_to_seq == 300


def test_without_a_barrier_sync_complete_is_forwarded() -> None:
    session = authenticating()
    session.auth_accepted(GRANT, now_ms=T0)
    (action,) = session.receive_message(wire(SyncComplete(sync_to_seq=0), 4), T0)
    assert isinstance(action, Forward)


def test_pull_correlations_carry_after_seq_and_nothing_else_parses() -> None:
    assert pull_after_seq(pull_correlation(0)) == 0
    assert pull_after_seq(pull_correlation(2**63)) == 2**63
    for other in ("", "auth:gw:1", "pull:", "pull:-1", "pull:1e3", "pull: 5"):
        assert pull_after_seq(other) is None


def test_the_barrier_is_a_plain_record_of_the_result() -> None:
    barrier = LoginBarrier(RESULT)
    assert barrier.sync_to_seq == 300 and barrier.progress.start_seq == 100
