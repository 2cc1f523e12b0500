"""The user-requests envelopes and the MailboxReply on to-gateway (their wire contract).

Invariants: every request kind and the reply round-trip through msgpack unchanged; a reply
carries exactly one body, on construction and on decode; the user-requests decoder also takes
the gateway's PRESENCE_STALE; a reply is told apart from the other to-gateway kinds by its tag;
``mailbox_partition`` is the spec 5.2 mapping of the routing module.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from qim.schemas import mailbox_shard_id, user_bucket
from qim.schemas.frames import Error, ErrorCode, MailboxBatch, MailboxCursor, PullMailbox
from qim.schemas.records.push import PresenceStale, decode_to_gateway, encode_push_record
from qim.schemas.records.requests import WriterReply, encode_record, user_key
from qim.schemas.records.user_requests import (
    AuthSyncResult,
    MailboxReply,
    PullMailboxRequest,
    SyncAuthRequest,
    decode_gateway_bound,
    decode_mailbox_reply,
    decode_user_request,
    encode_user_record,
    mailbox_partition,
)

SESSION: dict[str, Any] = {
    "tenant_id": "t",
    "user_id": "u",
    "device_id": "d",
    "session_epoch": 3,
    "connection_shard": 17,
}


def test_requests_round_trip_with_their_kind_tags() -> None:
    auth = SyncAuthRequest(
        **SESSION,
        request_id=1,
        correlation_id="login-1",
        cursor=MailboxCursor(token=b"tok", last_applied_mailbox_seq=9),
    )
    pull = PullMailboxRequest(**SESSION, message=PullMailbox(after_seq=4, max_items=10))
    for request in (auth, pull):
        assert decode_user_request(encode_user_record(request)) == request
    assert msgspec.msgpack.decode(encode_user_record(auth))["kind"] == "sync_auth"
    assert msgspec.msgpack.decode(encode_user_record(pull))["kind"] == "pull_mailbox"
    assert auth.key == user_key("t", "u")
    new_device = SyncAuthRequest(**SESSION)
    decoded = decode_user_request(encode_user_record(new_device))
    assert isinstance(decoded, SyncAuthRequest) and decoded.cursor is None


def test_presence_stale_shares_the_user_requests_topic() -> None:
    stale = PresenceStale(
        tenant_id="t", user_id="u", device_id="d", connection_id="c", observed_epoch=2,
        reason="epoch_mismatch", mailbox_shard=5,
    )  # fmt: skip
    assert decode_user_request(encode_push_record(stale)) == stale


def test_reply_has_exactly_one_body_on_construction_and_on_decode() -> None:
    sync = AuthSyncResult(kind="new_device", lane_id=3, lane_watermark=10, sync_to_seq=10)
    for body in (
        {"auth_sync": sync},
        {"mailbox_batch": MailboxBatch(covered_through_seq=10, lane_watermark=10)},
        {"error": Error(code=int(ErrorCode.SHARD_MOVED), retry_after_ms=1000)},
    ):
        reply = MailboxReply(**SESSION, mailbox_shard=4, **body)
        decoded = decode_mailbox_reply(encode_user_record(reply))
        assert decoded == reply and decoded.body == next(iter(body.values()))
        assert reply.partition == 17
    with pytest.raises(ValueError, match="exactly one"):
        MailboxReply(**SESSION)
    with pytest.raises(ValueError, match="exactly one"):
        MailboxReply(**SESSION, auth_sync=sync, error=Error(code=1))
    raw = msgspec.msgpack.encode({"kind": "mailbox_reply", **SESSION})
    with pytest.raises(msgspec.ValidationError):
        decode_mailbox_reply(raw)


def test_reply_tag_is_not_taken_for_another_to_gateway_kind() -> None:
    reply = MailboxReply(**SESSION, error=Error(code=6))
    with pytest.raises(msgspec.ValidationError):
        decode_to_gateway(encode_user_record(reply))  # gateways without the handler skip it
    assert decode_gateway_bound(encode_user_record(reply)) == reply
    writer = WriterReply(**SESSION, request_id=1, error=Error(code=8))
    assert decode_gateway_bound(encode_record(writer)) == writer


def test_auth_ok_carries_the_sync_fields_and_the_cursor_token() -> None:
    sync = AuthSyncResult(
        kind="resume", lane_id=3, lane_watermark=12, trim_watermark=2, sync_to_seq=12,
        has_offline=True, pending_entry_count_hint=4, pending_bytes_hint=400, start_seq=8,
        mailbox_cursor_token=b"signed",
    )  # fmt: skip
    ok = sync.auth_ok(session_epoch=99)
    assert (ok.session_epoch, ok.lane_id, ok.sync_to_seq, ok.trim_watermark) == (99, 3, 12, 2)
    assert (ok.has_offline, ok.pending_entry_count_hint, ok.mailbox_cursor_token) == (
        True,
        4,
        b"signed",
    )


@pytest.mark.parametrize("user", ["alice", "bob", "u-123", "ü"])
def test_mailbox_partition_is_the_routing_mask_mapping(user: str) -> None:
    expected = mailbox_shard_id(user_bucket("t", user, 65536), 64)
    assert (
        mailbox_partition("t", user, virtual_bucket_count=65536, mailbox_shard_count=64) == expected
    )
