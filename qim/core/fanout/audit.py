"""``audit_fanout``: rebuild the expected dispatch log from the outbox, diff it with the real one.

Why replay and diff (style item 8, Faust's consistency checker): the dispatches are a pure
function of the outbox (``FanoutState``), so the expected log is recomputed from the source
topic and every difference is a defect of the running pipeline -- a lost produce, a record in
the wrong partition, a corrupted or zombie record, a missing member slice -- never a judgement
call. The logic of ``FanoutState`` itself is checked by the unit tests against independent
reference models; this is the runtime half, the seed of issue 8's ``qim audit dispatch``.

Input: the outbox records of a window in log order (from the beginning, or from the state a
``start`` snapshot encodes) and the dispatch-log records as ``(partition, record)`` pairs --
the whole log: the ConversationWriter's member slices and the FanoutCoordinator's dispatches.
Duplicates with identical bytes are legal (at-least-once, ADR-0017) and not reported; order
inside a partition is not checked, since ADR-0017 lets retries swap it (a MailboxNode holds a
dispatch back until its slice is complete). Run it with the ``FanoutConfig`` the live
coordinator used (``qim.core.fanout.config``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

import msgspec

from qim.core.fanout.config import FanoutConfig
from qim.core.fanout.event_group import EventGroupOverflow, check_event_group_caps
from qim.core.fanout.state import FanoutLogError, FanoutState, NotReady
from qim.core.membership import MembershipLogError
from qim.schemas.records.dispatch import DispatchLogRecord, GroupDispatch, ReactionSummary
from qim.schemas.records.membership import MembershipCommitted, MemberSliceRecord
from qim.schemas.records.outbox import GROUP, MessageReacted, OutboxRecord

__all__ = ["COORDINATE_FIELDS", "Finding", "FindingKind", "audit_fanout"]

COORDINATE_FIELDS = (
    "tenant_id",
    "conversation_id",
    "conversation_kind",
    "conversation_seq",
    "message_id",
    "last_activity_id",
    "sender_id",
    "committed_at",
    "membership_version",
    "fencing_epoch",
    "target_mailbox_shard",
)
"""Fields whose mismatch misplaces or misattributes an entry (sender / coordinates)."""


class FindingKind(StrEnum):
    COMMIT_WITHOUT_DISPATCH = "commit_without_dispatch"
    DISPATCH_WITHOUT_COMMIT = "dispatch_without_commit"
    UNEXPECTED_DISPATCH = "unexpected_dispatch"  # a committed message, but not this id/shard
    WRONG_PARTITION = "wrong_partition"
    COORDINATE_MISMATCH = "coordinate_mismatch"
    CONTENT_MISMATCH = "content_mismatch"
    CONFLICTING_DUPLICATE = "conflicting_duplicate"
    SLICE_MISSING = "slice_missing"
    EVENT_GROUP_CAP = "event_group_cap"
    UNREPLAYABLE = "unreplayable"


@dataclass(frozen=True, slots=True, order=True)
class Finding:
    """One defect; ``message_id`` is hex ("" for a slice), ``shard`` the partition concerned."""

    kind: FindingKind
    message_id: str
    shard: int
    detail: str


_FIELDS: tuple[str, ...] = GroupDispatch.__struct_fields__
_ENCODER = msgspec.msgpack.Encoder()
SliceKey = tuple[str, str, int, int]


def _expected(
    outbox_records: Iterable[OutboxRecord], state: FanoutState, findings: list[Finding]
) -> tuple[dict[tuple[str, bytes], GroupDispatch], set[tuple[str, bytes]]]:
    expected: dict[tuple[str, bytes], GroupDispatch] = {}
    committed: set[tuple[str, bytes]] = set()
    for record in outbox_records:
        if isinstance(record, MessageReacted):
            continue  # dispatches nothing (13.6.1)
        if not isinstance(record, MembershipCommitted) or record.conversation_seq >= 1:
            committed.add((record.tenant_id, record.message_id))
        try:
            out = state.apply_outbox(record)
        except (MembershipLogError, FanoutLogError, EventGroupOverflow) as exc:
            where = record.message_id.hex()
            findings.append(Finding(FindingKind.UNREPLAYABLE, where, -1, f"{exc!r}"))
            continue
        if isinstance(out, NotReady):
            detail = f"{out.reason} v{out.membership_version} (known v{out.known_version})"
            findings.append(Finding(FindingKind.UNREPLAYABLE, out.message_id.hex(), -1, detail))
            continue
        for produced in out:
            if isinstance(produced, GroupDispatch):
                expected.setdefault((produced.tenant_id, produced.dispatch_id), produced)
    return expected, committed


def _compare(actual: GroupDispatch, want: GroupDispatch) -> list[Finding]:
    differ = [f for f in _FIELDS if getattr(actual, f) != getattr(want, f)]
    coords = [f for f in differ if f in COORDINATE_FIELDS]
    other = [f for f in differ if f not in COORDINATE_FIELDS]
    where = (actual.message_id.hex(), actual.target_mailbox_shard)
    out = []
    if coords:
        out.append(Finding(FindingKind.COORDINATE_MISMATCH, *where, ",".join(coords)))
    if other:
        out.append(Finding(FindingKind.CONTENT_MISMATCH, *where, ",".join(other)))
    return out


def audit_fanout(
    outbox_records: Iterable[OutboxRecord],
    dispatch_records: Iterable[tuple[int, DispatchLogRecord]],
    *,
    config: FanoutConfig | None = None,
    start: bytes | None = None,
) -> list[Finding]:
    """Every defect of ``dispatch_records`` against the outbox, sorted (empty = sound)."""
    config = config or FanoutConfig()
    state = FanoutState.decode(start, config) if start is not None else FanoutState(config)
    findings: list[Finding] = []
    expected, committed = _expected(outbox_records, state, findings)
    seen: dict[tuple[str, bytes], bytes] = {}
    slices: dict[SliceKey, tuple[int, set[int]]] = {}
    pinned: list[GroupDispatch] = []
    for partition, record in dispatch_records:
        if isinstance(record, MemberSliceRecord):
            key4 = (record.tenant_id, record.group_id, record.membership_version, partition)
            if partition != record.mailbox_shard:
                detail = f"slice of shard {record.mailbox_shard} in partition {partition}"
                findings.append(Finding(FindingKind.WRONG_PARTITION, "", partition, detail))
                continue
            slices.setdefault(key4, (record.chunk_count, set()))[1].add(record.chunk_index)
            continue
        if isinstance(record, ReactionSummary):
            continue  # an aggregate for the shard's facts row: no entry to audit (13.6.1)
        mid = record.message_id.hex()
        if partition != record.target_mailbox_shard:
            detail = f"dispatch for shard {record.target_mailbox_shard} in partition {partition}"
            findings.append(Finding(FindingKind.WRONG_PARTITION, mid, partition, detail))
        key = (record.tenant_id, record.dispatch_id)
        data = _ENCODER.encode(record)
        prior = seen.get(key)
        if prior is not None:
            if prior != data:
                detail = f"dispatch_id {record.dispatch_id.hex()} with other bytes"
                findings.append(Finding(FindingKind.CONFLICTING_DUPLICATE, mid, partition, detail))
            continue
        seen[key] = data
        want = expected.get(key)
        if want is None:
            known = (record.tenant_id, record.message_id) in committed
            kind = FindingKind.UNEXPECTED_DISPATCH if known else FindingKind.DISPATCH_WITHOUT_COMMIT
            findings.append(Finding(kind, mid, partition, record.dispatch_id.hex()))
            continue
        findings.extend(_compare(record, want))
        for problem in check_event_group_caps([record], config):
            findings.append(Finding(FindingKind.EVENT_GROUP_CAP, mid, partition, problem))
        if record.conversation_kind == GROUP and record.membership_version:
            pinned.append(record)
    for d in pinned:
        key4 = (d.tenant_id, d.conversation_id, d.membership_version, d.target_mailbox_shard)
        count, indexes = slices.get(key4, (1, set()))
        if len(indexes) < count:
            detail = f"v{d.membership_version}: {len(indexes)} of {count} slice chunks"
            where = (d.message_id.hex(), d.target_mailbox_shard)
            findings.append(Finding(FindingKind.SLICE_MISSING, *where, detail))
    for key, want in expected.items():
        if key not in seen:
            where = (want.message_id.hex(), want.target_mailbox_shard)
            detail = f"chunk {want.chunk_index} of {want.chunk_count}"
            findings.append(Finding(FindingKind.COMMIT_WITHOUT_DISPATCH, *where, detail))
    return sorted(findings)
