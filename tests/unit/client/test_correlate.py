"""Request correlation without I/O: fresh ids, reply matching, the two content matches."""

from __future__ import annotations

from qim.client import EXPECTED_REPLIES, RequestTable
from qim.client.correlate import stamp_request_id
from qim.schemas.frames import (
    Body,
    Error,
    ErrorCode,
    Frame,
    FrameHeader,
    MailboxBatch,
    OnlineReady,
    Ping,
    Pong,
    PullMailbox,
    SendAck,
    SendMessage,
    SyncComplete,
    encode_body,
    spec_for_model,
)


def reply(body: Body, request_id: int) -> Frame:
    raw = encode_body(body)
    header = FrameHeader(spec_for_model(type(body)).opcode, len(raw), request_id, 0, 0, 1)
    return Frame(header, body, raw)


def test_request_ids_are_fresh_nonzero_and_skip_in_flight_ones_a1() -> None:
    table: RequestTable[str] = RequestTable()
    table._next = 0xFFFF_FFFF  # about to wrap
    first = table.open(PullMailbox(), "a")
    second = table.open(PullMailbox(), "b")
    assert (first, second) == (0xFFFF_FFFF, 1)
    table._next = 1  # 1 is still in flight
    assert table.open(PullMailbox(), "c") == 2


def test_reply_matches_by_header_request_id_once() -> None:
    table: RequestTable[str] = RequestTable()
    rid = table.open(PullMailbox(), "w")
    match = table.match(reply(MailboxBatch(), rid))
    assert match is not None and match.waiter == "w" and match.frame_name == "PULL_MAILBOX"
    assert table.match(reply(MailboxBatch(), rid)) is None  # a duplicate is not a reply


def test_error_with_header_zero_matches_by_its_body_request_id_a4_21() -> None:
    table: RequestTable[str] = RequestTable()
    rid = table.open(SendMessage(), "w")
    match = table.match(reply(Error(code=ErrorCode.RATE_LIMITED, request_id=rid), 0))
    assert match is not None and match.request_id == rid


def test_pong_with_request_id_zero_matches_its_ping_id() -> None:
    table: RequestTable[str] = RequestTable()
    table.open(Ping(ping_id=1), "one")
    table.open(Ping(ping_id=2), "two")
    match = table.match(reply(Pong(ping_id=2), 0))
    assert match is not None and match.waiter == "two"
    assert table.match(reply(Pong(ping_id=9), 0)) is None


def test_online_ready_with_request_id_zero_completes_sync_complete_9_3() -> None:
    table: RequestTable[str] = RequestTable()
    table.open(PullMailbox(), "pull")
    table.open(SyncComplete(sync_to_seq=5), "sync")
    match = table.match(reply(OnlineReady(), 0))
    assert match is not None and match.waiter == "sync"


def test_expects_the_appendix_a_reply_or_error() -> None:
    table: RequestTable[str] = RequestTable()
    rid = table.open(SendMessage(), "w")
    match = table.match(reply(SendAck(), rid))
    assert match is not None
    assert match.expects(SendAck()) and match.expects(Error())
    assert not match.expects(MailboxBatch())
    assert EXPECTED_REPLIES[SendMessage] == (SendAck,)


def test_discard_only_removes_its_own_waiter_and_drain_empties() -> None:
    table: RequestTable[str] = RequestTable()
    rid = table.open(PullMailbox(), "w")
    table.discard(rid, "someone else")
    assert len(table) == 1
    assert table.drain() == ["w"] and len(table) == 0


def test_send_message_body_repeats_the_header_request_id_a3_4() -> None:
    assert stamp_request_id(SendMessage(), 42) == SendMessage(request_id=42)
    assert stamp_request_id(PullMailbox(after_seq=1), 42) == PullMailbox(after_seq=1)
