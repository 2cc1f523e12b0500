"""The 20-byte frame header of App. A.1, and nothing that needs a socket.

Wire grammar (all integers big-endian, "network order")::

    frame      = header body
    header     = magic version flags opcode request_id stream_id body_len header_crc   ; 20 bytes
    magic      = %x51.4D          ; u16, "QM"
    version    = u8               ; application major version (Ve after AUTH_OK, §27.1.1)
    flags      = u8               ; bit0 COMPRESSED, bit1 FRAGMENTED, bit2 ENCRYPTED,
                                  ; bit3 ACK_REQUIRED, bits 4-7 reserved (ignored, kept)
    opcode     = u16              ; frame type, ranges in App. A.2 (see opcodes.py)
    request_id = u32              ; pairs a request with its reply; 0 for server-initiated frames
    stream_id  = u16              ; multiplexing stream, App. A.5
    body_len   = u32              ; octets of body that follow; <= max_frame_bytes
    header_crc = u32              ; CRC32C (Castagnoli) over the first 16 header octets
    body       = body_len OCTET   ; msgpack map (base.py); no CRC, TLS covers it (A.1)

The byte order and field order are the layout docs/01 may fix (A.1 leaves them open); this
module fixes them. magic + version are the layout-invariant prefix: a future major version may
change what follows, never those three octets.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntFlag
from typing import Final

import crc32c

from qim.schemas.frames.exceptions import (
    BadHeaderCrc,
    BadMagic,
    EncodeError,
    FrameTooLarge,
    TruncatedFrame,
)

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "HEADER_SIZE",
    "MAGIC",
    "PROTOCOL_VERSION",
    "SUPPORTED_VERSIONS",
    "FrameFlags",
    "FrameHeader",
    "decode_header",
    "negotiate_version",
]

MAGIC: Final = 0x514D
PROTOCOL_VERSION: Final = 1
SUPPORTED_VERSIONS: Final[tuple[int, ...]] = (1,)
DEFAULT_MAX_FRAME_BYTES: Final = 4 * 1024 * 1024  # App. B.5 max_frame_bytes

# The 16 CRC-covered octets, field by field:
#   >   big-endian, no padding
#   H   magic       u16
#   B   version     u8
#   B   flags       u8
#   H   opcode      u16
#   I   request_id  u32
#   H   stream_id   u16
#   I   body_len    u32
_COVERED: Final = struct.Struct(">HBBHIHI")
#   I   header_crc  u32  (CRC32C of the 16 octets above)
_CRC: Final = struct.Struct(">I")
HEADER_SIZE: Final = _COVERED.size + _CRC.size  # 20, as A.1's field widths add up

_U16: Final = 0xFFFF
_U32: Final = 0xFFFF_FFFF


class FrameFlags(IntFlag):
    """Header flag bits (A.1). Unknown bits are carried, never rejected (§27.1.2)."""

    NONE = 0
    COMPRESSED = 0x01
    FRAGMENTED = 0x02  # "more fragments follow" on this stream; clear on the final piece
    ENCRYPTED = 0x04  # payload fields hold E2EE ciphertext; never combined with COMPRESSED
    ACK_REQUIRED = 0x08


@dataclass(frozen=True, slots=True)
class FrameHeader:
    """A decoded header; magic and CRC are implied by a successful decode."""

    opcode: int
    body_len: int
    request_id: int = 0
    stream_id: int = 0
    flags: int = 0
    version: int = PROTOCOL_VERSION

    def pack(self) -> bytes:
        """Serialize with a fresh CRC; an out-of-range field is our bug, so EncodeError."""
        if not (
            0 <= self.version <= 0xFF
            and 0 <= self.flags <= 0xFF
            and 0 <= self.opcode <= _U16
            and 0 <= self.request_id <= _U32
            and 0 <= self.stream_id <= _U16
            and 0 <= self.body_len <= _U32
        ):
            raise EncodeError(f"header field out of range: {self!r}")
        covered = _COVERED.pack(
            MAGIC,
            self.version,
            self.flags,
            self.opcode,
            self.request_id,
            self.stream_id,
            self.body_len,
        )
        return covered + _CRC.pack(crc32c.crc32c(covered))

    def has(self, flag: FrameFlags) -> bool:
        return bool(self.flags & flag)


def decode_header(
    data: bytes | bytearray | memoryview,
    *,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
) -> FrameHeader:
    """Parse and verify the first HEADER_SIZE octets of ``data``.

    The checks run in wire order - magic, CRC, then body_len - so a frame whose body_len is
    over the limit is refused before a single body octet is buffered (§20.1: judge by
    body_len before decoding, never allocate first). Fewer than HEADER_SIZE octets is a
    TruncatedFrame: whatever the input, only ProtocolError comes out.
    """
    if len(data) < HEADER_SIZE:
        raise TruncatedFrame(f"a header needs {HEADER_SIZE} octets, got {len(data)}")
    magic, version, flags, opcode, request_id, stream_id, body_len = _COVERED.unpack_from(data)
    if magic != MAGIC:
        raise BadMagic(f"bad magic 0x{magic:04X}, expected 0x{MAGIC:04X}")
    (crc,) = _CRC.unpack_from(data, _COVERED.size)
    expected = crc32c.crc32c(bytes(data[: _COVERED.size]))
    if crc != expected:
        raise BadHeaderCrc(f"header CRC 0x{crc:08X} != computed 0x{expected:08X}")
    if body_len > max_frame_bytes:
        raise FrameTooLarge(
            f"body_len {body_len} > max_frame_bytes {max_frame_bytes}", request_id=request_id
        )
    return FrameHeader(
        opcode=opcode,
        body_len=body_len,
        request_id=request_id,
        stream_id=stream_id,
        flags=flags,
        version=version,
    )


def negotiate_version(
    client_max: int, server_versions: tuple[int, ...] = SUPPORTED_VERSIONS
) -> int | None:
    """Ve = min(Vc, Vs) (§27.1.1); None when the server no longer speaks it (UPGRADE_REQUIRED)."""
    effective = min(client_max, max(server_versions))
    return effective if effective in server_versions else None
