"""Issue 15.3: a logged-in session's header version is checked, and closes carry RFC 6455 codes.

Before, a logged-in session answered PING frames of header version 0, 2, 7 and 255 with PONG,
and every WebSocket close used code 1000, protocol errors included.
"""

from __future__ import annotations

import pytest

from qim.gateway.actions import WS_CLOSE_CODES, Action, CloseReason, ws_close_code
from qim.schemas.frames import Error, ErrorCode, Ping, Pong
from tests.unit.gateway.session_support import CFG, T0, closes, online, raw_frame, sent, wire

PING_OPCODE = 0x0003


@pytest.mark.parametrize("version", [0, 2, 7, 255])
def test_a_logged_in_session_closes_on_an_unsupported_header_version(version: int) -> None:
    session = online()
    actions = session.receive_message(raw_frame(PING_OPCODE, b"\x80", version=version), T0 + 1)
    bodies = sent(actions)
    assert not any(isinstance(b, Pong) for b in bodies)
    errors = [b for b in bodies if isinstance(b, Error)]
    assert [e.code for e in errors] == [int(ErrorCode.UPGRADE_REQUIRED)]
    assert closes(actions) == [CloseReason.PROTOCOL_ERROR] and session.closed


def test_the_negotiated_version_still_gets_its_pong() -> None:
    session = online()
    actions = session.receive_message(wire(Ping(ping_id=3), 9), T0 + 1)
    assert any(isinstance(b, Pong) for b in sent(actions)) and not session.closed


def test_a_reassembly_over_max_frame_bytes_closes_as_frame_too_large() -> None:
    session = online()
    piece = raw_frame(0x0201, b"\x00" * (256 * 1024), request_id=5, flags=0x02)  # FRAGMENTED
    actions: list[Action] = []
    for _ in range(CFG.limits.max_frame_bytes // (256 * 1024) + 2):
        actions += session.receive_message(piece, T0 + 1)
        if session.closed:
            break
    assert closes(actions) == [CloseReason.FRAME_TOO_LARGE]
    assert ws_close_code(CloseReason.FRAME_TOO_LARGE) == 1009


def test_every_close_reason_has_an_rfc_6455_code() -> None:
    assert set(WS_CLOSE_CODES) == set(CloseReason)
    assert ws_close_code(CloseReason.PROTOCOL_ERROR) == 1002
    assert ws_close_code(CloseReason.NOT_AUTHENTICATED) == 1008
    assert ws_close_code(CloseReason.PEER_CLOSED) == 1000
    assert ws_close_code(None) == 1011
    assert all(1000 <= code <= 1013 for code in WS_CLOSE_CODES.values())
