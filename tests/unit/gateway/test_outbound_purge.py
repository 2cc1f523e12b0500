"""At close, nothing of the real-time stream follows KICKED, but no frame is cut in half."""

from __future__ import annotations

from qim.gateway.transport.outbound import OutboundQueue
from qim.schemas.frames.opcodes import Stream


def test_purge_stream_keeps_control_and_completes_a_started_frame() -> None:
    q = OutboundQueue()
    q.push([b"H1", b"B1"], Stream.REALTIME)  # a SESSION_DELTA: header, body
    q.push([b"H2", b"B2"], Stream.REALTIME)
    assert q.pop() == b"H1"  # the first frame is now partly written
    q.push([b"KICKED"], Stream.CONTROL)
    q.purge_stream(Stream.REALTIME)
    assert [q.pop(), q.pop(), q.pop()] == [b"KICKED", b"B1", None]
    assert len(q) == 0 and q.buffered_bytes == 0


def test_purge_stream_drops_every_unstarted_frame() -> None:
    q = OutboundQueue()
    q.push([b"H1", b"B1"], Stream.REALTIME)
    q.push([b"PING"], Stream.CONTROL)
    q.purge_stream(Stream.REALTIME)
    assert [q.pop(), q.pop()] == [b"PING", None]
    assert len(q) == 0 and q.buffered_bytes == 0
