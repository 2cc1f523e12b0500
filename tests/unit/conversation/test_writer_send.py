"""ConversationWriterState.handle_send: membership, size, inline body, replies (spec 8.1-8.4)."""

from __future__ import annotations

import pytest

from qim.core.conversation import (
    Accepted,
    Rejected,
    direct_conversation_id,
)
from qim.schemas.frames import ErrorCode

from .support import (
    NOW,
    Groups,
    accepted,
    commit,
    direct_request,
    send_request,
    writer,
)


def _code(decision: object) -> ErrorCode:
    assert isinstance(decision, Rejected), decision
    return decision.code


def _id(data: bytes) -> int:
    return int.from_bytes(data, "big")


# -- 8.1 step 1: membership -------------------------------------------------------------------


def test_8_1_non_member_and_unknown_group_are_indistinguishable_permission_denied() -> None:
    groups = Groups()
    groups.add("g:team", ["alice"])
    state = writer()
    stranger = state.handle_send(send_request("mallory", "g:team"), NOW, groups)
    missing = state.handle_send(send_request("mallory", "g:nope"), NOW, groups)
    assert _code(stranger) is _code(missing) is ErrorCode.PERMISSION_DENIED
    assert stranger.reply.error == missing.reply.error
    assert state.snapshot() == writer().snapshot()


def test_8_1_direct_membership_is_implied_by_the_deterministic_id() -> None:
    state = writer()
    conv = direct_conversation_id("acme", "alice", "bob")
    assert isinstance(commit(state, send_request("alice", conv, peer="bob")), Accepted)
    assert isinstance(commit(state, send_request("bob", conv, "b1", peer="alice")), Accepted)
    for sender, peer in [("carol", "bob"), ("carol", "alice"), ("alice", ""), ("alice", "carol")]:
        assert _code(commit(state, send_request(sender, conv, peer=peer))) is (
            ErrorCode.PERMISSION_DENIED
        )
    assert _code(commit(state, send_request("alice", "not-an-id"))) is ErrorCode.PERMISSION_DENIED


def test_8_1_tenant_isolation_same_user_id_in_another_tenant_is_a_stranger() -> None:
    groups = Groups()
    groups.add("g:team", ["alice"], tenant="acme")
    state = writer()
    assert _code(
        state.handle_send(send_request("alice", "g:team", tenant="evil"), NOW, groups)
    ) is (ErrorCode.PERMISSION_DENIED)
    conv = direct_conversation_id("acme", "alice", "bob")
    other = send_request("alice", conv, tenant="evil", peer="bob")
    assert _code(state.handle_send(other, NOW, groups)) is ErrorCode.PERMISSION_DENIED
    # same group id in both tenants: two conversations, two heads, two seq spaces
    groups.add("g:team", ["alice"], tenant="evil")
    a = accepted(commit(state, send_request("alice", "g:team"), NOW, groups))
    b = accepted(commit(state, send_request("alice", "g:team", tenant="evil"), NOW, groups))
    assert a.record.conversation_seq == b.record.conversation_seq == 1


def test_8_1_note_to_self_is_a_one_participant_direct_conversation() -> None:
    record = accepted(commit(writer(), direct_request("alice", "alice"))).record
    assert record.participants == ("alice",) and record.member_count == 1


# -- 8.1 step 2: size -------------------------------------------------------------------------


def test_8_1_payload_too_large_boundary_is_32_kib() -> None:
    state = writer()
    ok = commit(state, direct_request("alice", "bob", "a", payload=b"x" * 32 * 1024))
    assert isinstance(ok, Accepted)
    before = state.snapshot()
    big = state.handle_send(
        direct_request("alice", "bob", "b", payload=b"x" * (32 * 1024 + 1)), NOW, Groups()
    )
    assert _code(big) is ErrorCode.PAYLOAD_TOO_LARGE
    assert state.snapshot() == before


def test_8_1_membership_is_checked_before_size() -> None:
    huge = send_request("mallory", "g:team", payload=b"x" * 40_000)
    assert _code(writer().handle_send(huge, NOW, Groups())) is ErrorCode.PERMISSION_DENIED


# -- ADR-0005 inline body ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("members", "size", "retention", "inline"),
    [
        (3, 1024, "default", True),  # spec example: 3-member chat, 1 KiB
        (100, 1024, "default", False),  # spec example: 100-member group, 1 KiB
        (13, 600, "default", True),  # 26.3.7: 13 x 600 = 7800 <= 8 KiB
        (14, 600, "default", False),  # 26.3.7: 14 x 600 = 8400 > 8 KiB
        (2, 2048, "default", True),
        (2, 2049, "default", False),  # above inline_body_max_bytes, any N
        (2, 10, "ephemeral_24h", False),
        (2, 10, "compliance_hold", False),
    ],
)
def test_adr_0005_inline_body_decided_once_by_the_writer(
    members: int, size: int, retention: str, inline: bool
) -> None:
    groups = Groups()
    groups.add("g:team", [f"u{i}" for i in range(members)])
    decision = commit(
        writer(),
        send_request("u0", "g:team", payload=b"x" * size),
        NOW,
        groups,
        retention_class=retention,  # type: ignore[arg-type]
    )
    record = accepted(decision).record
    assert record.inline_body is inline and record.retention_class == retention


# -- 8.4 replies ------------------------------------------------------------------------------


def test_8_4_send_ack_has_all_five_fields_and_replies_reach_the_senders_connection() -> None:
    request = direct_request("alice", "bob", "cm-5", request_id=77)
    decision = accepted(writer().handle_send(request, NOW, Groups()))
    ack = decision.reply.send_ack
    assert ack is not None and decision.reply.error is None
    assert (ack.request_id, ack.client_message_id, ack.conversation_seq) == (77, "cm-5", 1)
    assert ack.message_id == decision.record.message_id
    assert ack.last_activity_id == decision.record.last_activity_id
    reply = decision.reply
    assert (reply.tenant_id, reply.user_id, reply.device_id) == ("acme", "alice", "phone")
    assert (reply.session_epoch, reply.connection_shard, reply.request_id) == (7, 42, 77)
    assert decision.record_key == b"acme\x00" + decision.record.conversation_id.encode()
    refused = writer().handle_send(send_request("mallory", "g:x", request_id=78), NOW, Groups())
    assert isinstance(refused, Rejected) and refused.reply.error is not None
    assert refused.reply.error.request_id == 78 and refused.reply.connection_shard == 42
