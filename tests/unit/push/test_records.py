"""PushBatch / PresenceStale records: tags, partitions, keys, round trips (11.1, 5.4.3)."""

from __future__ import annotations

import msgspec
import pytest

from qim.schemas.frames import SendAck
from qim.schemas.records.push import (
    STALE_EPOCH_MISMATCH,
    PresenceStale,
    PushBatch,
    PushBody,
    PushRecipient,
    decode_presence_stale,
    decode_push_body,
    decode_to_gateway,
    encode_push_body,
    encode_push_record,
    push_batch_key,
)
from qim.schemas.records.requests import WriterReply, encode_record, user_key

from .support import ACTIVITY_ID, MESSAGE_ID, T


def _batch(**overrides: object) -> PushBatch:
    fields: dict[str, object] = {
        "tenant_id": T,
        "connection_shard": 17,
        "mailbox_shard": 5,
        "message_id": MESSAGE_ID,
        "conversation_id": "g:big",
        "conversation_seq": 7,
        "last_activity_id": ACTIVITY_ID,
        "sender_id": "alice",
        "created_at": 1,
        "body_included": True,
        "common_encoded_body": encode_push_body(
            PushBody(message_type=1, payload_or_ciphertext=b"hi")
        ),
        "recipients": (
            PushRecipient(
                connection_id="c1", session_epoch=3, user_id="bob", device_id="d", mailbox_seq=9
            ),
        ),
    }
    fields.update(overrides)
    return PushBatch(**fields)  # type: ignore[arg-type]


def test_11_1_push_batch_is_tagged_and_shares_to_gateway_with_writer_reply() -> None:
    batch = _batch()
    reply = WriterReply(
        tenant_id=T,
        user_id="bob",
        device_id="d",
        session_epoch=3,
        connection_shard=17,
        request_id=1,
        send_ack=SendAck(),
    )
    assert msgspec.msgpack.decode(encode_push_record(batch))["kind"] == "push_batch"
    assert decode_to_gateway(encode_push_record(batch)) == batch
    assert decode_to_gateway(encode_record(reply)) == reply


def test_11_1_push_batch_partition_is_the_connection_shard_and_key_the_conversation() -> None:
    batch = _batch()
    assert batch.partition == 17
    assert batch.key == push_batch_key(T, "g:big") == b"t1\x00g:big"


def test_11_1_push_body_is_the_a41_body_part_only() -> None:
    body = PushBody(message_type=1, custom_type="poll", payload_or_ciphertext=b"x")
    assert decode_push_body(encode_push_body(body)) == body
    assert set(msgspec.msgpack.decode(encode_push_body(body))) == {
        "message_type",
        "custom_type",
        "payload_or_ciphertext",
    }


def test_5_4_3_presence_stale_goes_to_the_batch_mailbox_shard_keyed_by_user() -> None:
    stale = PresenceStale(
        tenant_id=T,
        user_id="bob",
        device_id="d",
        connection_id="c1",
        observed_epoch=3,
        reason=STALE_EPOCH_MISMATCH,
        mailbox_shard=5,
    )
    assert stale.partition == 5
    assert stale.key == user_key(T, "bob")
    assert decode_presence_stale(encode_push_record(stale)) == stale
    assert msgspec.msgpack.decode(encode_push_record(stale))["kind"] == "presence_stale"


def test_27_2_1_unknown_fields_and_reasons_still_decode() -> None:
    raw = msgspec.msgpack.decode(encode_push_record(_batch()))
    raw["new_field"] = 1
    raw["recipients"][0]["new_header"] = "x"
    assert decode_to_gateway(msgspec.msgpack.encode(raw)) == _batch()
    stale = {
        "kind": "presence_stale",
        "tenant_id": T,
        "user_id": "u",
        "device_id": "d",
        "connection_id": "c",
        "observed_epoch": 1,
        "reason": "some_future_reason",
        "mailbox_shard": 0,
    }
    assert decode_presence_stale(msgspec.msgpack.encode(stale)).reason == "some_future_reason"


def test_a6_priority_takes_only_push_classes() -> None:
    raw = msgspec.msgpack.decode(encode_push_record(_batch()))
    raw["priority"] = "chatroom"
    with pytest.raises(msgspec.ValidationError):
        decode_to_gateway(msgspec.msgpack.encode(raw))
