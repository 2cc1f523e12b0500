"""Who a request makes join a conversation, and whether the cap refuses it (I-26).

``joining_users`` is the writer-side half of ``max_conversations_per_user``: a pure function of
the request, whether the conversation exists, and (admin add) who is already a member.
"""

from __future__ import annotations

from qim.core.conversation import direct_conversation_id
from qim.core.conversation.quota import joining_users, quota_refused
from qim.schemas.records.membership import MembershipAction
from tests.unit.agents.support import TENANT, admin, create, direct, send


def test_first_direct_send_joins_both_participants_an_existing_one_nobody() -> None:
    request = direct("alice", "bob", "m1")
    assert joining_users(request, exists=False) == ("alice", "bob")
    assert joining_users(request, exists=True) == ()


def test_a_direct_send_to_someone_elses_conversation_joins_nobody() -> None:
    """The send path answers it ``not_a_member``; the quota must not change that answer."""
    other = direct_conversation_id(TENANT, "carol", "dave")
    assert joining_users(send("alice", other, "m1", peer="bob"), exists=False) == ()


def test_a_note_to_self_joins_one_user() -> None:
    assert joining_users(direct("alice", "alice", "m1"), exists=False) == ("alice",)


def test_group_create_joins_creator_and_invitees_once() -> None:
    request = create("alice", "g:x", ("bob", "carol", "bob", "alice"))
    assert joining_users(request, exists=False) == ("alice", "bob", "carol")
    assert joining_users(request, exists=True) == ()  # refused as group_exists instead


def test_admin_create_and_add_join_only_new_members() -> None:
    created = admin(MembershipAction.CREATE, "g:x", ("bob",))
    assert joining_users(created, exists=False) == ("ops", "bob")
    added = admin(MembershipAction.ADD, "g:x", ("bob", "carol", "dave"))
    members = {"bob"}
    assert joining_users(added, exists=True, is_member=members.__contains__) == ("carol", "dave")
    assert joining_users(added, exists=False) == ()  # refused as no_such_group instead
    removed = admin(MembershipAction.REMOVE, "g:x", ("bob",))
    assert joining_users(removed, exists=True, is_member=members.__contains__) == ()


def test_one_exhausted_joiner_refuses_and_the_tenant_is_part_of_the_key() -> None:
    exhausted = {(TENANT, "carol"), ("other", "bob")}
    assert quota_refused(TENANT, ("alice", "bob", "carol"), exhausted) == ("carol",)
    assert quota_refused(TENANT, ("alice", "bob"), exhausted) == ()
    assert quota_refused(TENANT, ("carol",), set()) == ()
