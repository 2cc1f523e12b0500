"""Issue 15.2: before AUTH_OK a connection may make the gateway hold one AUTH frame, no more.

Before, the decoder reassembled FRAGMENTED pieces of any opcode up to 8 x max_frame_bytes
before the session had seen an AUTH, so one unauthenticated socket could pin 32 MiB.
"""

from __future__ import annotations

from qim.gateway.actions import Action, Close
from qim.gateway.session import Session
from qim.schemas.frames import SendMessage, encode_fragments
from qim.schemas.frames.decoder import FrameDecoder
from qim.schemas.frames.exceptions import FragmentError, FrameTooLarge
from qim.schemas.frames.opcodes import Role
from tests.unit.gateway.session_support import CFG, T0, auth_frame, online

PRE_AUTH = CFG.limits.pre_auth_max_frame_bytes


def _closed(actions: list[Action]) -> bool:
    return any(isinstance(a, Close) for a in actions)


def _big(stream: int, size: int) -> list[bytes]:
    return encode_fragments(SendMessage(payload=b"z" * size), 7, stream, chunk_bytes=4096)


def test_a_fragmented_frame_larger_than_an_auth_closes_an_unauthenticated_session() -> None:
    session = Session(CFG, now_ms=T0, peer="192.0.2.1")
    actions: list[Action] = []
    held = 0
    for piece in _big(0, 4 * PRE_AUTH):
        actions += session.receive_message(piece, T0 + 1)
        held = max(held, session.buffered_bytes)
        if session.closed:
            break
    assert _closed(actions) and session.closed
    assert held <= PRE_AUTH, f"{held} octets held before AUTH_OK"


def test_an_auth_frame_over_the_pre_auth_cap_is_refused_from_its_header() -> None:
    session = Session(CFG, now_ms=T0, peer="192.0.2.1")
    whole = auth_frame(token="t" * (2 * PRE_AUTH))
    header_only = whole[:20]  # a TCP stream: the header alone must be enough to refuse it
    actions = session.receive_data(header_only, T0 + 1)
    assert _closed(actions) and session.buffered_bytes == 0


def test_the_decoder_holds_one_reassembly_at_most_while_restricted() -> None:
    decoder = FrameDecoder(Role.SERVER)
    decoder.restrict(PRE_AUTH)
    assert decoder.receive_message(_big(0, 3 * 4096)[0]) is None
    try:
        decoder.receive_message(_big(1, 3 * 4096)[0])
    except FragmentError:
        pass
    else:
        raise AssertionError("a second concurrent reassembly was accepted before AUTH_OK")
    decoder.lift()
    assert decoder.max_frame_bytes == CFG.limits.max_frame_bytes


def test_the_restricted_decoder_refuses_a_reassembly_growing_past_the_cap() -> None:
    decoder = FrameDecoder(Role.SERVER)
    decoder.restrict(PRE_AUTH)
    pieces = _big(0, 2 * PRE_AUTH)
    raised = False
    for piece in pieces:
        try:
            decoder.receive_message(piece)
        except FrameTooLarge:
            raised = True
            break
    assert raised and decoder.reassembly_bytes <= PRE_AUTH


def test_after_auth_ok_a_large_fragmented_frame_is_reassembled() -> None:
    session = online()
    assert session.grant is not None
    actions: list[Action] = []
    for piece in _big(1, 4 * PRE_AUTH):
        actions += session.receive_message(piece, T0 + 2)
    assert not session.closed and not _closed(actions)


def test_an_auth_frame_fits_under_the_pre_auth_cap() -> None:
    assert len(auth_frame()) - 20 <= PRE_AUTH
