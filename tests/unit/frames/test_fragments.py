"""Fragmentation (A.5/B.5 stream chunks), compression (B.5), field limits and encode errors."""

from __future__ import annotations

import zlib

import pytest

from qim.schemas.frames import (
    DEFAULT_CHUNK_BYTES,
    HEADER_SIZE,
    EncodeError,
    ErrorCode,
    FragmentError,
    Frame,
    FrameDecoder,
    FrameFlags,
    LimitExceeded,
    Limits,
    MailboxBatch,
    MalformedBody,
    Ping,
    Pong,
    PresenceSub,
    Role,
    RtcSignal,
    SendMessage,
    SyncEntry,
    UnsupportedFlags,
    decode_message,
    encode_body,
    encode_fragments,
    encode_frame,
    frame_bytes,
    u128_to_bytes,
)
from tests.unit.frames.support import body_of
from tests.unit.frames.test_fuzz import inflate


def big_batch(n: int = 2000) -> MailboxBatch:
    entries = tuple(
        SyncEntry(
            mailbox_seq=i,
            event_id=i * 7,
            message_id=u128_to_bytes(i << 64),
            conversation_id=f"conv-{i % 17}",
            body_included=True,
            payload_or_ciphertext=b"p" * 40,
        )
        for i in range(n)
    )
    return MailboxBatch(entries=entries, covered_through_seq=n, has_more=True)


def test_fragments_reassemble_and_pong_on_stream_0_is_not_blocked() -> None:
    """A 4 MiB-class batch on stream 2 is cut into chunks; a PONG slips in between (A.5)."""
    batch = big_batch()
    pieces = encode_fragments(batch, request_id=4, chunk_bytes=DEFAULT_CHUNK_BYTES // 4)
    assert len(pieces) > 2
    assert all(int.from_bytes(p[3:4], "big") & FrameFlags.FRAGMENTED for p in pieces[:-1])
    assert not int.from_bytes(pieces[-1][3:4], "big") & FrameFlags.FRAGMENTED
    pong = encode_frame(Pong(ping_id=1))
    decoder = FrameDecoder(Role.CLIENT)
    decoder.receive_data(pieces[0] + pong + b"".join(pieces[1:]))
    first, second = decoder.next_frame(), decoder.next_frame()
    assert isinstance(first, Frame) and first.body == Pong(ping_id=1)
    assert isinstance(second, Frame) and second.body == batch
    assert second.header.request_id == 4 and second.header.stream_id == 2
    assert not second.header.flags & FrameFlags.FRAGMENTED
    assert decoder.next_frame() is None and decoder.incomplete_streams == frozenset()


def test_websocket_messages_carry_fragments_through_receive_message() -> None:
    batch = big_batch(300)
    pieces = encode_fragments(batch, chunk_bytes=1000)
    decoder = FrameDecoder(Role.CLIENT)
    results = [decoder.receive_message(p) for p in pieces]
    assert results[:-1] == [None] * (len(pieces) - 1)
    assert decoder.incomplete_streams == frozenset()
    last = results[-1]
    assert isinstance(last, Frame) and last.body == batch
    with pytest.raises(FragmentError):
        decode_message(pieces[0], Role.CLIENT)  # stateless helper cannot reassemble


def test_small_body_is_one_unfragmented_piece() -> None:
    pieces = encode_fragments(Ping(ping_id=1))
    assert pieces == [encode_frame(Ping(ping_id=1))]


def test_interleaving_another_opcode_into_a_fragmented_stream_is_refused() -> None:
    pieces = encode_fragments(big_batch(300), chunk_bytes=1000)
    intruder = frame_bytes(0x0203, encode_body(MailboxBatch()), stream_id=2)
    decoder = FrameDecoder(Role.CLIENT)
    decoder.receive_data(pieces[0] + intruder)
    with pytest.raises(FragmentError) as info:
        decoder.next_frame()
    assert info.value.close


def test_compressed_body_needs_a_negotiated_codec() -> None:
    frame = encode_frame(big_batch(50), compress=zlib.compress)
    assert int.from_bytes(frame[3:4], "big") & FrameFlags.COMPRESSED
    with pytest.raises(UnsupportedFlags):
        decode_message(frame, Role.CLIENT)
    decoded = decode_message(frame, Role.CLIENT, decompress=inflate)
    assert isinstance(decoded, Frame) and decoded.body == big_batch(50)


def test_decompression_bomb_is_refused() -> None:
    bomb = zlib.compress(b"\x80" + b"\x00" * 100_000)
    frame = frame_bytes(0x0102, bomb, flags=FrameFlags.COMPRESSED)
    with pytest.raises(MalformedBody):
        decode_message(
            frame, Role.CLIENT, limits=Limits(max_frame_bytes=50_000), decompress=inflate
        )


def test_encrypted_frames_are_never_compressed() -> None:
    with pytest.raises(EncodeError):
        encode_frame(Ping(), flags=FrameFlags.ENCRYPTED, compress=zlib.compress)
    frame = frame_bytes(0x0003, b"\x80", flags=FrameFlags.ENCRYPTED | FrameFlags.COMPRESSED)
    with pytest.raises(UnsupportedFlags):
        decode_message(frame, Role.SERVER, decompress=inflate)


def test_custom_type_over_64_octets_is_refused_but_the_connection_lives() -> None:
    """B.5 custom_type_max_bytes = 64 (UTF-8 octets), refused with PAYLOAD_TOO_LARGE."""
    ok = SendMessage(request_id=8, custom_type="x" * 64)
    assert body_of(encode_frame(ok, request_id=8), Role.SERVER) == ok
    too_long = SendMessage(request_id=8, custom_type="é" * 33)  # 66 octets
    decoder = FrameDecoder(Role.SERVER)
    decoder.receive_data(encode_frame(too_long, request_id=8) + encode_frame(Ping()))
    with pytest.raises(LimitExceeded) as info:
        decoder.next_frame()
    assert not info.value.close and info.value.request_id == 8
    assert info.value.code is ErrorCode.PAYLOAD_TOO_LARGE
    assert isinstance(decoder.next_frame(), Frame)  # the connection goes on


def test_limits_are_constructor_arguments() -> None:
    small = Limits(custom_type_max_bytes=4, rtc_signal_max_bytes=2, presence_sub_max_targets=1)
    with pytest.raises(LimitExceeded):
        decode_message(encode_frame(SendMessage(custom_type="abcde")), Role.SERVER, limits=small)
    with pytest.raises(LimitExceeded):
        decode_message(encode_frame(RtcSignal(signal_payload=b"abc")), Role.SERVER, limits=small)
    with pytest.raises(LimitExceeded) as info:
        decode_message(encode_frame(PresenceSub(targets=("a", "b"))), Role.SERVER, limits=small)
    assert info.value.code is ErrorCode.RATE_LIMITED  # §13.2: never silently truncated


def test_rtc_signal_limit_defaults_to_8_kib() -> None:
    with pytest.raises(LimitExceeded):
        decode_message(encode_frame(RtcSignal(signal_payload=bytes(8193))), Role.SERVER)
    decode_message(encode_frame(RtcSignal(signal_payload=bytes(8192))), Role.SERVER)


def test_encoding_what_cannot_be_sent_is_our_error_not_the_peers() -> None:
    with pytest.raises(EncodeError):
        encode_frame(big_batch(), max_frame_bytes=1000)
    with pytest.raises(EncodeError):
        encode_frame(SyncEntry())  # a nested struct, not a frame body
    with pytest.raises(EncodeError):
        encode_frame(Ping(), request_id=2**32)
    with pytest.raises(EncodeError):
        encode_frame(Ping(), flags=FrameFlags.FRAGMENTED)
    with pytest.raises(EncodeError):
        encode_frame(Ping(), flags=FrameFlags.COMPRESSED)


def test_shared_body_is_encoded_once_and_framed_per_socket() -> None:
    """§10.3: one body, many 20-octet headers; the CRC covers only the header (A.1)."""
    body = encode_body(big_batch(10))
    frames = [frame_bytes(0x0203, body, request_id=0, stream_id=1) for _ in range(3)]
    assert all(f[HEADER_SIZE:] is not None and f[HEADER_SIZE:] == body for f in frames)
