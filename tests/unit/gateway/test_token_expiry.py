"""Token expiry on an open connection, sans I/O (§15.3.1, INV-48, AT-93/AT-94): fake time."""

from __future__ import annotations

import dataclasses

import pytest

from qim.gateway.actions import Action, Authenticate, CloseReason, Count, Forward
from qim.gateway.ports import AuthGrant
from qim.gateway.session import Session, SessionConfig
from qim.gateway.token_expiry import (
    READ_FRAMES,
    WRITE_FRAMES,
    TokenPhase,
    close_at_ms,
    is_write,
    token_phase,
)
from qim.schemas.frames import (
    FRAMES_BY_NAME,
    AuthOk,
    Body,
    Direction,
    Edit,
    Error,
    ErrorCode,
    MarkRead,
    MediaTicket,
    Ping,
    Pong,
    PullHistory,
    PullMailbox,
    PullSessionList,
    Recall,
    SendMessage,
)
from tests.unit.gateway.session_support import (
    CFG,
    T0,
    auth_frame,
    authenticating,
    closes,
    sent,
    wire,
)

GRACE = 5_000
EXP = T0 + 60_000
CONFIG = dataclasses.replace(CFG, token_expiry_grace_ms=GRACE, idle_timeout_ms=10 * 60_000)
GRANT = AuthGrant("t1", "u1", "d1", session_epoch=7, token_expires_at_ms=EXP)
TE = int(ErrorCode.TOKEN_EXPIRED)
WRITES: list[Body] = [
    SendMessage(client_message_id="c"),
    MarkRead(conversation_id="c1", read_conversation_seq=3),
    Recall(conversation_id="c1", target_conversation_seq=1),
    Edit(conversation_id="c1", target_conversation_seq=1),
]
READS: list[Body] = [PullMailbox(), PullHistory(), PullSessionList()]


def online(grant: AuthGrant = GRANT) -> Session:
    session = authenticating(CONFIG)
    assert isinstance(sent(session.auth_accepted(grant, now_ms=T0, lane_id=5))[0], AuthOk)
    return session


def expired_errors(actions: list[Action]) -> list[int]:
    """request_ids of the ERROR{TOKEN_EXPIRED} frames among ``actions``."""
    return [b.request_id for b in sent(actions) if isinstance(b, Error) and b.code == TE]


def test_phases_before_inside_and_after_the_grace() -> None:
    assert token_phase(EXP, GRACE, EXP - 1) is TokenPhase.VALID
    assert token_phase(EXP, GRACE, EXP) is TokenPhase.GRACE  # exp itself is expired (auth rule)
    assert token_phase(EXP, GRACE, EXP + GRACE) is TokenPhase.GRACE
    assert token_phase(EXP, GRACE, EXP + GRACE + 1) is TokenPhase.EXPIRED
    assert token_phase(None, GRACE, EXP * 10) is TokenPhase.VALID  # unknown expiry: never
    assert close_at_ms(EXP, GRACE) == EXP + GRACE + 1 and close_at_ms(None, GRACE) is None


def test_every_uplink_frame_is_classified_exactly_once() -> None:
    uplinks = {n for n, f in FRAMES_BY_NAME.items() if f.direction & Direction.UPLINK}
    assert not WRITE_FRAMES & READ_FRAMES
    assert WRITE_FRAMES | READ_FRAMES | {"AUTH"} == uplinks
    assert {"SEND_MESSAGE", "MARK_READ", "RECALL", "EDIT"} <= WRITE_FRAMES  # §15.3.1 verbatim
    assert {"PING", "PULL_MAILBOX", "PULL_HISTORY"} <= READ_FRAMES
    assert is_write(MediaTicket(intent="upload")) and not is_write(MediaTicket(intent="download"))


def test_before_expiry_writes_are_forwarded() -> None:
    session = online()
    for body in WRITES:
        assert [type(a) for a in session.receive_message(wire(body, 9), EXP - 1)] == [Forward]


@pytest.mark.parametrize("body", WRITES, ids=lambda b: type(b).__name__)
def test_inside_the_grace_a_write_gets_token_expired_with_its_request_id(body: Body) -> None:
    """INV-48: the write is refused, not forwarded, and the connection stays."""
    session = online()
    actions = session.receive_message(wire(body, 41), EXP + 10)
    assert not any(isinstance(a, Forward) for a in actions)
    assert expired_errors(actions) == [41]
    assert Count("token_expired", "grace_write") in actions
    assert closes(actions) == [] and not session.closed


@pytest.mark.parametrize("body", READS, ids=lambda b: type(b).__name__)
def test_inside_the_grace_reads_pass(body: Body) -> None:
    session = online()
    actions = session.receive_message(wire(body, 8), EXP + GRACE)
    assert [type(a) for a in actions] == [Forward]


def test_inside_the_grace_ping_is_answered() -> None:
    session = online()
    actions = session.receive_message(wire(Ping(ping_id=3), 6), EXP + 1)
    assert any(isinstance(b, Pong) for b in sent(actions)) and not closes(actions)


@pytest.mark.parametrize("body", [Ping(ping_id=1), PullMailbox(), SendMessage()])
def test_after_the_grace_any_frame_gets_token_expired_then_close(body: Body) -> None:
    session = online()
    actions = session.receive_message(wire(body, 12), EXP + GRACE + 1)
    assert expired_errors(actions) == [12]
    assert closes(actions) == [CloseReason.TOKEN_EXPIRED] and session.closed
    assert Count("token_expired", "closed") in actions


def test_an_idle_connection_is_closed_when_the_grace_ends() -> None:
    """Nobody sends: the deadline is the grace's end, and tick closes with ERROR first."""
    session = online()
    assert session.deadline_ms() == EXP + GRACE + 1
    assert session.tick(EXP + GRACE) == []
    actions = session.tick(EXP + GRACE + 1)
    assert expired_errors(actions) == [0]
    assert closes(actions) == [CloseReason.TOKEN_EXPIRED]


def test_unknown_expiry_never_expires() -> None:
    session = online(dataclasses.replace(GRANT, token_expires_at_ms=None))
    assert session.deadline_ms() == T0 + CONFIG.idle_timeout_ms  # only the idle deadline
    actions = session.receive_message(wire(SendMessage(client_message_id="c"), 5), EXP * 2)
    assert [type(a) for a in actions] == [Forward]


def test_reauth_in_the_grace_moves_the_expiry_and_keeps_the_epoch() -> None:
    """AT-93: AUTH_OK with the same session_epoch; writes flow again, the deadline moved."""
    session = online()
    (action,) = session.receive_message(auth_frame(token="fresh", request_id=4), EXP + 100)
    assert isinstance(action, Authenticate) and action.renewal
    renewed = AuthGrant("t1", "u1", "d1", session_epoch=99, token_expires_at_ms=EXP + 3_600_000)
    (ok,) = sent(session.auth_accepted(renewed, now_ms=EXP + 101, lane_id=1))
    assert isinstance(ok, AuthOk) and ok.session_epoch == 7 and ok.lane_id == 5
    assert session.grant is not None and session.grant.session_epoch == 7
    assert session.grant.token_expires_at_ms == EXP + 3_600_000
    actions = session.receive_message(wire(SendMessage(client_message_id="c"), 5), EXP + 200)
    assert [type(a) for a in actions] == [Forward]
    assert session.tick(EXP + GRACE + 1) == [] and not session.closed


def test_reauth_with_another_device_in_the_grace_is_still_permission_denied() -> None:
    session = online()
    actions = session.receive_message(auth_frame(device="d2", request_id=4), EXP + 1)
    assert [b.code for b in sent(actions) if isinstance(b, Error)] == [
        int(ErrorCode.PERMISSION_DENIED)
    ]
    assert closes(actions) == [CloseReason.DUPLICATE_AUTH]


def test_reauth_after_the_grace_is_too_late() -> None:
    session = online()
    actions = session.receive_message(auth_frame(token="fresh", request_id=4), EXP + GRACE + 1)
    assert not any(isinstance(a, Authenticate) for a in actions)
    assert expired_errors(actions) == [4] and closes(actions) == [CloseReason.TOKEN_EXPIRED]


def test_default_config_uses_the_five_minute_grace() -> None:
    assert SessionConfig().token_expiry_grace_ms == 300_000
