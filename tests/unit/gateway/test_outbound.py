"""Outbound scheduling across A.5 streams: control never waits behind bulk (§15.4.2, §15.4.3)."""

from __future__ import annotations

from qim.gateway.transport.outbound import OutboundQueue
from qim.schemas.frames import (
    HEADER_SIZE,
    Frame,
    FrameDecoder,
    FrameFlags,
    MailboxBatch,
    Pong,
    PushEvents,
    Role,
    Stream,
    decode_header,
    encode_fragments,
    encode_frame,
)

CHUNK = 64 * 1024


def big_batch() -> list[bytes]:
    """A MAILBOX_BATCH of about 4 MiB cut into 64 KiB FRAGMENTED pieces."""
    from qim.schemas.frames import SyncEntry

    entry = SyncEntry(body_included=True, payload_or_ciphertext=b"x" * 4000)
    batch = MailboxBatch(entries=tuple(entry for _ in range(1000)))
    return encode_fragments(batch, 1, chunk_bytes=CHUNK)


def test_a_pong_queued_after_a_4_mib_batch_is_written_first() -> None:
    queue = OutboundQueue()
    pieces = big_batch()
    assert sum(len(p) for p in pieces) > 4_000_000 and len(pieces) > 60
    queue.push(pieces, Stream.BULK)
    pong = encode_frame(Pong(ping_id=1))
    queue.push([pong], Stream.CONTROL)
    assert queue.pop() == pong


def test_a_pong_waits_behind_at_most_the_piece_already_being_written() -> None:
    queue = OutboundQueue()
    pieces = big_batch()
    queue.push(pieces, Stream.BULK)
    first = queue.pop()  # one piece is already on its way when the PONG arrives
    pong = encode_frame(Pong(ping_id=1))
    queue.push([pong], Stream.CONTROL)
    assert first == pieces[0]
    assert queue.pop() == pong  # waits behind at most one <= 64 KiB piece
    assert all(len(p) <= CHUNK + HEADER_SIZE for p in pieces)


def test_pieces_are_complete_frames_and_reassemble_in_order() -> None:
    """Every piece is a whole frame (frame boundaries = piece boundaries) and the receiver
    rebuilds the batch even with control frames between the pieces."""
    queue = OutboundQueue()
    pieces = big_batch()
    queue.push(pieces, Stream.BULK)
    decoder = FrameDecoder(Role.CLIENT)
    got = []
    for i in range(10 * len(pieces)):
        if i % 10 == 3 and i < 5 * len(pieces):
            queue.push([encode_frame(Pong(ping_id=i))], Stream.CONTROL)
        piece = queue.pop()
        if piece is None:
            break
        header = decode_header(piece)
        assert header.body_len == len(piece) - HEADER_SIZE
        frame = decoder.receive_message(piece)
        if isinstance(frame, Frame):
            got.append(frame.body)
    batches = [b for b in got if isinstance(b, MailboxBatch)]
    assert len(batches) == 1 and len(batches[0].entries) == 1000
    assert sum(isinstance(b, Pong) for b in got) == len(got) - 1


def test_fragments_of_one_stream_stay_contiguous() -> None:
    queue = OutboundQueue()
    bulk = big_batch()
    queue.push(bulk, Stream.BULK)
    queue.push([encode_frame(MailboxBatch())], Stream.BULK)
    queue.push([encode_frame(PushEvents())] * 3, Stream.REALTIME)
    out = [p for p in iter(queue.pop, None) if decode_header(p).stream_id == Stream.BULK]
    assert out[: len(bulk)] == bulk
    flags = [decode_header(p).flags & FrameFlags.FRAGMENTED for p in out]
    assert flags == [FrameFlags.FRAGMENTED] * (len(bulk) - 1) + [0, 0]


def test_realtime_gets_more_turns_than_bulk_and_room_is_not_starved() -> None:
    queue = OutboundQueue()
    for stream in (Stream.REALTIME, Stream.BULK, Stream.ROOM):
        queue.push([bytes([stream]) * 10] * 20, stream)
    order = [queue.pop()[0] for _ in range(14)]  # type: ignore[index]
    assert order == [1, 1, 1, 1, 2, 2, 3, 1, 1, 1, 1, 2, 2, 3]


def test_buffered_bytes_and_batches() -> None:
    queue = OutboundQueue()
    queue.push([b"a" * 10, b"b" * 10], Stream.REALTIME)
    queue.push([b"c" * 5], Stream.CONTROL)
    assert queue.buffered_bytes == 25 and len(queue) == 3
    assert queue.pop_batch(12) == [b"c" * 5, b"a" * 10]
    assert queue.pop_batch(1) == [b"b" * 10] and queue.pop() is None
    assert queue.buffered_bytes == 0
    queue.push([encode_frame(PushEvents())], Stream.REALTIME)
    queue.clear()
    assert queue.pop() is None and len(queue) == 0
