"""Fuzz the frame decoder against its invariant (App. A.1, §20.1, §27.1.2; style.md item 7).

THE INVARIANT, stated before any test: for every input, in every chunking, on either side,

1. the decoder yields frames or raises ``ProtocolError`` - no other exception escapes;
2. once ``next_frame()`` returns None it holds fewer than ``HEADER_SIZE + max_frame_bytes``
   unparsed octets, and at most ``max_reassembly_streams * max_frame_bytes`` in reassemblies;
3. after a header error (framing lost) it stays failed and buffers nothing more.

``check_decoder_invariant`` is the one checker; every test below drives inputs through it.
"""

from __future__ import annotations

import itertools
import random
import struct
import zlib
from collections.abc import Iterable, Sequence

import crc32c
import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qim.schemas.frames import (
    FRAMES_BY_OPCODE,
    HEADER_SIZE,
    INTERNAL_OPCODES,
    BadHeaderCrc,
    BadMagic,
    Frame,
    FrameDecoder,
    FrameFlags,
    FrameTooLarge,
    HeaderError,
    Limits,
    MalformedBody,
    ProtocolError,
    Role,
    UnknownFrame,
    decode_header,
    decode_message,
)
from tests.unit.frames.support import corpus

LIMITS = Limits(max_frame_bytes=4096, max_reassembly_streams=4)  # small: mutations hit it
Decoded = Frame | UnknownFrame


def inflate(data: bytes, limit: int) -> bytes:
    """A zlib decompress hook honouring the decoder contract (ValueError, bounded output)."""
    d = zlib.decompressobj()
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as exc:
        raise ValueError(str(exc)) from None
    if len(out) > limit or d.unconsumed_tail:
        raise ValueError("decompressed body over the limit")
    return out


def check_decoder_invariant(
    decoder: FrameDecoder, chunks: Iterable[bytes]
) -> tuple[list[Decoded], list[ProtocolError]]:
    """Feed ``chunks``; return what decoded and what was refused. Anything else fails."""
    frames: list[Decoded] = []
    errors: list[ProtocolError] = []
    limits = decoder.limits
    for chunk in chunks:
        decoder.receive_data(chunk)
        while True:
            try:
                frame = decoder.next_frame()
            except ProtocolError as exc:
                errors.append(exc)
                if isinstance(exc, HeaderError):
                    try:
                        decoder.next_frame()
                    except HeaderError as again:
                        assert again is exc
                    else:
                        raise AssertionError("a failed decoder must stay failed") from None
                    decoder.receive_data(chunk)
                    assert decoder.buffered_bytes == 0
                    assert decoder.reassembly_bytes == 0
                    return frames, errors
                continue
            if frame is None:
                break
            frames.append(frame)
        assert decoder.buffered_bytes < HEADER_SIZE + limits.max_frame_bytes
        assert decoder.reassembly_bytes <= limits.max_reassembly_streams * limits.max_frame_bytes
    return frames, errors


def check_message_invariant(message: bytes, role: Role) -> bool:
    """The WebSocket path: one message decodes or raises ProtocolError. True if it decoded."""
    try:
        decode_message(message, role, limits=LIMITS, decompress=inflate)
    except ProtocolError:
        return False
    return True


def split(data: bytes, cuts: Sequence[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def reframe(
    opcode: int,
    body: bytes,
    *,
    flags: int = 0,
    stream_id: int = 1,
    request_id: int = 1,
    body_len: int | None = None,
    version: int = 1,
) -> bytes:
    """A header with a *valid* CRC around any body, so mutations reach the body decoder."""
    covered = struct.pack(
        ">HBBHIHI",
        0x514D,
        version,
        flags,
        opcode,
        request_id,
        stream_id,
        len(body) if body_len is None else body_len,
    )
    return covered + struct.pack(">I", crc32c.crc32c(covered)) + body


CORPUS = corpus()
OPCODES = [*FRAMES_BY_OPCODE, *INTERNAL_OPCODES.values(), 0x0000, 0x00FF, 0x0BAD, 0xF0F0]


def mutate(rng: random.Random) -> tuple[bytes, Role]:
    """One malformed input derived from a valid frame."""
    frame, role = rng.choice(CORPUS)
    if rng.random() < 0.1:
        role = Role.CLIENT if role is Role.SERVER else Role.SERVER  # wrong direction
    body = frame[HEADER_SIZE:]
    opcode = int.from_bytes(frame[4:6], "big")
    kind = rng.randrange(9)
    if kind == 0:  # bit flips anywhere
        data = bytearray(frame)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return bytes(data), role
    if kind == 1:  # truncation
        return frame[: rng.randrange(len(frame))], role
    if kind == 2:  # garbage inserted
        at = rng.randrange(len(frame) + 1)
        return frame[:at] + rng.randbytes(rng.randint(1, 24)) + frame[at:], role
    if kind in (3, 4):  # body mutated, header re-framed with a valid CRC
        data = bytearray(body)
        for _ in range(rng.randint(1, 6)):
            op = rng.randrange(3)
            if op == 0 and data:
                data[rng.randrange(len(data))] = rng.randrange(256)
            elif op == 1 and data:
                del data[rng.randrange(len(data))]
            else:
                data.insert(rng.randrange(len(data) + 1), rng.randrange(256))
        return reframe(opcode, bytes(data)), role
    if kind == 5:  # any opcode around a valid body of another frame
        return reframe(rng.choice(OPCODES), body), role
    if kind == 6:  # flags / stream / version games, valid CRC
        flags = rng.randrange(256)
        pieces = [reframe(opcode, body[: len(body) // 2], flags=flags)]
        pieces.append(reframe(opcode, body[len(body) // 2 :], flags=rng.randrange(256)))
        return b"".join(pieces), role
    if kind == 7:  # body_len lies, valid CRC
        lie = rng.choice([0, len(body) - 1, len(body) + 1, LIMITS.max_frame_bytes + 1, 2**32 - 1])
        return reframe(opcode, body, body_len=max(lie, 0)), role
    # several frames back to back, one byte of one of them changed
    parts = [rng.choice(CORPUS)[0] for _ in range(rng.randint(2, 3))]
    data = bytearray(b"".join(parts))
    data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data), role


def test_every_corpus_frame_decodes_on_both_transports() -> None:
    """Sanity for the harness: the unmutated corpus decodes cleanly (A.3/A.4, 45 bodies)."""
    for frame, role in CORPUS:
        frames, errors = check_decoder_invariant(FrameDecoder(role, limits=LIMITS), [frame])
        assert errors == [] and len(frames) == 1 and isinstance(frames[0], Frame)
        assert check_message_invariant(frame, role)


def test_invariant_holds_for_100k_mutated_frames_in_random_chunkings() -> None:
    """Volume: >= 100,000 malformed inputs through the stream and the WebSocket paths."""
    rng = random.Random(0x514D)
    seen: set[type[ProtocolError]] = set()
    fed = decoded = 0
    while fed < 100_000:
        data, role = mutate(rng)
        cuts = [rng.randrange(len(data) + 1) for _ in range(rng.randrange(4))]
        decoder = FrameDecoder(role, limits=LIMITS, decompress=inflate)
        frames, errors = check_decoder_invariant(decoder, split(data, cuts))
        seen.update(type(e) for e in errors)
        decoded += len(frames)
        check_message_invariant(data, role)
        fed += 1
    assert decoded > 0
    assert {BadMagic, BadHeaderCrc, FrameTooLarge, MalformedBody} <= seen


@settings(max_examples=400, deadline=None)
@given(
    data=st.binary(max_size=256),
    cuts=st.lists(st.integers(min_value=0, max_value=256), max_size=6),
    role=st.sampled_from(Role),
)
def test_invariant_holds_for_random_byte_streams(data: bytes, cuts: list[int], role: Role) -> None:
    check_decoder_invariant(FrameDecoder(role, limits=LIMITS), split(data, cuts))
    check_message_invariant(data, role)


_MSGPACK_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    opcode=st.sampled_from(OPCODES),
    value=st.dictionaries(st.text(max_size=24), _MSGPACK_VALUES, max_size=6),
    flags=st.integers(min_value=0, max_value=255),
    role=st.sampled_from(Role),
)
def test_invariant_holds_for_wellformed_msgpack_of_the_wrong_shape(
    opcode: int, value: dict[str, object], flags: int, role: Role
) -> None:
    """Valid header + valid msgpack with arbitrary keys/types: schema errors, never crashes."""
    frame = reframe(opcode, msgspec.msgpack.encode(value), flags=flags)
    check_decoder_invariant(FrameDecoder(role, limits=LIMITS, decompress=inflate), [frame])
    check_message_invariant(frame, role)


@settings(max_examples=400, deadline=None)
@given(
    index=st.integers(min_value=0, max_value=len(CORPUS) - 1),
    edits=st.lists(
        st.tuples(st.integers(min_value=0, max_value=4096), st.integers(0, 255)), max_size=5
    ),
    keep_crc=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=4096), max_size=4),
)
def test_invariant_holds_for_mutated_valid_frames(
    index: int, edits: list[tuple[int, int]], keep_crc: bool, cuts: list[int]
) -> None:
    frame, role = CORPUS[index]
    data = bytearray(frame)
    for position, byte in edits:
        data[position % len(data)] = byte
    if keep_crc:  # re-seal the header so the edit reaches the body
        data[16:20] = struct.pack(">I", crc32c.crc32c(bytes(data[:16])))
    check_decoder_invariant(FrameDecoder(role, limits=LIMITS), split(bytes(data), cuts))
    check_message_invariant(bytes(data), role)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40), st.integers(min_value=0, max_value=2**32))
def test_decode_header_returns_a_header_or_raises_protocol_error(data: bytes, limit: int) -> None:
    try:
        header = decode_header(data, max_frame_bytes=limit)
    except ProtocolError:
        return
    assert header.body_len <= limit and len(data) >= HEADER_SIZE


def test_oversized_body_len_is_refused_before_its_body_is_buffered() -> None:
    """§20.1: judge by body_len before decoding; never allocate first."""
    decoder = FrameDecoder(Role.SERVER, limits=LIMITS)
    header = reframe(0x0201, b"", body_len=LIMITS.max_frame_bytes + 1)
    chunks = [header, *([b"\x00" * 65536] * 16)]
    frames, errors = check_decoder_invariant(decoder, chunks)
    assert frames == [] and isinstance(errors[0], FrameTooLarge)
    assert decoder.buffered_bytes == 0


def test_reassembly_is_bounded_per_stream_and_in_stream_count() -> None:
    """Fragments never make the decoder hold more than its reassembly budget."""
    piece = reframe(0x0102, b"\x00" * 1024, flags=FrameFlags.FRAGMENTED, stream_id=2)
    decoder = FrameDecoder(Role.CLIENT, limits=LIMITS)
    frames, errors = check_decoder_invariant(decoder, [piece] * 8)
    assert frames == [] and isinstance(errors[-1], FrameTooLarge)
    many = [
        reframe(0x0102, b"\x00" * 16, flags=FrameFlags.FRAGMENTED, stream_id=s) for s in range(8)
    ]
    decoder = FrameDecoder(Role.CLIENT, limits=LIMITS)
    frames, errors = check_decoder_invariant(decoder, many)
    assert frames == [] and errors and decoder.reassembly_bytes <= 4 * 16
