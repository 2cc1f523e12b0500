"""Frame encoding, and the decoding entry points re-exported from decoder.py.

``encode_frame`` is the whole path for one frame. The split ``encode_body`` + ``frame_bytes``
exists for §10.3's "encode the shared body once": the body of a group push is encoded one time
and each socket only gets its own 20-byte header (the CRC covers the header alone, A.1).
``encode_fragments`` cuts a large body into ``stream_write_chunk_bytes`` pieces so a 4 MiB
MAILBOX_BATCH on stream 2 cannot hold PONG on stream 0 back (A.5, B.5).

Fragments: FRAGMENTED means "more pieces follow on this stream"; the last piece has it clear.
All pieces of one frame share opcode, request_id, stream_id and version, are contiguous on
their stream, and compression (if any) applies to the whole body before cutting.

Encoding failures are ours, so they raise :class:`EncodeError`, never a ProtocolError.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import msgspec

from qim.schemas.frames.base import Body
from qim.schemas.frames.decoder import Frame, FrameDecoder, UnknownFrame, decode_message
from qim.schemas.frames.exceptions import EncodeError
from qim.schemas.frames.header import (
    DEFAULT_MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    FrameFlags,
    FrameHeader,
)
from qim.schemas.frames.opcodes import FrameSpec, spec_for_model

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "Compress",
    "Frame",
    "FrameDecoder",
    "UnknownFrame",
    "decode_message",
    "encode_body",
    "encode_fragments",
    "encode_frame",
    "frame_bytes",
]

Compress = Callable[[bytes], bytes]
DEFAULT_CHUNK_BYTES: Final = 64 * 1024  # B.5 stream_write_chunk_bytes

_ENCODER: Final = msgspec.msgpack.Encoder()


def encode_body(body: Body) -> bytes:
    """The msgpack map of one body (defaults omitted)."""
    try:
        return _ENCODER.encode(body)
    except (OverflowError, TypeError, msgspec.EncodeError) as exc:
        raise EncodeError(f"{type(body).__name__}: {exc}") from None


def frame_bytes(
    opcode: int,
    body: bytes,
    *,
    request_id: int = 0,
    stream_id: int = 0,
    flags: int = 0,
    version: int = PROTOCOL_VERSION,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
) -> bytes:
    """Header + an already-encoded body; relays and shared-body pushes start here."""
    if len(body) > max_frame_bytes:
        raise EncodeError(f"body of {len(body)} octets > max_frame_bytes {max_frame_bytes}")
    return FrameHeader(opcode, len(body), request_id, stream_id, int(flags), version).pack() + body


def _prepare(
    frame_model: Body, flags: int, compress: Compress | None
) -> tuple[FrameSpec, bytes, int]:
    try:
        spec = spec_for_model(type(frame_model))
    except KeyError:
        raise EncodeError(f"{type(frame_model).__name__} is not a frame body") from None
    if flags & FrameFlags.FRAGMENTED:
        raise EncodeError("set FRAGMENTED through encode_fragments(), not by hand")
    body = encode_body(frame_model)
    if compress is not None:
        body = compress(body)
        flags |= FrameFlags.COMPRESSED
    elif flags & FrameFlags.COMPRESSED:
        raise EncodeError("COMPRESSED flag without a compress function")
    if flags & FrameFlags.COMPRESSED and flags & FrameFlags.ENCRYPTED:
        raise EncodeError("ENCRYPTED frames are never compressed (B.5)")
    return spec, body, flags


def encode_frame(
    frame_model: Body,
    request_id: int = 0,
    stream_id: int | None = None,
    flags: int = 0,
    version: int = PROTOCOL_VERSION,
    *,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    compress: Compress | None = None,
) -> bytes:
    """One complete frame; ``stream_id`` None = the frame's default stream (opcodes.py)."""
    spec, body, flags = _prepare(frame_model, flags, compress)
    return frame_bytes(
        spec.opcode,
        body,
        request_id=request_id,
        stream_id=spec.stream if stream_id is None else stream_id,
        flags=flags,
        version=version,
        max_frame_bytes=max_frame_bytes,
    )


def encode_fragments(
    frame_model: Body,
    request_id: int = 0,
    stream_id: int | None = None,
    flags: int = 0,
    version: int = PROTOCOL_VERSION,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    compress: Compress | None = None,
) -> list[bytes]:
    """The frame cut into pieces of at most ``chunk_bytes`` body octets (one if it fits)."""
    if chunk_bytes <= 0:
        raise EncodeError(f"chunk_bytes must be positive, got {chunk_bytes}")
    spec, body, flags = _prepare(frame_model, flags, compress)
    if len(body) > max_frame_bytes:
        raise EncodeError(f"body of {len(body)} octets > max_frame_bytes {max_frame_bytes}")
    stream = spec.stream if stream_id is None else stream_id
    starts = range(0, max(len(body), 1), chunk_bytes)
    last = starts[-1]
    return [
        frame_bytes(
            spec.opcode,
            body[start : start + chunk_bytes],
            request_id=request_id,
            stream_id=stream,
            flags=flags if start == last else flags | FrameFlags.FRAGMENTED,
            version=version,
            max_frame_bytes=max_frame_bytes,
        )
        for start in starts
    ]
