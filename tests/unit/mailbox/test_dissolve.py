"""Roles and a dissolve through the FanoutCoordinator to the MailboxNode's 7.5 state (issue 21).

Every member gets the dissolve's MEMBERSHIP entry as its subject and ends REMOVED at the
dissolve's seq J; a message the writer would have refused is not the point here (the writer
test covers it): what matters is that nobody is left ACTIVE and nobody is missed.
"""

from __future__ import annotations

from qim.core.fanout import FanoutConfig, FanoutState
from qim.core.mailbox.user_state import membership_change
from qim.core.session_list import (
    REMOVED,
    Join,
    Leave,
    SetRole,
    UserConversationState,
    apply_change,
)
from qim.schemas.events import EventType
from qim.schemas.records.dispatch import GroupDispatch
from qim.schemas.records.membership import decode_control
from tests.unit.fanout.support import Outbox, delivered, pipeline
from tests.unit.mailbox.support import T

G = "g:gone"
SHARDS = 8
MEMBERS = ("alice", "bob", "carol", "dave", "erin")


def test_dissolve_reaches_every_member_as_a_leave_at_its_seq() -> None:
    outbox = Outbox(shards=SHARDS, tenant=T)
    outbox.create(G, "alice", MEMBERS[1:])
    outbox.send(G, "alice", payload=b"last words")
    record = outbox.dissolve(G, "alice")
    log = pipeline(outbox, FanoutState(FanoutConfig(mailbox_shard_count=SHARDS)))
    gone = [
        d
        for d in log
        if isinstance(d, GroupDispatch)
        and d.event_type == EventType.MEMBERSHIP
        and decode_control(d.payload).action == "dissolve"
    ]
    assert gone and all(d.conversation_seq == record.conversation_seq for d in gone)
    entries = delivered(log, SHARDS, T)[record.message_id]
    assert {e.user_id for e in entries} == set(MEMBERS)
    assert {e.event_type for e in entries} == {EventType.MEMBERSHIP}
    left = Leave(record.conversation_seq, REMOVED)
    for user in MEMBERS:
        assert {membership_change(d, user) for d in gone} == {left}


def _changes(outbox: Outbox, record_seq: int, users: tuple[str, ...]) -> dict[str, object]:
    log = pipeline(outbox, FanoutState(FanoutConfig(mailbox_shard_count=SHARDS)))
    found: dict[str, object] = {}
    for d in log:
        if not isinstance(d, GroupDispatch) or d.conversation_seq != record_seq:
            continue
        for user in users:
            change = membership_change(d, user)
            if change is not None:
                assert found.setdefault(user, change) == change
    return found


def test_role_changes_reach_the_changed_members_and_the_creator_joins_as_owner() -> None:
    outbox = Outbox(shards=SHARDS, tenant=T)
    outbox.create(G, "alice", MEMBERS[1:])
    assert _changes(outbox, 1, ("alice", "bob")) == {
        "alice": Join(1, "OWNER"),
        "bob": Join(1, "MEMBER"),
    }
    promoted = outbox.set_role(G, "alice", "carol", "ADMIN")
    assert _changes(outbox, promoted.conversation_seq, MEMBERS) == {
        "carol": SetRole(promoted.conversation_seq, "ADMIN")
    }
    moved = outbox.transfer(G, "alice", "bob")
    assert _changes(outbox, moved.conversation_seq, MEMBERS) == {
        "alice": SetRole(moved.conversation_seq, "MEMBER"),
        "bob": SetRole(moved.conversation_seq, "OWNER"),
    }


def test_a_role_change_is_ordered_by_the_membership_seq_and_needs_an_active_row() -> None:
    start = UserConversationState(conversation_id=G)
    joined = apply_change(start, Join(1), activity_id=1)
    admin = apply_change(joined, SetRole(5, "ADMIN"), activity_id=5)
    assert (admin.role, admin.membership_seq) == ("ADMIN", 5)
    assert apply_change(admin, SetRole(4, "MEMBER"), activity_id=4) is admin  # stale
    left = apply_change(admin, Leave(7, REMOVED), activity_id=7)
    assert apply_change(left, SetRole(8, "OWNER"), activity_id=8) is left  # not a member
