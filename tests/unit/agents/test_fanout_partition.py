"""PartitionFanout: the FanoutCoordinator shell's per-partition bookkeeping (issue 5, spec 10.1).

Invariants: live output equals the core's; the commit offset never passes a record whose
dispatches were not returned (a held NotReady, a stall); a NotReady is held, never dropped, and
goes out once its membership record is applied; replay produces nothing and never holds the
commit back.
"""

from __future__ import annotations

import msgspec

from qim.agents.fanout.partition import PartitionFanout
from qim.core.fanout import FanoutConfig, FanoutState, NotReadyReason
from qim.schemas.records import (
    DispatchLogRecord,
    GroupDispatch,
    MembershipCommitted,
    OutboxRecord,
    encode_outbox_record,
)
from tests.unit.fanout.support import Outbox, run

CONFIG = FanoutConfig()


def _busy() -> Outbox:
    outbox = Outbox()
    outbox.create("g:a", "owner", [f"m{i}" for i in range(30)])
    outbox.send("g:a", "owner")
    outbox.direct("alice", "bob")
    outbox.add("g:a", ["n1", "n2"])
    outbox.send("g:a", "m3", mentions=("n1",))
    outbox.leave("g:a", "m7")
    outbox.send("g:a", "m4")
    return outbox


def _values(log: list[OutboxRecord], first: int = 0) -> list[tuple[int, bytes]]:
    return [(first + i, encode_outbox_record(r)) for i, r in enumerate(log)]


def _fresh() -> PartitionFanout:
    return PartitionFanout(0, FanoutState(CONFIG), 0)


def _ids(records: list[DispatchLogRecord]) -> list[bytes]:
    return [r.dispatch_id for r in records if isinstance(r, GroupDispatch)]


def test_live_feed_produces_exactly_the_cores_dispatches_in_order() -> None:
    outbox = _busy()
    part = _fresh()
    fed = part.feed(_values(outbox.log), live=True)
    assert fed.dispatches == run(FanoutState(CONFIG), outbox.log)
    assert part.commit_offset == part.next_offset == len(outbox.log)
    assert [record for record, _ in fed.sent] == outbox.log
    assert sum(count for _, count in fed.sent) == len(fed.dispatches)


def test_redelivered_offsets_are_skipped() -> None:
    outbox = _busy()
    part = _fresh()
    part.feed(_values(outbox.log), live=True)
    again = part.feed(_values(outbox.log), live=True)
    assert again.dispatches == [] and again.sent == []


def test_not_ready_message_is_held_and_released_by_its_membership_record() -> None:
    """Spec 10.1 step 3: a message pinned to an unknown version waits; it is never skipped."""
    outbox = Outbox()
    outbox.create("g:a", "owner", ["m1", "m2"])
    message = outbox.send("g:a", "m1")
    direct = outbox.direct("alice", "bob")
    (create,) = (r for r in outbox.log if isinstance(r, MembershipCommitted))
    part = _fresh()
    early = part.feed(_values([message, direct]), live=True)
    assert [h.reason for h in early.held] == [NotReadyReason.VERSION_UNKNOWN]
    assert _ids(early.dispatches) == _ids(run(FanoutState(CONFIG), [direct]))  # others flow
    assert part.commit_offset == 0  # the commit stays at the held record
    late = part.feed(_values([create], first=2), live=True)
    assert late.released == 1 and part.held == []
    assert _ids(late.dispatches) == _ids(run(FanoutState(CONFIG), [create, message]))
    assert part.commit_offset == 3


def test_replay_produces_nothing_and_what_it_holds_never_blocks_the_commit() -> None:
    outbox = Outbox()
    outbox.create("g:a", "owner", ["m1"])
    message = outbox.send("g:a", "m1")
    part = _fresh()
    fed = part.feed(_values([message]), live=False)
    assert fed.dispatches == [] and len(part.held) == 1
    assert part.commit_offset == 1
    assert len(part.end_replay()) == 1 and part.held == []


def test_an_undecodable_record_stalls_the_partition_at_it() -> None:
    outbox = _busy()
    values = _values(outbox.log)
    values[3] = (3, b"\xc1 not msgpack")
    part = _fresh()
    fed = part.feed(values, live=True)
    assert fed.stalled is not None and fed.stalled.offset == 3
    assert fed.dispatches == run(FanoutState(CONFIG), outbox.log[:3])
    assert part.commit_offset == 3
    assert part.feed(_values(outbox.log[4:], first=4), live=True).dispatches == []


def test_a_membership_record_that_cannot_follow_stalls_instead_of_skipping() -> None:
    """qim.core.membership.errors: a broken membership log must stop the consumer."""
    outbox = Outbox()
    outbox.create("g:a", "owner", ["m1"])
    added = outbox.add("g:a", ["m2"])
    assert added is not None
    broken = msgspec.structs.replace(added, member_count=added.member_count + 5)
    part = _fresh()
    fed = part.feed(_values([outbox.log[0], broken]), live=True)
    assert fed.stalled is not None and fed.stalled.offset == 1
    assert part.commit_offset == 1


def test_replay_steps_over_a_refused_record_the_group_already_committed_past() -> None:
    outbox = _busy()
    values = _values(outbox.log)
    values[2] = (2, b"junk")
    part = _fresh()
    part.feed(values, live=False)
    assert part.stalled is None and part.next_offset == len(outbox.log)
