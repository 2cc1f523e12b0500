"""Header boundaries of App. A.1 and §20.1: magic, CRC32C over the header only, body_len limit."""

from __future__ import annotations

import struct

import crc32c
import pytest

from qim.schemas.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    HEADER_SIZE,
    BadHeaderCrc,
    BadMagic,
    ErrorCode,
    FrameDecoder,
    FrameHeader,
    FrameTooLarge,
    Ping,
    Role,
    TrailingData,
    TruncatedFrame,
    decode_header,
    decode_message,
    encode_frame,
    negotiate_version,
)


def test_crc32c_is_castagnoli() -> None:
    """A.1 says CRC32C: the standard check value of "123456789" is 0xE3069283."""
    assert crc32c.crc32c(b"123456789") == 0xE3069283


def test_header_is_20_bytes_big_endian_in_a1_field_order() -> None:
    header = FrameHeader(
        opcode=0x0A04, body_len=9, request_id=0xDEADBEEF, stream_id=2, flags=0x09, version=1
    )
    raw = header.pack()
    assert len(raw) == HEADER_SIZE == 20
    fields = struct.unpack(">HBBHIHII", raw)
    assert fields[:7] == (0x514D, 1, 0x09, 0x0A04, 0xDEADBEEF, 2, 9)
    assert fields[7] == crc32c.crc32c(raw[:16])
    assert decode_header(raw) == header


def test_bad_magic_is_refused_and_closes() -> None:
    raw = bytearray(FrameHeader(opcode=3, body_len=0).pack())
    raw[0] = 0x00
    with pytest.raises(BadMagic) as info:
        decode_header(raw)
    assert info.value.close and info.value.to_error_frame() is None


@pytest.mark.parametrize("position", range(20))
def test_any_single_bit_flip_in_the_header_is_caught(position: int) -> None:
    raw = bytearray(FrameHeader(opcode=3, body_len=0).pack())
    raw[position] ^= 0x10
    with pytest.raises((BadMagic, BadHeaderCrc)):
        decode_header(raw)


def test_body_is_not_crc_checked() -> None:
    """A.1: the CRC covers the header only, so a shared body is never rescanned (§10.3)."""
    frame = bytearray(encode_frame(Ping(network_type="wifi")))
    frame[-1] ^= 0x01  # inside the "wifi" string: still valid msgpack and utf-8
    decoded = decode_message(bytes(frame), Role.SERVER)
    assert decoded.header.opcode == 0x0003


def test_body_len_equal_to_max_is_accepted() -> None:
    header = FrameHeader(opcode=3, body_len=DEFAULT_MAX_FRAME_BYTES).pack()
    assert decode_header(header).body_len == DEFAULT_MAX_FRAME_BYTES


def test_body_len_max_plus_one_is_refused_with_payload_too_large() -> None:
    """§20.1: over max_frame_bytes -> ERROR{PAYLOAD_TOO_LARGE} and close, judged on body_len."""
    header = FrameHeader(opcode=3, body_len=DEFAULT_MAX_FRAME_BYTES + 1, request_id=5).pack()
    with pytest.raises(FrameTooLarge) as info:
        decode_header(header)
    assert info.value.close and info.value.request_id == 5
    error = info.value.to_error_frame()
    assert error is not None and error.code == ErrorCode.PAYLOAD_TOO_LARGE and error.request_id == 5


def test_max_frame_bytes_is_an_argument() -> None:
    header = FrameHeader(opcode=3, body_len=11).pack()
    assert decode_header(header, max_frame_bytes=11).body_len == 11
    with pytest.raises(FrameTooLarge):
        decode_header(header, max_frame_bytes=10)


def test_truncated_header_waits_for_more() -> None:
    frame = encode_frame(Ping(ping_id=1))
    decoder = FrameDecoder(Role.SERVER)
    for i in range(HEADER_SIZE - 1):
        decoder.receive_data(frame[i : i + 1])
        assert decoder.next_frame() is None
    decoder.receive_data(frame[HEADER_SIZE - 1 :])
    assert decoder.next_frame() is not None


def test_truncated_body_waits_for_more() -> None:
    frame = encode_frame(Ping(ping_id=1, network_type="cellular"))
    decoder = FrameDecoder(Role.SERVER)
    decoder.receive_data(frame[:-1])
    assert decoder.next_frame() is None
    assert decoder.buffered_bytes == len(frame) - 1 - HEADER_SIZE
    decoder.receive_data(frame[-1:])
    frame_out = decoder.next_frame()
    assert frame_out is not None and frame_out.header.body_len == len(frame) - HEADER_SIZE
    assert decoder.next_frame() is None and decoder.buffered_bytes == 0


def test_websocket_message_must_be_exactly_one_frame() -> None:
    frame = encode_frame(Ping(ping_id=1))
    with pytest.raises(TruncatedFrame):
        decode_message(frame[:10], Role.SERVER)
    with pytest.raises(TruncatedFrame):
        decode_message(frame[:-1], Role.SERVER)
    with pytest.raises(TrailingData):
        decode_message(frame + frame, Role.SERVER)


def test_header_error_is_sticky_because_framing_is_lost() -> None:
    decoder = FrameDecoder(Role.SERVER)
    decoder.receive_data(b"XX" + bytes(18))
    with pytest.raises(BadMagic):
        decoder.next_frame()
    decoder.receive_data(encode_frame(Ping()))
    assert decoder.buffered_bytes == 0
    with pytest.raises(BadMagic):
        decoder.next_frame()


def test_reserved_flag_bits_are_carried_not_rejected() -> None:
    frame = encode_frame(Ping(), flags=0xF0 | 0x08)
    assert decode_message(frame, Role.SERVER).header.flags == 0xF8


def test_version_negotiation_takes_the_minimum() -> None:
    """§27.1.1: Ve = min(Vc, Vs); a client below every supported version gets None."""
    assert negotiate_version(3, (1, 2)) == 2
    assert negotiate_version(1, (1, 2)) == 1
    assert negotiate_version(1, (2, 3)) is None


def test_decoder_does_not_judge_the_version() -> None:
    """AUTH carries the client's highest Vc, which may exceed ours; the session decides."""
    decoded = decode_message(encode_frame(Ping(), version=7), Role.SERVER)
    assert decoded.header.version == 7
