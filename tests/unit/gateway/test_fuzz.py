"""Fuzz the session + decoder with 10^5+ malformed inputs, sans I/O (style.md item 7).

Invariant, written first: whatever bytes arrive, the session never raises; it ends in exactly
one Close (after an ERROR when the codec's verdict names a code), emits nothing after it, and
never sends anything but ERROR / PONG / AUTH_OK-related frames on its own. A fresh session that
was not given a valid AUTH is closed at the latest by its unauth deadline.
"""

from __future__ import annotations

import random
import struct

import crc32c

from qim.gateway.actions import Action, Authenticate, Close, Count, Forward, Send
from qim.gateway.session import Session
from qim.gateway.states import ConnState
from qim.schemas.frames import (
    FRAMES_BY_OPCODE,
    Error,
    MailboxCursor,
    Ping,
    Pong,
    PullMailbox,
    SendMessage,
    encode_fragments,
)
from tests.unit.gateway.session_support import CFG, T0, auth_frame, new_session, online, wire

SEEDS = [wire(Ping(ping_id=3, client_time=5), 2), wire(PullMailbox(after_seq=9), 4)]
SEEDS += [wire(SendMessage(client_message_id="c", payload=b"p" * 40, custom_type="x"), 5)]
SEEDS += [auth_frame(mailbox_cursor=MailboxCursor(token=b"t", last_applied_mailbox_seq=3))]
OPCODES = [*FRAMES_BY_OPCODE, 0x0000, 0x00FF, 0x0EEE, 0xF001, 0xF002, 0xFFFF]


def header(rng: random.Random, body_len: int) -> bytes:
    covered = struct.pack(
        ">HBBHIHI",
        0x514D if rng.random() < 0.9 else rng.getrandbits(16),
        rng.choice([1, 1, 1, 0, 2, rng.getrandbits(8)]),
        rng.choice([0, 0, 1, 2, 4, 8, rng.getrandbits(8)]),
        rng.choice(OPCODES),
        rng.choice([0, 1, rng.getrandbits(32)]),
        rng.choice([0, 1, 2, 3, rng.getrandbits(16)]),
        body_len,
    )
    crc = crc32c.crc32c(covered) if rng.random() < 0.9 else rng.getrandbits(32)
    return covered + struct.pack(">I", crc)


def malformed(rng: random.Random) -> bytes:
    """One message: random bytes, a mutated real frame, or a forged header + random body."""
    kind = rng.randrange(4)
    if kind == 0:
        return rng.randbytes(rng.randrange(0, 48))
    if kind == 1:
        mutable = bytearray(rng.choice(SEEDS))
        for _ in range(rng.randrange(1, 4)):
            mutable[rng.randrange(len(mutable))] = rng.getrandbits(8)
        return bytes(mutable)
    if kind == 2:
        data = rng.choice(SEEDS)
        cut = rng.randrange(len(data) + 8)
        return data[:cut] if cut <= len(data) else data + rng.randbytes(cut - len(data))
    body = rng.randbytes(rng.randrange(0, 40))
    declared = rng.choice([len(body), len(body), rng.randrange(0, 64), 2**32 - 1, 5 * 2**20])
    return header(rng, declared) + body


def check(session: Session, actions: list[Action], *, fresh: bool) -> None:
    """The invariant for one case's whole action list."""
    closes = [i for i, a in enumerate(actions) if isinstance(a, Close)]
    assert len(closes) == 1, actions
    assert closes[0] == len(actions) - 1, actions  # nothing after the close
    assert session.closed and session.deadline_ms() is None
    authenticating = not fresh
    for action in actions:
        if isinstance(action, Send):
            assert isinstance(action.body, Error | Pong), action
            assert authenticating or isinstance(action.body, Error), action  # PONG needs AUTH
        else:
            assert isinstance(action, Close | Count | Authenticate | Forward), action
            assert not (fresh and isinstance(action, Forward)), action  # never before AUTH_OK
            authenticating = authenticating or isinstance(action, Authenticate)


def finish(session: Session, actions: list[Action]) -> list[Action]:
    """Let the deadline pass and the peer go: any still-open session must close now."""
    actions += session.tick(T0 + 10**9)
    actions += session.peer_closed(T0 + 10**9)
    return actions


def test_malformed_messages_into_fresh_sessions() -> None:
    rng = random.Random(20240601)
    for _ in range(50_000):
        session = new_session()
        actions = session.receive_message(malformed(rng), T0)
        if not any(isinstance(a, Authenticate) for a in actions) and not session.closed:
            # only a FRAGMENTED piece may leave a fresh session open, until its deadline
            assert session.state is ConnState.AWAITING_AUTH
        check(session, finish(session, actions), fresh=True)


def test_malformed_messages_into_online_sessions() -> None:
    rng = random.Random(7)
    template = online()
    for _ in range(30_000):
        session = online() if rng.random() < 0.02 else _clone_online(template)
        actions: list[Action] = []
        for _ in range(rng.randrange(1, 4)):
            actions += session.receive_message(malformed(rng), T0 + 1)
        check(session, finish(session, actions), fresh=False)


def test_random_tcp_streams_in_random_chunks() -> None:
    rng = random.Random(99)
    for _ in range(25_000):
        session = new_session() if rng.random() < 0.5 else _clone_online(online())
        fresh = session.state is ConnState.AWAITING_AUTH
        stream = b"".join(malformed(rng) for _ in range(rng.randrange(1, 5)))
        actions: list[Action] = []
        pos = 0
        while pos < len(stream):
            step = rng.randrange(1, 30)
            actions += session.receive_data(stream[pos : pos + step], T0 + 1)
            pos += step
        check(session, finish(session, actions), fresh=fresh)


def test_fragment_floods_stay_bounded() -> None:
    """Fragments on many streams: the decoder caps reassemblies; the session closes cleanly."""
    rng = random.Random(5)
    for _ in range(500):
        session = _clone_online(online())
        actions: list[Action] = []
        for stream in range(rng.randrange(1, 20)):
            pieces = encode_fragments(SendMessage(payload=b"z" * 300), 1, stream, chunk_bytes=64)
            actions += session.receive_message(pieces[0], T0 + 1)
        assert session.buffered_bytes <= 9 * CFG.limits.max_frame_bytes
        check(session, finish(session, actions), fresh=False)


def _clone_online(template: Session) -> Session:
    """A fresh ONLINE session (same grant) without re-running the login each time."""
    session = Session(CFG, now_ms=T0, peer="192.0.2.1")
    session.receive_message(auth_frame(), T0)
    assert template.grant is not None
    session.auth_accepted(template.grant, now_ms=T0, lane_id=5)
    return session
