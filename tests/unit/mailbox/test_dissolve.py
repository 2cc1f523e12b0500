"""A dissolve through the FanoutCoordinator to the MailboxNode's 7.5 state (issue 21).

Every member gets the dissolve's MEMBERSHIP entry as its subject and ends REMOVED at the
dissolve's seq J; a message the writer would have refused is not the point here (the writer
test covers it): what matters is that nobody is left ACTIVE and nobody is missed.
"""

from __future__ import annotations

from qim.core.fanout import FanoutConfig, FanoutState
from qim.core.mailbox.user_state import membership_change
from qim.core.session_list import REMOVED, Leave
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
