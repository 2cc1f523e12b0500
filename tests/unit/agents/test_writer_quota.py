"""The ConversationWriter refuses a join by a user at ``max_conversations_per_user`` (I-26).

Through ``handle_request`` on a real partition (RocksDB): the refusal is
``ERROR{PERMISSION_DENIED, conversation_quota_exhausted}``, nothing is appended (so the outbox
replay is unaffected), and requests that join nobody new are served as before.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Collection
from pathlib import Path
from types import SimpleNamespace

import pytest
from aiokafka import TopicPartition

from qim.agents.writer.partition import PartitionWriter, Plan
from qim.agents.writer.requests import handle_request
from qim.agents.writer.user_quota import UserQuotaFollower
from qim.core.conversation import direct_conversation_id
from qim.core.conversation.quota import QUOTA_EXHAUSTED, UserKey
from qim.schemas.frames.errors import ErrorCode
from qim.schemas.records import ConversationRequest
from qim.schemas.records.membership import MembershipAction
from qim.schemas.records.user_quota import UserQuota, encode_user_quota
from tests.unit.agents.support import (
    CTX,
    NOW,
    TENANT,
    admin,
    create,
    direct,
    group_on,
    new_writer,
    partition_of,
)

P = 1


def _peer_on(user: str, partition: int) -> str:
    """A peer whose direct conversation with ``user`` lives on ``partition``."""
    for n in itertools.count():
        peer = f"peer{n}"
        if partition_of(direct_conversation_id(TENANT, user, peer)) == partition:
            return peer
    raise AssertionError("unreachable")


@pytest.fixture
def writer(tmp_path: Path) -> PartitionWriter:
    return new_writer(tmp_path / "store", P)


def _run(
    writer: PartitionWriter, request: ConversationRequest, exhausted: Collection[UserKey]
) -> Plan:
    ctx = dataclasses.replace(CTX, exhausted=exhausted)
    plan = Plan()
    handle_request(writer, ctx, request, NOW, plan)
    appended = [(r, i) for i, r in enumerate(plan.outbox)]
    writer.stored(appended)
    return plan


def _refused(plan: Plan) -> bool:
    errors = [r.error for r in plan.replies if r.error is not None]
    errors += [r.error for r in plan.admin_replies if r.error is not None]
    if not errors:
        return False
    (error,) = errors
    assert (error.code, error.detail) == (int(ErrorCode.PERMISSION_DENIED), QUOTA_EXHAUSTED)
    assert not plan.outbox
    return True


def test_new_direct_conversation_is_refused_for_either_side_at_the_cap(
    writer: PartitionWriter,
) -> None:
    peer = _peer_on("alice", P)
    assert _refused(_run(writer, direct("alice", peer, "m1"), {(TENANT, "alice")}))
    assert _refused(_run(writer, direct("alice", peer, "m2"), {(TENANT, peer)}))
    assert not _refused(_run(writer, direct("alice", peer, "m3"), {("other", "alice")}))


def test_an_existing_direct_conversation_keeps_working_at_the_cap(
    writer: PartitionWriter,
) -> None:
    peer = _peer_on("alice", P)
    first = _run(writer, direct("alice", peer, "m1"), set())
    assert first.outbox and not _refused(first)
    later = _run(writer, direct(peer, "alice", "m2"), {(TENANT, "alice"), (TENANT, peer)})
    assert later.outbox and not _refused(later)


def test_group_create_with_one_exhausted_invitee_is_refused_whole(
    writer: PartitionWriter,
) -> None:
    group = group_on(P)
    exhausted = {(TENANT, "carol")}
    assert _refused(_run(writer, create("alice", group, ("bob", "carol")), exhausted))
    assert writer.membership.group(TENANT, group) is None
    assert not _refused(_run(writer, create("alice", group, ("bob",)), exhausted))
    assert writer.membership.is_member(TENANT, group, "bob")


def test_admin_add_refuses_an_exhausted_newcomer_but_not_an_existing_member(
    writer: PartitionWriter,
) -> None:
    group = group_on(P, "g:ops")
    assert not _refused(_run(writer, admin(MembershipAction.CREATE, group, ("bob",)), set()))
    exhausted = {(TENANT, "bob"), (TENANT, "dave")}
    add_dave = admin(MembershipAction.ADD, group, ("carol", "dave"))
    assert _refused(_run(writer, add_dave, exhausted))
    assert not writer.membership.is_member(TENANT, group, "carol")
    plan = _run(writer, admin(MembershipAction.ADD, group, ("bob", "carol")), exhausted)
    assert not _refused(plan) and plan.outbox
    assert writer.membership.is_member(TENANT, group, "carol")


def test_the_follower_keeps_each_users_latest_record() -> None:
    """Compacted or not, the last record of a user wins; tombstones and junk are skipped."""
    follower = UserQuotaFollower("127.0.0.1:9", "qim.user-quota", 1)

    def record(user: str, exhausted: bool) -> SimpleNamespace:
        quota = UserQuota(tenant_id=TENANT, user_id=user, conversations=3, exhausted=exhausted)
        return SimpleNamespace(value=encode_user_quota(quota))

    tp = TopicPartition("qim.user-quota", 0)
    follower.apply_records({tp: [record("kim", True), record("bob", True)]})
    assert follower.exhausted == {(TENANT, "kim"), (TENANT, "bob")}
    junk = [SimpleNamespace(value=None), SimpleNamespace(value=b"\xc1")]
    follower.apply_records({tp: [record("kim", False), *junk, record("bob", True)]})
    assert follower.exhausted == {(TENANT, "bob")}
    assert follower.records == 4
