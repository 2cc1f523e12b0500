"""The conversation-requests / to-gateway / admin-replies envelopes (direction.md section 3)."""

from __future__ import annotations

from typing import Any

import blake3
import pytest

from qim.schemas.frames import (
    CreateGroup,
    Error,
    HistoryBatch,
    LeaveGroup,
    MemberListBatch,
    PullHistory,
    PullMembers,
    SendAck,
)
from qim.schemas.records import (
    AdminGroupRequest,
    AdminReply,
    AdminReplyTo,
    CreateGroupRequest,
    LeaveGroupRequest,
    PullHistoryRequest,
    PullMembersRequest,
    WriterReply,
    conversation_key,
    conversation_partition,
    decode_admin_reply,
    decode_conversation_request,
    decode_writer_reply,
    encode_record,
)

ORIGIN: dict[str, Any] = {
    "tenant_id": "t1",
    "user_id": "u1",
    "device_id": "d1",
    "session_epoch": 7,
    "connection_shard": 3,
    "request_id": 9,
}


def test_conversation_partition_is_deterministic_and_in_range() -> None:
    seen = {conversation_partition("t1", f"g:{i}", 16) for i in range(200)}
    assert seen <= set(range(16)) and len(seen) == 16  # spread over every partition
    assert conversation_partition("t1", "g:a", 16) == conversation_partition("t1", "g:a", 16)
    digest = blake3.blake3(conversation_key("t1", "g:a")).digest()
    expected = int.from_bytes(digest[:8], "big") % 16
    assert conversation_partition("t1", "g:a", 16) == expected
    with pytest.raises(ValueError):
        conversation_partition("t1", "g:a", 0)


def test_tenants_are_separate_keys_and_usually_separate_partitions() -> None:
    assert conversation_key("t1", "g:a") != conversation_key("t2", "g:a")


@pytest.mark.parametrize(
    "request_",
    [
        PullHistoryRequest(**ORIGIN, message=PullHistory(conversation_id="g:a", limit=5)),
        PullMembersRequest(**ORIGIN, message=PullMembers(conversation_id="g:a", filter="all")),
        CreateGroupRequest(**ORIGIN, message=CreateGroup(group_id="g:a", member_ids=("u2",))),
        LeaveGroupRequest(**ORIGIN, message=LeaveGroup(group_id="g:a")),
        AdminGroupRequest(
            tenant_id="t1",
            group_id="g:a",
            action="add",
            actor="ops",
            member_ids=("u3",),
            reply_to=AdminReplyTo(node_id="n1", correlation_id="c1"),
        ),
    ],
)
def test_every_request_kind_round_trips_with_its_tag(request_: Any) -> None:
    data = encode_record(request_)
    assert decode_conversation_request(data) == request_
    assert request_.key == conversation_key("t1", "g:a")


@pytest.mark.parametrize(
    "body",
    [
        {"send_ack": SendAck(request_id=9, client_message_id="c", conversation_seq=1)},
        {"error": Error(code=15)},
        {"history": HistoryBatch(latest_conversation_seq=4)},
        {"members": MemberListBatch(total_hint=2)},
    ],
)
def test_a_writer_reply_carries_exactly_one_body(body: dict[str, Any]) -> None:
    reply = WriterReply(**ORIGIN, **body)
    assert decode_writer_reply(encode_record(reply)) == reply
    assert reply.body is next(iter(body.values()))
    assert reply.partition == 3


def test_a_writer_reply_with_no_body_or_two_bodies_is_refused() -> None:
    with pytest.raises(ValueError):
        WriterReply(**ORIGIN)
    with pytest.raises(ValueError):
        WriterReply(**ORIGIN, error=Error(code=15), members=MemberListBatch())


def test_admin_reply_round_trips() -> None:
    reply = AdminReply(node_id="n1", correlation_id="c1", membership_version=4, member_count=3)
    assert decode_admin_reply(encode_record(reply)) == reply
    assert reply.key == b"n1"
