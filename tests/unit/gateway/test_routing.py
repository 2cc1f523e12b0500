"""Frames -> conversation-request envelopes (qim.gateway.routing.rules), pure.

Invariants: identity always comes from the authenticated session, never the frame (§20.1); the
partition is ``conversation_partition(tenant, conversation, count)`` (direction.md §3); a
malformed conversation id is PERMISSION_DENIED exactly like a stranger's (§20.2.2, A.3 #22).
"""

from __future__ import annotations

import msgspec
import pytest

from qim.core.conversation.ids import direct_conversation_id
from qim.gateway.ports import AuthGrant
from qim.gateway.routing.rules import Routed, denied, route_frame
from qim.schemas.frames import (
    Body,
    CreateGroup,
    Edit,
    Error,
    ErrorCode,
    Frame,
    FrameDecoder,
    LeaveGroup,
    PullHistory,
    PullMailbox,
    PullMembers,
    Recall,
    Role,
    SendMessage,
    spec_for_model,
)
from qim.schemas.records.requests import (
    AmendRequest,
    CreateGroupRequest,
    LeaveGroupRequest,
    PullHistoryRequest,
    PullMembersRequest,
    SendRequest,
    conversation_partition,
    decode_conversation_request,
)
from tests.unit.gateway.session_support import raw_frame, wire

GRANT = AuthGrant("t1", "alice", "phone", session_epoch=42)
SHARD = 17
COUNT = 16
DIRECT = direct_conversation_id("t1", "alice", "bob")


def decoded(data: bytes) -> Frame:
    frame = FrameDecoder(Role.SERVER).receive_message(data)
    assert isinstance(frame, Frame)
    return frame


def route(body: Body, request_id: int = 9) -> Routed | Error | None:
    frame = decoded(wire(body, request_id))
    return route_frame(frame, GRANT, connection_shard=SHARD, partition_count=COUNT)


def routed(body: Body, request_id: int = 9) -> Routed:
    result = route(body, request_id)
    assert isinstance(result, Routed), result
    return result


def test_send_message_becomes_a_send_request_with_the_sessions_identity() -> None:
    message = SendMessage(
        request_id=9, client_message_id="m1", conversation_id="g:team", payload=b"hi"
    )
    out = routed(message)
    assert out.kind == "send"
    assert out.request == SendRequest(
        tenant_id="t1",
        sender_id="alice",
        sender_device_id="phone",
        session_epoch=42,
        connection_shard=SHARD,
        request_id=9,
        message=message,
    )
    assert out.partition == conversation_partition("t1", "g:team", COUNT)
    assert out.key == out.request.key
    assert decode_conversation_request(out.value) == out.request


def test_a_frame_that_lies_about_identity_changes_nothing() -> None:
    """§20.1: unknown body keys naming another sender/tenant and a body request_id that differs
    from the header are ignored; the envelope carries the session's identity and the header's
    request_id (A.1 pairs the reply by it)."""
    fields = msgspec.structs.asdict(
        SendMessage(request_id=1234, client_message_id="m", conversation_id=DIRECT)
    )
    fields |= {"sender_id": "mallory", "tenant_id": "evil", "session_epoch": 99, "user_id": "x"}
    opcode = spec_for_model(SendMessage).opcode
    frame = decoded(raw_frame(opcode, msgspec.msgpack.encode(fields), request_id=5))
    out = route_frame(frame, GRANT, connection_shard=SHARD, partition_count=COUNT)
    assert isinstance(out, Routed) and isinstance(out.request, SendRequest)
    request = out.request
    assert (request.tenant_id, request.sender_id, request.sender_device_id) == (
        "t1",
        "alice",
        "phone",
    )
    assert (request.session_epoch, request.connection_shard, request.request_id) == (42, SHARD, 5)
    assert out.partition == conversation_partition("t1", DIRECT, COUNT)


def test_peer_user_id_of_a_direct_send_is_carried() -> None:
    out = routed(SendMessage(client_message_id="m", conversation_id=DIRECT, peer_user_id="bob"))
    assert isinstance(out.request, SendRequest) and out.request.peer_user_id == "bob"


@pytest.mark.parametrize(
    ("body", "envelope", "conversation"),
    [
        (PullHistory(conversation_id="g:team", limit=20), PullHistoryRequest, "g:team"),
        (PullMembers(conversation_id="g:team", filter="admin"), PullMembersRequest, "g:team"),
        (CreateGroup(group_id="g:new", member_ids=("bob",)), CreateGroupRequest, "g:new"),
        (LeaveGroup(group_id="g:team"), LeaveGroupRequest, "g:team"),
        (PullHistory(conversation_id=DIRECT), PullHistoryRequest, DIRECT),
    ],
)
def test_reads_and_group_frames_map_to_their_envelopes(
    body: Body, envelope: type, conversation: str
) -> None:
    out = routed(body, request_id=3)
    request = out.request
    assert isinstance(request, envelope)
    assert request == envelope(
        tenant_id="t1",
        user_id="alice",
        device_id="phone",
        session_epoch=42,
        connection_shard=SHARD,
        request_id=3,
        message=body,
    )
    assert out.partition == conversation_partition("t1", conversation, COUNT)


@pytest.mark.parametrize(
    "body",
    [
        SendMessage(client_message_id="m", conversation_id="c"),
        SendMessage(client_message_id="m", conversation_id=""),
        SendMessage(client_message_id="m", conversation_id="x:team"),
        SendMessage(client_message_id="m", conversation_id="g:"),
        SendMessage(client_message_id="m", conversation_id="d:abc"),
        SendMessage(client_message_id="m", conversation_id="D:" + "0" * 32),
        SendMessage(client_message_id="m", conversation_id="g:" + "x" * 200),
        PullHistory(conversation_id="team"),
        PullMembers(conversation_id="d:zz"),
        CreateGroup(group_id=DIRECT),
        LeaveGroup(group_id="team"),
    ],
)
def test_malformed_ids_are_denied_like_a_stranger_without_forwarding(body: Body) -> None:
    """The answer is byte-identical to the writer's non-member ERROR (empty detail)."""
    out = route(body, request_id=11)
    assert out == Error(code=int(ErrorCode.PERMISSION_DENIED), request_id=11) == denied(11)


def test_frames_of_other_services_are_not_routed_here() -> None:
    assert route(PullMailbox(after_seq=0)) is None


def test_one_conversation_always_maps_to_one_partition_whatever_the_session() -> None:
    """Two gateways, two users of one group: the same partition (the single writer, §6.3)."""
    other = AuthGrant("t1", "bob", "laptop", session_epoch=1)
    frame = decoded(wire(SendMessage(client_message_id="m", conversation_id="g:team"), 1))
    a = route_frame(frame, GRANT, connection_shard=3, partition_count=COUNT)
    b = route_frame(frame, other, connection_shard=200, partition_count=COUNT)
    assert isinstance(a, Routed) and isinstance(b, Routed)
    assert a.partition == b.partition and a.key == b.key


@pytest.mark.parametrize(
    "body",
    [
        Recall(conversation_id="g:team", target_conversation_seq=5),
        Edit(conversation_id=DIRECT, target_conversation_seq=5, new_payload=b"v2"),
    ],
)
def test_13_4_recall_and_edit_become_amend_requests_at_the_conversations_partition(
    body: Recall | Edit,
) -> None:
    out = routed(body)
    edit = isinstance(body, Edit)
    assert out.kind == ("edit" if edit else "recall")
    assert out.request == AmendRequest(
        tenant_id="t1",
        user_id="alice",
        device_id="phone",
        session_epoch=42,
        connection_shard=SHARD,
        request_id=9,
        action="edit" if edit else "recall",
        conversation_id=body.conversation_id,
        target_conversation_seq=5,
        new_payload=b"v2" if edit else b"",
    )
    assert out.partition == conversation_partition("t1", body.conversation_id, COUNT)
    assert decode_conversation_request(out.value) == out.request
    assert route(Recall(conversation_id="nonsense", target_conversation_seq=5)) == denied(9)
