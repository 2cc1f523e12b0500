"""Sans-I/O frame decoding: bytes in, frames out, no sockets and no event loop (h11-style).

Two drivers share one object. A TCP/TLS stream calls ``receive_data(chunk)`` and then
``next_frame()`` until it returns None. A WebSocket carries one frame per binary message and
calls ``receive_message(message)``. Both run the same header check, fragment reassembly,
direction check and body decode.

The invariant (fuzzed in tests/unit/frames/test_fuzz.py): every input either yields frames or
raises :class:`ProtocolError`; and once ``next_frame()`` returns None the decoder holds less
than ``HEADER_SIZE + max_frame_bytes`` unparsed octets plus at most ``max_reassembly_streams``
reassemblies of at most ``max_frame_bytes`` each. The header - magic, CRC, body_len - is
checked as soon as its 20 octets are in, before any of the body is waited for (§20.1).

Tolerance (§27.1.2): an unknown opcode yields :class:`UnknownFrame` with its raw body, skipped
by body_len; unknown body fields are ignored by msgspec; ``raw_body`` keeps the exact bytes so a
relay writes back fields it does not know instead of dropping them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import msgspec

from qim.schemas.frames.base import Body
from qim.schemas.frames.connection import Error
from qim.schemas.frames.errors import ErrorCode
from qim.schemas.frames.exceptions import (
    FragmentError,
    FrameTooLarge,
    HeaderError,
    MalformedBody,
    TrailingData,
    TruncatedFrame,
    UnsupportedFlags,
)
from qim.schemas.frames.header import HEADER_SIZE, FrameFlags, FrameHeader, decode_header
from qim.schemas.frames.limits import DEFAULT_LIMITS, Limits, check_limits
from qim.schemas.frames.opcodes import Role, check_direction, spec_for_model

__all__ = [
    "Decompress",
    "Frame",
    "FrameDecoder",
    "UnknownFrame",
    "decode_message",
]

# (compressed body, max output octets) -> body; must raise ValueError on bad input or overflow.
Decompress = Callable[[bytes, int], bytes]

_DECODERS: Final[dict[type[Body], msgspec.msgpack.Decoder[Body]]] = {}


def _decoder_for(model: type[Body]) -> msgspec.msgpack.Decoder[Body]:
    decoder = _DECODERS.get(model)
    if decoder is None:
        decoder = _DECODERS[model] = msgspec.msgpack.Decoder(model)
    return decoder


@dataclass(frozen=True, slots=True)
class Frame:
    """A decoded frame of a known opcode; ``raw_body`` is the msgpack body it came from."""

    header: FrameHeader
    body: Body
    raw_body: bytes = field(repr=False)

    @property
    def name(self) -> str:
        return spec_for_model(type(self.body)).name


@dataclass(frozen=True, slots=True)
class UnknownFrame:
    """An opcode this build does not know: skip it and count unknown_opcode_dropped (§27.1.2).

    A server answers ERROR{UPGRADE_REQUIRED} when ``header.request_id != 0``; nobody closes.
    """

    header: FrameHeader
    raw_body: bytes = field(repr=False)

    def server_reply(self) -> Error | None:
        """What a server sends back: ERROR{UPGRADE_REQUIRED} iff a reply is awaited."""
        if self.header.request_id == 0:
            return None
        return Error(
            code=int(ErrorCode.UPGRADE_REQUIRED),
            detail=f"unknown opcode 0x{self.header.opcode:04X}",
            request_id=self.header.request_id,
        )


@dataclass(slots=True)
class _Reassembly:
    first: FrameHeader
    pieces: list[bytes]
    size: int


class FrameDecoder:
    """Incremental decoder for the frames one peer receives; ``role`` is the side it runs on."""

    def __init__(
        self,
        role: Role,
        *,
        limits: Limits = DEFAULT_LIMITS,
        decompress: Decompress | None = None,
    ) -> None:
        self.role = role
        self.limits = limits
        self._sender = Role.CLIENT if role is Role.SERVER else Role.SERVER
        self._decompress = decompress
        self._buf = bytearray()
        self._header: FrameHeader | None = None
        self._failed: HeaderError | None = None
        self._partial: dict[int, _Reassembly] = {}
        self._cap = limits.max_frame_bytes
        self._max_streams = limits.max_reassembly_streams

    def restrict(self, max_frame_bytes: int) -> None:
        """Until :meth:`lift`: one reassembly at most, no body or reassembly above
        ``max_frame_bytes`` (the server before AUTH_OK: ``Limits.pre_auth_max_frame_bytes``)."""
        self._cap = min(max_frame_bytes, self.limits.max_frame_bytes)
        self._max_streams = 1

    def lift(self) -> None:
        """Back to the full ``Limits`` (after AUTH_OK)."""
        self._cap = self.limits.max_frame_bytes
        self._max_streams = self.limits.max_reassembly_streams

    @property
    def max_frame_bytes(self) -> int:
        """The largest body or reassembly accepted now."""
        return self._cap

    @property
    def buffered_bytes(self) -> int:
        """Unparsed stream octets held; < HEADER_SIZE + max_frame_bytes once drained."""
        return len(self._buf)

    @property
    def reassembly_bytes(self) -> int:
        """Octets held in fragment reassemblies; each stream's <= max_frame_bytes."""
        return sum(p.size for p in self._partial.values())

    @property
    def incomplete_streams(self) -> frozenset[int]:
        """Streams mid-reassembly; the driver arms frag_assembly_timeout (30 s) while non-empty."""
        return frozenset(self._partial)

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Feed stream octets. After a header error nothing more is kept: framing is lost."""
        if self._failed is None:
            self._buf += data

    def next_frame(self) -> Frame | UnknownFrame | None:
        """The next complete frame, or None until more data arrives."""
        while True:
            if self._failed is not None:
                raise self._failed
            header = self._header
            if header is None:
                if len(self._buf) < HEADER_SIZE:
                    return None
                try:
                    header = self._admit(bytes(self._buf[:HEADER_SIZE]))
                except HeaderError as exc:
                    self._failed = exc
                    self._buf.clear()
                    self._partial.clear()
                    raise
                del self._buf[:HEADER_SIZE]
                self._header = header
            if len(self._buf) < header.body_len:
                return None
            with memoryview(self._buf) as view:
                body = bytes(view[: header.body_len])
            del self._buf[: header.body_len]
            self._header = None
            frame = self._complete(header, body)
            if frame is not None:
                return frame

    def receive_message(
        self, message: bytes | bytearray | memoryview
    ) -> Frame | UnknownFrame | None:
        """One WebSocket binary message = exactly one frame; None for a non-final fragment."""
        if self._buf or self._header is not None:
            raise RuntimeError("receive_message() mixed with receive_data() on one decoder")
        header = self._admit(bytes(message[:HEADER_SIZE]))
        actual = len(message) - HEADER_SIZE
        if actual < header.body_len:
            raise TruncatedFrame(
                f"body_len {header.body_len} but {actual} octets follow",
                request_id=header.request_id,
                opcode=header.opcode,
            )
        if actual > header.body_len:
            raise TrailingData(
                f"{actual - header.body_len} octets after the frame",
                request_id=header.request_id,
                opcode=header.opcode,
            )
        return self._complete(header, bytes(message[HEADER_SIZE:]))

    def _admit(self, raw_header: bytes) -> FrameHeader:
        """Check a header before its body is awaited, including the reassembly budget."""
        cap = self._cap
        header = decode_header(raw_header, max_frame_bytes=cap)
        partial = self._partial.get(header.stream_id)
        if partial is not None and partial.size + header.body_len > cap:
            raise FrameTooLarge(
                f"reassembled body would exceed max_frame_bytes {cap}",
                request_id=header.request_id,
                opcode=header.opcode,
            )
        return header

    def _complete(self, header: FrameHeader, body: bytes) -> Frame | UnknownFrame | None:
        """Fold fragments per stream; a whole body goes on to be decoded."""
        more = bool(header.flags & FrameFlags.FRAGMENTED)
        partial = self._partial.get(header.stream_id)
        if partial is None:
            if not more:
                return self._decode(header, body)
            if len(self._partial) >= self._max_streams:
                raise FragmentError(
                    f"more than {self._max_streams} concurrent reassemblies",
                    request_id=header.request_id,
                    opcode=header.opcode,
                )
            self._partial[header.stream_id] = _Reassembly(header, [body], len(body))
            return None
        first = partial.first
        if (header.opcode, header.request_id, header.version) != (
            first.opcode,
            first.request_id,
            first.version,
        ):
            del self._partial[header.stream_id]
            raise FragmentError(
                f"opcode 0x{header.opcode:04X} interleaved into a fragmented "
                f"0x{first.opcode:04X} on stream {header.stream_id}",
                request_id=header.request_id,
                opcode=header.opcode,
            )
        partial.pieces.append(body)
        partial.size += len(body)
        if more:
            return None
        del self._partial[header.stream_id]
        whole = b"".join(partial.pieces)
        merged = FrameHeader(
            opcode=first.opcode,
            body_len=len(whole),
            request_id=first.request_id,
            stream_id=first.stream_id,
            flags=first.flags & ~int(FrameFlags.FRAGMENTED),
            version=first.version,
        )
        return self._decode(merged, whole)

    def _decode(self, header: FrameHeader, body: bytes) -> Frame | UnknownFrame:
        rid, op = header.request_id, header.opcode
        spec = check_direction(op, self._sender)
        if spec is None:
            return UnknownFrame(header, body)  # skipped as it came, compressed or not
        if header.flags & FrameFlags.COMPRESSED:
            body = self._inflate(header, body)
        model = spec.model_sent_by(self._sender)
        assert model is not None  # check_direction guarantees it
        try:
            value = _decoder_for(model).decode(body)
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise MalformedBody(f"{spec.name}: {exc}", request_id=rid, opcode=op) from None
        if self.role is Role.SERVER:
            check_limits(value, self.limits, request_id=rid, opcode=op)
        return Frame(header, value, body)

    def _inflate(self, header: FrameHeader, body: bytes) -> bytes:
        rid, op = header.request_id, header.opcode
        if header.flags & FrameFlags.ENCRYPTED:
            raise UnsupportedFlags("ENCRYPTED frames are never compressed (B.5)", request_id=rid)
        if self._decompress is None:
            raise UnsupportedFlags("COMPRESSED frame but no compression negotiated", request_id=rid)
        limit = self.limits.max_frame_bytes
        try:
            out = self._decompress(body, limit)
        except ValueError as exc:
            raise MalformedBody(
                f"body does not decompress: {exc}", request_id=rid, opcode=op
            ) from None
        if len(out) > limit:
            raise FrameTooLarge(f"decompressed body over {limit}", request_id=rid, opcode=op)
        return out


def decode_message(
    message: bytes | bytearray | memoryview,
    role: Role,
    *,
    limits: Limits = DEFAULT_LIMITS,
    decompress: Decompress | None = None,
) -> Frame | UnknownFrame:
    """Stateless one-frame decode (a WebSocket message); fragments need a FrameDecoder."""
    frame = FrameDecoder(role, limits=limits, decompress=decompress).receive_message(message)
    if frame is None:
        raise FragmentError("fragmented frame needs a stateful FrameDecoder")
    return frame
