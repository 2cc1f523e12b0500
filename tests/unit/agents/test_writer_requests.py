"""Request handlers: each kind reaches its core, refusals become ERROR replies, appends the plan.

Spec references: 8.1 (send order), 7.5 / A.3 #21-#22 (membership, CONTROL seqs), 7.9 and
direction 4.3 (member slices per MailboxShard), 9.5.3 (history within the visible interval),
20.1 (tenant from the session).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from qim.agents.writer.partition import Plan
from qim.agents.writer.requests import handle_request
from qim.core.membership import audit_slices
from qim.schemas.frames.errors import ErrorCode
from qim.schemas.records import MembershipCommitted, MessageCommitted, WriterReply
from tests.unit.agents.support import (
    CTX,
    NOW,
    Log,
    admin,
    create,
    direct,
    group_on,
    history,
    leave,
    members,
    new_writer,
    partition_of,
    send,
)

P = 2


@pytest.fixture
def log(tmp_path: Path) -> Log:
    return Log(new_writer(tmp_path / "store", P))


def only_reply(plan: Plan) -> WriterReply:
    assert len(plan.replies) == 1, plan.replies
    return plan.replies[0]


def error(plan: Plan) -> ErrorCode:
    reply = only_reply(plan)
    assert reply.error is not None, reply
    return ErrorCode(reply.error.code)


def test_create_appends_the_group_publishes_its_slices_and_answers_the_first_page(
    log: Log,
) -> None:
    group = group_on(P)
    plan = log.run(create("alice", group, ("bob", "carol", "bob")))
    reply = only_reply(plan)
    assert reply.members is not None
    assert [m.user_id for m in reply.members.members] == ["alice", "bob", "carol"]
    assert [type(r) for r in plan.outbox] == [MembershipCommitted]
    state = log.writer.membership.group("acme", group)
    assert state is not None and audit_slices(state, plan.slices) == []
    assert {s.partition for s in plan.slices} == set(state.shards())
    assert error(log.run(create("bob", group, ()))) == ErrorCode.PERMISSION_DENIED


def test_sends_get_consecutive_seqs_and_a_leave_takes_one(log: Log) -> None:
    group = group_on(P)
    log.run(create("alice", group, ("bob",)))
    plan = log.run(send("alice", group, "a"), send("bob", group, "b"), leave("bob", group))
    acks = [r.send_ack for r in plan.replies[:2]]
    assert [a.conversation_seq for a in acks if a is not None] == [2, 3]  # the create is 1
    left = plan.replies[2]
    assert left.members is not None and left.members.total_hint == 1
    leave_record = plan.outbox[-1]
    assert isinstance(leave_record, MembershipCommitted) and leave_record.conversation_seq == 4
    assert plan.slices, "a leave publishes the new version's slices"
    after = log.run(send("alice", group, "c"))
    assert only_reply(after).send_ack is not None
    assert only_reply(after).send_ack.conversation_seq == 5  # type: ignore[union-attr]

    seen = only_reply(log.run(history("bob", group))).history
    assert seen is not None
    assert [m.conversation_seq for m in seen.messages] == [1, 2, 3]
    assert seen.latest_conversation_seq == 3
    everything = only_reply(log.run(history("alice", group))).history
    assert everything is not None
    assert [m.conversation_seq for m in everything.messages] == [1, 2, 3, 4, 5]


def test_strangers_and_other_tenants_are_refused(log: Log) -> None:
    group = group_on(P)
    log.run(create("alice", group, ("bob",)))
    log.run(send("alice", group, "secret"))
    denied = ErrorCode.PERMISSION_DENIED
    assert error(log.run(send("mallory", group, "x"))) == denied
    assert error(log.run(history("mallory", group))) == denied
    assert error(log.run(members("mallory", group))) == denied
    assert error(log.run(leave("mallory", group))) == denied
    for request in (
        send("alice", group, "y", tenant="other"),
        history("alice", group, tenant="other"),
    ):
        plan = Plan()
        handle_request(log.writer, CTX, request, NOW, plan)
        assert plan.outbox == [] and error(plan) in (denied, ErrorCode.SHARD_MOVED)


def test_a_direct_conversation_is_readable_by_its_participants_once_it_has_a_message(
    log: Log,
) -> None:
    for n in range(200):
        request = direct("alice", f"peer{n}", "hello")
        conversation = request.message.conversation_id
        if partition_of(conversation) == P:
            break
    peer = f"peer{n}"
    assert error(log.run(history("alice", conversation))) == ErrorCode.PERMISSION_DENIED
    assert only_reply(log.run(request)).send_ack is not None
    for user in ("alice", peer):
        batch = only_reply(log.run(history(user, conversation))).history
        assert batch is not None and [m.client_message_id for m in batch.messages] == ["hello"]
    assert error(log.run(history("mallory", conversation))) == ErrorCode.PERMISSION_DENIED
    assert (
        error(log.run(send("mallory", conversation, "x", peer=peer))) == ErrorCode.PERMISSION_DENIED
    )


def test_a_request_on_the_wrong_partition_is_never_applied(log: Log) -> None:
    elsewhere = group_on((P + 1) % 4)
    plan = log.run(create("alice", elsewhere, ()), send("alice", elsewhere, "x"))
    assert plan.outbox == []
    for reply in plan.replies:
        assert reply.error is not None and reply.error.code == ErrorCode.SHARD_MOVED
        assert (reply.error.retry_after_ms or 0) > 0


def test_the_admin_plane_adds_and_removes_and_is_answered_on_its_topic(log: Log) -> None:
    group = group_on(P)
    plan = log.run(admin("create", group, ("bob",)))
    assert plan.replies == [] and plan.admin_replies[0].membership_version == 1
    plan = log.run(admin("add", group, ("carol", "dave")))
    assert (plan.admin_replies[0].membership_version, plan.admin_replies[0].member_count) == (2, 4)
    assert plan.outbox[0].conversation_seq == 2  # the join's CONTROL message (create: 1)
    plan = log.run(admin("remove", group, ("dave",)), admin("add", group, ("carol",)))
    assert [a.member_count for a in plan.admin_replies] == [3, 3]
    assert len(plan.outbox) == 1, "adding a member twice changes nothing"
    plan = log.run(admin("promote", group, ("carol",)), admin("add", group, ("x",), reply=False))
    assert len(plan.admin_replies) == 1 and plan.admin_replies[0].error is not None
    assert log.writer.membership.is_member("acme", group, "x")


def test_a_group_id_must_have_the_group_form(log: Log) -> None:
    for bad in ("team", "d:" + "0" * 32):
        if partition_of(bad) == P:
            assert error(log.run(create("alice", bad, ()))) == ErrorCode.PERMISSION_DENIED


def test_records_carry_the_partition_writer_identity(log: Log) -> None:
    group = group_on(P)
    log.run(create("alice", group, ()))
    plan = log.run(send("alice", group, "a"))
    record = plan.outbox[0]
    assert isinstance(record, MessageCommitted)
    from qim.schemas.ids import split_message_id

    assert split_message_id(int.from_bytes(record.message_id, "big")).writer_id == P
