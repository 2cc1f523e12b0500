"""The per-connection protocol core, sans I/O, with fake time (App. A, §15.1, §15.3.1, §20.1)."""

from __future__ import annotations

import msgspec
import pytest

from qim.gateway.actions import Authenticate, CloseReason, Count, Forward, Send
from qim.gateway.ports import AuthRejected
from qim.gateway.states import ConnState
from qim.schemas.frames import (
    Auth,
    AuthOk,
    Error,
    ErrorCode,
    Kicked,
    Ping,
    Pong,
    Redirect,
    SendMessage,
    encode_fragments,
)
from tests.unit.gateway.session_support import (
    CFG,
    GRANT,
    T0,
    auth_frame,
    authenticating,
    closes,
    new_session,
    online,
    raw_frame,
    sent,
    wire,
)

PD = int(ErrorCode.PERMISSION_DENIED)


def test_auth_asks_the_authenticator_with_the_frame_fields() -> None:
    session = new_session()
    actions = session.receive_message(auth_frame(capabilities=5, request_id=9), T0)
    (action,) = actions
    assert isinstance(action, Authenticate) and not action.renewal
    request = action.request
    assert (request.access_token, request.device_id, request.client_version) == ("tok", "d1", "1.0")
    assert (request.capabilities, request.now_ms, request.peer) == (5, T0, "192.0.2.1")
    assert session.state is ConnState.AUTHENTICATING


def test_route_token_is_read_from_an_extra_auth_key() -> None:
    """§15.2.1 (3): a redirected client presents its route token; A.3 has no field for it."""
    body = msgspec.msgpack.encode({"access_token": "t", "device_id": "d", "route_token": b"rt"})
    actions = new_session().receive_message(raw_frame(0x0001, body), T0)
    assert isinstance(actions[0], Authenticate) and actions[0].request.route_token == b"rt"


def test_auth_ok_echoes_request_id_and_carries_epoch_lane_and_ping_interval() -> None:
    session = authenticating()
    actions = session.auth_accepted(GRANT, now_ms=T0 + 5, lane_id=5, preferred_endpoint="e:1")
    (send,) = actions
    assert isinstance(send, Send) and send.request_id == 1 and send.version == 1
    assert send.body == AuthOk(
        session_epoch=7, lane_id=5, preferred_endpoint="e:1", next_ping_interval_ms=60_000
    )
    assert session.state is ConnState.ONLINE and session.grant == GRANT


@pytest.mark.parametrize(
    "code", [ErrorCode.TOKEN_EXPIRED, ErrorCode.TOKEN_REVOKED, ErrorCode.PERMISSION_DENIED]
)
def test_auth_rejection_sends_the_code_then_closes(code: ErrorCode) -> None:
    session = authenticating()
    actions = session.auth_rejected(AuthRejected(code, "no").to_error(), T0)
    assert [(e.code, e.request_id) for e in sent(actions) if isinstance(e, Error)] == [
        (int(code), 1)  # echoes the AUTH's request_id
    ]
    assert closes(actions) == [CloseReason.AUTH_FAILED] and session.closed


def test_upgrade_required_carries_minimum_client_version() -> None:
    error = AuthRejected(ErrorCode.UPGRADE_REQUIRED, minimum_client_version="2.0").to_error()
    (body,) = sent(authenticating().auth_rejected(error, T0))
    assert isinstance(body, Error) and body.minimum_client_version == "2.0"


def test_unsupported_frame_version_in_auth_is_upgrade_required() -> None:
    actions = new_session().receive_message(auth_frame(), T0)
    assert isinstance(actions[0], Authenticate)
    actions = new_session().receive_message(raw_frame(0x0001, b"\x80", version=0), T0)
    (body,) = sent(actions)
    assert isinstance(body, Error) and body.code == int(ErrorCode.UPGRADE_REQUIRED)
    assert body.minimum_client_version == "1" and closes(actions) == [CloseReason.AUTH_FAILED]


@pytest.mark.parametrize(
    "first",
    [
        wire(Ping(ping_id=1), 3),
        wire(SendMessage(client_message_id="c"), 3),
        raw_frame(0x0EEE, b"\x80", request_id=3),  # an unknown opcode is "not AUTH" here
    ],
    ids=["ping", "send_message", "unknown_opcode"],
)
def test_a_first_frame_other_than_auth_is_permission_denied_and_closed(first: bytes) -> None:
    session = new_session()
    actions = session.receive_message(first, T0)
    (body,) = sent(actions)
    assert isinstance(body, Error) and (body.code, body.request_id) == (PD, 3)
    assert closes(actions) == [CloseReason.NOT_AUTHENTICATED] and session.closed


def test_auth_twice_in_flight_is_permission_denied_and_closed() -> None:
    session = authenticating()
    actions = session.receive_message(auth_frame(request_id=2), T0)
    (body,) = sent(actions)
    assert isinstance(body, Error) and body.code == PD and body.request_id == 2
    assert closes(actions) == [CloseReason.DUPLICATE_AUTH]
    assert session.auth_accepted(GRANT, now_ms=T0) == []  # the late verdict is absorbed


def test_reauth_same_device_renews_with_the_same_epoch() -> None:
    """§15.3.1: re-AUTH on the same connection keeps session_epoch; AUTH_OK only confirms."""
    session = online()
    actions = session.receive_message(auth_frame(token="new", request_id=4), T0 + 1000)
    (action,) = actions
    assert isinstance(action, Authenticate) and action.renewal
    assert session.state is ConnState.RENEWING
    assert sent(session.receive_message(wire(Ping(ping_id=2)), T0 + 1001))  # still serving
    other = GRANT.__class__("t1", "u1", "d1", session_epoch=99)
    (body,) = sent(session.auth_accepted(other, now_ms=T0 + 1002, lane_id=1))
    assert isinstance(body, AuthOk) and body.session_epoch == 7 and body.lane_id == 5
    assert session.state.name == "ONLINE"


def test_reauth_with_another_device_id_is_permission_denied() -> None:
    session = online()
    actions = session.receive_message(auth_frame(device="d2", request_id=4), T0)
    assert [b.code for b in sent(actions) if isinstance(b, Error)] == [PD]
    assert closes(actions) == [CloseReason.DUPLICATE_AUTH]


def test_second_reauth_while_renewing_closes() -> None:
    session = online()
    session.receive_message(auth_frame(request_id=4), T0)
    actions = session.receive_message(auth_frame(request_id=5), T0)
    assert closes(actions) == [CloseReason.DUPLICATE_AUTH]


@pytest.mark.parametrize(("token", "device"), [("", "d1"), ("t", ""), ("t", "x" * 129)])
def test_malformed_credentials_are_refused_without_the_authenticator(
    token: str, device: str
) -> None:
    actions = new_session().receive_message(wire(Auth(access_token=token, device_id=device)), T0)
    assert not any(isinstance(a, Authenticate) for a in actions)
    assert closes(actions) == [CloseReason.AUTH_FAILED]


def test_ping_gets_pong_with_the_spec_fields_and_no_watermark() -> None:
    session = online()
    actions = session.receive_message(
        wire(Ping(ping_id=42, client_time=123, probe=True), 8), T0 + 5
    )
    assert Count("ping_probe") in actions
    (send,) = [a for a in actions if isinstance(a, Send)]
    assert send.request_id == 8 and send.stream is None  # PONG's default stream is 0
    assert send.body == Pong(
        ping_id=42,
        server_time=T0 + 5,
        echo_client_time=123,
        last_pushed_user_seq=0,
        mailbox_dirty=False,
        next_ping_interval_ms=60_000,
        idle_timeout_ms=130_000,
    )
    assert "watermark" not in " ".join(Pong.__struct_fields__)  # §6.10.1


def test_ping_is_answered_while_authenticating() -> None:
    session = authenticating()
    assert isinstance(sent(session.receive_message(wire(Ping(ping_id=1)), T0))[0], Pong)
    assert session.state is ConnState.AUTHENTICATING


def test_business_frames_before_auth_ok_close_the_connection() -> None:
    session = authenticating()
    actions = session.receive_message(wire(SendMessage(client_message_id="c"), 5), T0)
    assert closes(actions) == [CloseReason.NOT_AUTHENTICATED]


def test_business_frames_online_are_forwarded_and_refresh_activity() -> None:
    session = online()
    actions = session.receive_message(wire(SendMessage(client_message_id="c"), 5), T0 + 50)
    assert [type(a) for a in actions] == [Forward] and session.last_active_ms == T0 + 50


def test_unknown_opcode_online_is_dropped_and_counted_upgrade_required_iff_request_id() -> None:
    """§27.1.2: drop and count; ERROR{UPGRADE_REQUIRED} only when request_id != 0."""
    session = online()
    assert session.receive_message(raw_frame(0x0EEE, b"\x80"), T0) == [
        Count("unknown_opcode_dropped")
    ]
    actions = session.receive_message(raw_frame(0x0EEE, b"\x80", request_id=6), T0)
    (body,) = sent(actions)
    assert isinstance(body, Error) and body.code == int(ErrorCode.UPGRADE_REQUIRED)
    assert body.request_id == 6 and session.state is ConnState.ONLINE


def test_a_downlink_frame_from_the_client_closes_without_error() -> None:
    session = online()
    actions = session.receive_message(wire(Pong(ping_id=1)), T0)  # Pong is server -> client
    assert sent(actions) == [] and closes(actions) == [CloseReason.PROTOCOL_ERROR]


def test_field_limit_online_is_an_error_but_keeps_the_connection() -> None:
    session = online()
    actions = session.receive_message(wire(SendMessage(custom_type="x" * 65), 3), T0)
    (body,) = sent(actions)
    assert isinstance(body, Error) and body.code == int(ErrorCode.PAYLOAD_TOO_LARGE)
    assert body.request_id == 3 and not session.closed


def test_unauth_timeout_closes_at_the_deadline_not_before() -> None:
    session = new_session()
    assert session.deadline_ms() == T0 + 10_000
    assert session.tick(T0 + 9_999) == []
    assert closes(session.tick(T0 + 10_000)) == [CloseReason.UNAUTH_TIMEOUT]


def test_unauth_timeout_also_covers_a_slow_authentication() -> None:
    session = authenticating()
    session.receive_message(wire(Ping(ping_id=1)), T0 + 9000)  # a PING is no AUTH_OK
    assert closes(session.tick(T0 + 10_000)) == [CloseReason.UNAUTH_TIMEOUT]


def test_idle_timeout_counts_from_the_last_valid_frame() -> None:
    session = online()
    session.receive_message(wire(Ping(ping_id=1)), T0 + 100_000)
    assert session.deadline_ms() == T0 + 230_000
    assert session.tick(T0 + 229_999) == []
    assert closes(session.tick(T0 + 230_000)) == [CloseReason.IDLE_TIMEOUT]


def test_an_unfinished_fragment_reassembly_times_out() -> None:
    session = online()
    pieces = encode_fragments(SendMessage(payload=b"p" * 300), 2, chunk_bytes=100)
    assert session.receive_message(pieces[0], T0 + 1) == []
    assert session.deadline_ms() == T0 + 1 + 30_000
    assert closes(session.tick(T0 + 30_001)) == [CloseReason.PROTOCOL_ERROR]


def test_fragmented_auth_reassembles() -> None:
    session = new_session()
    pieces = encode_fragments(Auth(access_token="t" * 500, device_id="d1"), 1, chunk_bytes=128)
    actions = [a for p in pieces for a in session.receive_message(p, T0)]
    assert [type(a) for a in actions] == [Authenticate]


def test_tcp_bytes_yield_every_frame_of_a_chunk() -> None:
    session = online()
    data = wire(Ping(ping_id=1), 1) + wire(Ping(ping_id=2), 2) + wire(Ping(ping_id=3))[:7]
    actions = session.receive_data(data, T0)
    assert [b.ping_id for b in sent(actions) if isinstance(b, Pong)] == [1, 2]


def test_kick_refuse_and_shutdown_send_their_frame_then_close() -> None:
    session = online()
    actions = session.kick("replaced", "d9", T0)
    assert sent(actions) == [Kicked(reason="replaced", replaced_by_device="d9")]
    assert closes(actions) == [CloseReason.KICKED]
    redirect = Redirect(route_token=b"r", connection_shard=3, endpoint_hint="h", exp=T0)
    actions = authenticating().refuse(redirect, T0)
    assert sent(actions) == [redirect] and closes(actions) == [CloseReason.REDIRECTED]
    moved = Error(code=int(ErrorCode.SHARD_MOVED), retry_after_ms=900)
    assert closes(authenticating().refuse(moved, T0)) == [CloseReason.REFUSED]
    assert closes(online().shutdown(CloseReason.SHUTDOWN, T0)) == [CloseReason.SHUTDOWN]


def test_nothing_happens_after_close() -> None:
    session = new_session()
    session.tick(T0 + CFG.unauth_timeout_ms)
    assert session.closed and session.deadline_ms() is None
    assert session.receive_message(auth_frame(), T0) == []
    assert session.receive_data(auth_frame(), T0) == []
    assert session.peer_closed(T0) == [] and session.tick(T0 + 10**9) == []
