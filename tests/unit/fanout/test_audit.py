"""``audit_fanout`` finds each kind of injected defect and nothing on a sound log (10.1, 7.8)."""

from __future__ import annotations

import msgspec
import pytest

from qim.core.fanout import FanoutState, Finding, FindingKind, audit_fanout, chunk_dispatch_id
from qim.schemas.ids import message_id_from_bytes
from qim.schemas.records.dispatch import DispatchLogRecord, GroupDispatch
from qim.schemas.records.membership import MemberSliceRecord
from qim.schemas.records.outbox import OutboxRecord
from tests.unit.fanout.support import Outbox, created_group, pipeline, run

Log = list[tuple[int, DispatchLogRecord]]


def _world() -> tuple[list[OutboxRecord], Log]:
    outbox = Outbox()
    outbox.create("g:audit", "owner", [f"m{i}" for i in range(30)])
    outbox.send("g:audit", "owner")
    outbox.leave("g:audit", "m3")
    outbox.send("g:audit", "m4", mentions=("m5",))
    outbox.direct("m1", "m2")
    produced = pipeline(outbox, FanoutState())
    return outbox.log, [(r.partition, r) for r in produced]


def _kinds(findings: list[Finding]) -> list[FindingKind]:
    return sorted({f.kind for f in findings})


def _first_dispatch(log: Log, *, pinned: bool = True) -> int:
    return next(
        i
        for i, (_, r) in enumerate(log)
        if isinstance(r, GroupDispatch) and bool(r.membership_version) == pinned
    )


def test_10_1_sound_log_has_no_findings_even_with_duplicates_and_reordering() -> None:
    outbox, log = _world()
    assert audit_fanout(outbox, log) == []
    again = log + log[::-1]  # at-least-once duplicates, ADR-0017 reordering
    assert audit_fanout(outbox, again) == []


def test_7_8_lost_dispatch_is_a_commit_without_dispatch() -> None:
    outbox, log = _world()
    i = _first_dispatch(log)
    lost = log[i][1]
    findings = audit_fanout(outbox, log[:i] + log[i + 1 :])
    assert _kinds(findings) == [FindingKind.COMMIT_WITHOUT_DISPATCH]
    assert isinstance(lost, GroupDispatch)
    assert (findings[0].message_id, findings[0].shard) == (
        lost.message_id.hex(),
        lost.target_mailbox_shard,
    )


def test_7_8_dispatch_of_an_uncommitted_message_is_reported() -> None:
    outbox, log = _world()
    _, d = log[_first_dispatch(log)]
    assert isinstance(d, GroupDispatch)
    ghost = msgspec.structs.replace(d, message_id=b"\x07" * 16, dispatch_id=b"\x09" * 16)
    findings = audit_fanout(outbox, [*log, (ghost.partition, ghost)])
    assert _kinds(findings) == [FindingKind.DISPATCH_WITHOUT_COMMIT]


def test_6_5_record_in_another_partition_is_a_wrong_partition() -> None:
    outbox, log = _world()
    i = _first_dispatch(log, pinned=False)
    partition, d = log[i]
    moved = [*log[:i], ((partition + 1) % 64, d), *log[i + 1 :]]
    assert _kinds(audit_fanout(outbox, moved)) == [FindingKind.WRONG_PARTITION]
    j = next(k for k, (_, r) in enumerate(log) if isinstance(r, MemberSliceRecord))
    p, s = log[j]
    moved_slice = [*log[:j], ((p + 1) % 64, s), *log[j + 1 :]]
    assert FindingKind.WRONG_PARTITION in _kinds(audit_fanout(outbox, moved_slice))


@pytest.mark.parametrize(
    ("field", "value"),
    [("sender_id", "mallory"), ("conversation_seq", 999), ("last_activity_id", b"\x01" * 16)],
)
def test_7_8_sender_or_coordinate_mismatch_is_reported_with_its_field(
    field: str, value: object
) -> None:
    outbox, log = _world()
    i = _first_dispatch(log)
    partition, d = log[i]
    assert isinstance(d, GroupDispatch)
    bad = msgspec.structs.replace(d, **{field: value})
    findings = audit_fanout(outbox, [*log[:i], (partition, bad), *log[i + 1 :]])
    assert [(f.kind, f.detail) for f in findings] == [(FindingKind.COORDINATE_MISMATCH, field)]


def test_7_8_same_dispatch_id_with_other_bytes_is_a_conflicting_duplicate() -> None:
    outbox, log = _world()
    partition, d = log[_first_dispatch(log)]
    assert isinstance(d, GroupDispatch)
    other = msgspec.structs.replace(d, payload=b"tampered")
    findings = audit_fanout(outbox, [*log, (partition, other)])
    assert _kinds(findings) == [FindingKind.CONFLICTING_DUPLICATE]
    # the first copy wins; a tampered first copy is a content mismatch instead
    findings = audit_fanout(outbox, [(partition, other), *log])
    assert FindingKind.CONTENT_MISMATCH in _kinds(findings)


def test_7_8_dispatch_to_a_shard_without_members_is_unexpected() -> None:
    outbox, log = _world()
    _, d = log[_first_dispatch(log)]
    assert isinstance(d, GroupDispatch)
    used = {r.target_mailbox_shard for _, r in log if isinstance(r, GroupDispatch)}
    empty = next(s for s in range(64) if s not in used)
    stray = msgspec.structs.replace(
        d,
        target_mailbox_shard=empty,
        dispatch_id=chunk_dispatch_id(message_id_from_bytes(d.message_id), empty),
    )
    findings = audit_fanout(outbox, [*log, (empty, stray)])
    assert [(f.kind, f.shard) for f in findings] == [(FindingKind.UNEXPECTED_DISPATCH, empty)]


def test_direction_4_3_dispatch_whose_slice_never_arrived_is_reported() -> None:
    outbox, log = _world()
    partition, d = log[_first_dispatch(log)]
    assert isinstance(d, GroupDispatch)
    without = [
        (p, r)
        for p, r in log
        if not (isinstance(r, MemberSliceRecord) and p == partition and r.membership_version == 1)
    ]
    findings = audit_fanout(outbox, without)
    assert _kinds(findings) == [FindingKind.SLICE_MISSING]


def test_7_9_outbox_window_without_its_membership_is_unreplayable_not_silent() -> None:
    outbox, log = _world()
    # the create (and its own dispatches) is outside the window
    log = [(p, r) for p, r in log if not (isinstance(r, GroupDispatch) and created_group(r))]
    findings = audit_fanout(outbox[1:], log)
    assert FindingKind.UNREPLAYABLE in _kinds(findings)
    state = FanoutState()
    run(state, outbox[:1])
    assert audit_fanout(outbox[1:], log, start=state.encode()) == []  # start where it begins
