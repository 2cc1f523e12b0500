"""Record schemas: request envelope, outbox union, writer reply; keys and round trips."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from qim.core.conversation import direct_conversation_id
from qim.schemas import hash_input
from qim.schemas.frames import Error, ErrorCode, SendAck
from qim.schemas.records import (
    MessageCommitted,
    WriterReply,
    conversation_key,
    decode_conversation_request,
    decode_outbox_record,
    decode_writer_reply,
    encode_outbox_record,
    encode_record,
    user_key,
)
from qim.schemas.records.membership import MembershipCommitted, encode_membership_record

from .support import NOW, Groups, accepted, direct_request, writer


def test_keys_are_the_canonical_hash_input_of_tenant_and_id() -> None:
    assert conversation_key("acme", "g:team") == b"acme\x00g:team"
    assert user_key("acme", "alice") == hash_input("acme", "alice")
    with pytest.raises(ValueError):
        conversation_key("", "g:team")


def test_send_request_round_trips_and_is_keyed_by_conversation() -> None:
    request = direct_request("alice", "bob", payload=b"\x00\xff")
    data = encode_record(request)
    assert decode_conversation_request(data) == request
    assert request.key == conversation_key("acme", direct_conversation_id("acme", "alice", "bob"))


def test_outbox_record_round_trips_byte_identically() -> None:
    record = accepted(writer().handle_send(direct_request("alice", "bob"), NOW, Groups())).record
    data = encode_outbox_record(record)
    assert decode_outbox_record(data) == record
    assert encode_outbox_record(decode_outbox_record(data)) == data
    assert len(record.message_id) == 16 and record.committed_at == NOW


def test_outbox_union_decodes_membership_records_by_tag() -> None:
    record = MembershipCommitted(
        tenant_id="acme",
        group_id="g:team",
        action="leave",
        actor="bob",
        targets=("bob",),
        membership_version=2,
        member_count=2,
        conversation_seq=4,
        message_id=bytes(15) + b"\x01",
        last_activity_id=bytes(15) + b"\x01",
        committed_at=NOW,
    )
    assert decode_outbox_record(encode_membership_record(record)) == record


def test_outbox_decoder_ignores_unknown_fields_for_forward_compatibility() -> None:
    record = accepted(writer().handle_send(direct_request("alice", "bob"), NOW, Groups())).record
    as_map = msgspec.msgpack.decode(encode_outbox_record(record))
    as_map["added_by_a_newer_writer"] = 1
    assert decode_outbox_record(msgspec.msgpack.encode(as_map)) == record


def test_writer_reply_is_addressed_to_the_senders_connection_shard() -> None:
    reply = WriterReply(
        tenant_id="acme",
        user_id="alice",
        device_id="phone",
        session_epoch=3,
        connection_shard=17,
        request_id=9,
        error=Error(code=int(ErrorCode.RATE_LIMITED), retry_after_ms=50, request_id=9),
    )
    assert decode_writer_reply(encode_record(reply)) == reply
    assert reply.partition == 17 and reply.key == user_key("acme", "alice")


def test_writer_reply_carries_exactly_one_body() -> None:
    fields: dict[str, Any] = {
        "tenant_id": "acme",
        "user_id": "a",
        "device_id": "d",
        "session_epoch": 1,
        "connection_shard": 1,
        "request_id": 1,
    }
    with pytest.raises(ValueError):
        WriterReply(**fields)
    with pytest.raises(ValueError):
        WriterReply(send_ack=SendAck(), error=Error(), **fields)


def test_message_committed_is_frozen() -> None:
    record = accepted(writer().handle_send(direct_request("alice", "bob"), NOW, Groups())).record
    assert isinstance(record, MessageCommitted)
    with pytest.raises(AttributeError):
        record.conversation_seq = 2  # type: ignore[misc]
