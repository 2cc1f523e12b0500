"""The session's online pushes: ConnectionPush behind the login barrier (spec 9.4, 11.1.1, 15.1.1).

Invariants: an event at or below ``sync_to_seq`` is never pushed (the pull covers it); a newer
one waits for ONLINE_READY and follows it, in order, on stream 1; PONG reports the largest
pushed ``mailbox_seq``; a barrier overflow is one ERROR{MAILBOX_DIRTY} and the connection stays.
"""

from __future__ import annotations

import msgspec

from qim.core.push import EntryFragment, PendingPush
from qim.core.push.wire import personal_fragment
from qim.gateway.actions import Action, Send, SendPush
from qim.gateway.session import Session
from qim.gateway.session_push import SessionFrame
from qim.schemas.frames import (
    Error,
    ErrorCode,
    OnlineReady,
    Ping,
    Pong,
    PushEvents,
    SyncComplete,
)
from qim.schemas.frames.control import ReadSync
from qim.schemas.frames.history import BadgeUpdate, SessionDelta
from qim.schemas.records.push import PushRecipient
from tests.unit.gateway.session_support import GRANT, T0, authenticating, online, sent, wire
from tests.unit.gateway.test_login_sync_session import RESULT, complete, synced
from tests.unit.push.support import pending as filler_push


def push_of(seq: int) -> PendingPush:
    recipient = PushRecipient(
        connection_id="c1", session_epoch=7, user_id="u1", device_id="d1", mailbox_seq=seq,
        event_id=seq,
    )  # fmt: skip
    return PendingPush(seq, EntryFragment(b"", 0), (personal_fragment(recipient),))


def pushed_seqs(actions: list[Action]) -> list[int]:
    """The mailbox_seqs of the PUSH_EVENTS written (raw spliced bytes, decoded here)."""
    seqs = []
    for action in actions:
        assert not (isinstance(action, Send) and isinstance(action.body, PushEvents))
        if isinstance(action, SendPush):
            body = msgspec.msgpack.decode(action.body, type=PushEvents)
            seqs += [e.mailbox_seq for e in body.events]
    return seqs


NOTHING_OFFLINE = msgspec.structs.replace(RESULT, has_offline=False)


def pong(session: Session) -> Pong:
    (body,) = sent(session.receive_message(wire(Ping(ping_id=1, client_time=T0), 3), T0))
    assert isinstance(body, Pong)
    return body


def test_pushes_wait_for_online_ready_and_covered_ones_are_skipped() -> None:
    session = synced(NOTHING_OFFLINE)
    assert session.push(push_of(250), T0) == []  # <= sync_to_seq (300): the pull has it
    assert session.push(push_of(310), T0) == []  # queued behind the barrier
    actions = session.receive_message(wire(SyncComplete(sync_to_seq=RESULT.sync_to_seq), 8), T0)
    bodies = sent(actions)
    assert isinstance(bodies[0], OnlineReady)
    assert pushed_seqs(actions) == [310]
    assert pushed_seqs(session.push(push_of(320), T0)) == [320]
    assert (pong(session).last_pushed_user_seq, pong(session).mailbox_dirty) == (320, False)
    assert session.last_pushed_user_seq == 320


def test_a_repeated_sync_complete_releases_nothing_twice() -> None:
    session = synced(NOTHING_OFFLINE)
    session.push(push_of(310), T0)
    assert PushEvents in {type(b) for b in complete(session)}
    assert all(not isinstance(b, PushEvents) for b in complete(session))


def test_without_login_sync_pushes_flow_at_auth_ok_and_none_before() -> None:
    assert authenticating().push(push_of(5), T0) == []
    session = online()
    assert pushed_seqs(session.push(push_of(5), T0)) == [5]
    assert pong(session).last_pushed_user_seq == 5


def test_a_barrier_overflow_is_one_mailbox_dirty_error_and_the_connection_stays() -> None:
    session = synced()
    actions = session.push(filler_push(RESULT.sync_to_seq + 1, ledger_bytes=1 << 30), T0)
    errors = [b for b in sent(actions) if isinstance(b, Error)]
    assert [e.code for e in errors] == [ErrorCode.MAILBOX_DIRTY]
    assert not session.closed
    assert session.grant == GRANT


def test_session_list_frames_wait_for_online_ready_and_follow_it() -> None:
    """12.8.3 / 9.4: no SESSION_DELTA, BADGE_UPDATE or READ_SYNC before ONLINE_READY; held
    ones follow it (the newest per conversation, one badge), later ones flow at once."""
    session = synced(NOTHING_OFFLINE)
    early: list[SessionFrame] = [
        SessionDelta(conversation_id="c1", driving_mailbox_seq=310, unread_count=1),
        BadgeUpdate(total_unread=1, badge_projection_mailbox_seq=310),
        ReadSync(conversation_id="c2", read_conversation_seq=4),
    ]
    assert session.session_frames(early) == []
    newer: list[SessionFrame] = [
        SessionDelta(conversation_id="c1", driving_mailbox_seq=311, unread_count=2),
        BadgeUpdate(total_unread=2, badge_projection_mailbox_seq=311),
    ]
    assert session.session_frames(newer) == []
    bodies = complete(session, RESULT.sync_to_seq)
    assert isinstance(bodies[0], OnlineReady)
    assert bodies[1:] == [early[2], *newer]
    repeat = complete(session)  # a repeated SYNC_COMPLETE releases nothing twice
    assert not [b for b in repeat if isinstance(b, SessionDelta | BadgeUpdate | ReadSync)]
    later = [SessionDelta(conversation_id="c3", driving_mailbox_seq=320)]
    assert sent(session.session_frames(later)) == later


def test_session_list_frames_flow_at_once_without_login_sync() -> None:
    session = online()
    frames = [BadgeUpdate(total_unread=3)]
    assert sent(session.session_frames(frames)) == frames
