"""Helpers for driving a sans-I/O Session in unit tests (no sockets, fake time)."""

from __future__ import annotations

import struct
from typing import Any

import crc32c
import msgspec

from qim.gateway.actions import Action, Authenticate, Close, CloseReason, Send, SendPush
from qim.gateway.ports import AuthGrant
from qim.gateway.session import Session, SessionConfig
from qim.schemas.frames import Auth, AuthOk, Body, PushEvents, encode_frame

T0 = 1_700_000_000_000
CFG = SessionConfig(
    unauth_timeout_ms=10_000,
    next_ping_interval_ms=60_000,
    idle_timeout_ms=130_000,  # 60 s × 2 + 10 s (§15.1.3)
    frag_assembly_timeout_ms=30_000,
)
GRANT = AuthGrant("t1", "u1", "d1", session_epoch=7)


def wire(body: Body, request_id: int = 0, **kw: Any) -> bytes:
    return encode_frame(body, request_id, **kw)


def raw_frame(
    opcode: int, body: bytes = b"", *, request_id: int = 0, version: int = 1, flags: int = 0
) -> bytes:
    """A frame built by hand (any opcode, any body): header with a correct CRC."""
    covered = struct.pack(">HBBHIHI", 0x514D, version, flags, opcode, request_id, 0, len(body))
    return covered + struct.pack(">I", crc32c.crc32c(covered)) + body


def new_session(config: SessionConfig = CFG) -> Session:
    return Session(config, now_ms=T0, peer="192.0.2.1")


def auth_frame(device: str = "d1", token: str = "tok", request_id: int = 1, **kw: Any) -> bytes:
    return wire(Auth(access_token=token, device_id=device, client_version="1.0", **kw), request_id)


def authenticating(config: SessionConfig = CFG) -> Session:
    session = new_session(config)
    actions = session.receive_message(auth_frame(), T0)
    assert [type(a) for a in actions] == [Authenticate]
    return session


def online(config: SessionConfig = CFG, now_ms: int = T0) -> Session:
    session = authenticating(config)
    actions = session.auth_accepted(GRANT, now_ms=now_ms, lane_id=5)
    assert isinstance(sent(actions)[0], AuthOk)
    return session


def sent(actions: list[Action]) -> list[Body]:
    """Bodies queued, in order; a raw PUSH_EVENTS (SendPush) decoded like a client would."""
    bodies: list[Body] = []
    for a in actions:
        if isinstance(a, Send):
            bodies.append(a.body)
        elif isinstance(a, SendPush):
            bodies.append(msgspec.msgpack.decode(a.body, type=PushEvents))
    return bodies


def closes(actions: list[Action]) -> list[CloseReason]:
    return [a.reason for a in actions if isinstance(a, Close)]
