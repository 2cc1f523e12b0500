"""``audit_dispatch``: commit facts vs the dispatch log vs the MailboxStores (spec 0.2, 19.1).

Plain data in, findings out: the outbox records of the audited window, the dispatch-log records
as ``(partition, record)``, and one ``KVReader`` per MailboxShard store. Two comparisons:

1. the dispatch log against the outbox -- ``audit_fanout`` (commit without dispatch, dispatch
   without commit, coordinate/sender mismatch, wrong partition, missing slices ...);
2. the stores against the entries the outbox requires (``expected_entries``): an expected entry
   absent (``missing_entry``), one ``event_id`` at two places of a user's queue
   (``duplicate_entry``), an entry no committed message explains (``entry_without_commit``), an
   entry of a user routed to another shard (``entry_wrong_partition``), and a stored value whose
   coordinates/sender (``entry_coordinate_mismatch``) or other fields
   (``entry_content_mismatch``) differ from the derivation.

Absence is excused only where the store itself says why (never "probably trimmed"): the user's
trim line covers the dispatch's ``mailbox_seq`` (entry cap or time-window trim), or the
dispatch's progress row has expired together with the retention window at the store's log time.
A dispatch still waiting for its member slice is NOT excused: its entries are missing.
``tenants`` narrows the audit to some tenants (a shared cluster, tests); ``later`` names
``(tenant, message_id)`` committed after the window, whose dispatches and entries are skipped.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from qim.core.audit.expected import EntryKey, ExpectedEntry, expected_entries
from qim.core.fanout import FanoutConfig, audit_fanout
from qim.core.mailbox import keys
from qim.core.mailbox.config import DAY_MS, MailboxConfig
from qim.core.mailbox.ports import KVReader
from qim.core.mailbox.user_state import USER_STATE_CUSTOM_TYPE
from qim.core.mailbox.values import (
    DispatchProgress,
    ProgressState,
    ShardMeta,
    StoredEntry,
    TrimState,
    decode_value,
)
from qim.schemas.records.dispatch import DispatchLogRecord, GroupDispatch
from qim.schemas.records.membership import MemberSliceRecord
from qim.schemas.records.outbox import MessageReacted, OutboxRecord

__all__ = ["ENTRY_COORDINATES", "AuditFinding", "DispatchAudit", "audit_dispatch"]

ENTRY_COORDINATES = (
    "event_type",
    "message_id",
    "conversation_id",
    "conversation_seq",
    "last_activity_id",
    "sender_id",
    "created_at",
)
"""StoredEntry fields whose mismatch misplaces or misattributes an entry."""


@dataclass(frozen=True, slots=True, order=True)
class AuditFinding:
    """One defect: ``kind``, the message (hex) and shard concerned, the user if any, why."""

    kind: str
    message_id: str
    shard: int
    user: str
    detail: str


@dataclass
class DispatchAudit:
    """The verdict: ``ok`` iff there are no findings; the numbers say what was covered."""

    findings: list[AuditFinding] = field(default_factory=list)
    outbox_records: int = 0
    dispatch_records: int = 0
    expected_dispatches: int = 0
    expected_entries: int = 0
    entries_seen: int = 0
    excused: int = 0
    """Expected entries absent for a reason the store records (trim line, expiry)."""

    @property
    def ok(self) -> bool:
        return not self.findings

    def counts(self) -> dict[str, int]:
        """Findings per kind, sorted by kind."""
        out: dict[str, int] = {}
        for f in self.findings:
            out[f.kind] = out.get(f.kind, 0) + 1
        return dict(sorted(out.items()))

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "counts": self.counts(),
            "outbox_records": self.outbox_records,
            "dispatch_records": self.dispatch_records,
            "expected_dispatches": self.expected_dispatches,
            "expected_entries": self.expected_entries,
            "entries_seen": self.entries_seen,
            "excused": self.excused,
            "findings": [
                {"kind": f.kind, "message_id": f.message_id, "shard": f.shard, "user": f.user,
                 "detail": f.detail}
                for f in self.findings
            ],
        }  # fmt: skip


def _in(tenants: Collection[str] | None, tenant: str) -> bool:
    return tenants is None or tenant in tenants


def _parse_entry(key: bytes) -> tuple[str, str, keys.EntryKey]:
    tenant, user, _ = key[1:-17].split(b"\x00")
    return tenant.decode(), user.decode(), keys.parse_entry_key(key)


@dataclass
class _Stored:
    seqs: list[int]
    ordinal: int
    value: bytes


def _scan(store: KVReader, shard: int, tenants: Collection[str] | None) -> dict[EntryKey, _Stored]:
    prefixes = [keys.ENTRY] if tenants is None else [
        keys.ENTRY + t.encode() + b"\x00" for t in sorted(tenants)
    ]  # fmt: skip
    out: dict[EntryKey, _Stored] = {}
    for prefix in prefixes:
        for key, value in store.scan(prefix, prefix, False):
            if decode_value(value, StoredEntry).inline_custom_type == USER_STATE_CUSTOM_TYPE:
                continue  # the user's own state change (a UserStateCommand), not a commit's
            tenant, user, tail = _parse_entry(key)
            k = (shard, tenant, user, tail.event_id)
            seen = out.get(k)
            if seen is None:
                out[k] = _Stored([tail.mailbox_seq], tail.event_ordinal, value)
            else:
                seen.seqs.append(tail.mailbox_seq)
    return out


def _excused(store: KVReader, key: EntryKey, want: ExpectedEntry, mailbox: MailboxConfig) -> bool:
    _, tenant, user, _ = key
    d = want.dispatch
    raw = store.get(keys.dispatch_key(tenant, d.dispatch_id))
    if raw is None:
        meta_raw = store.get(keys.META)
        now = 0 if meta_raw is None else decode_value(meta_raw, ShardMeta).log_now_ms
        return d.committed_at + mailbox.retention_days(tenant) * DAY_MS <= now
    progress = decode_value(raw, DispatchProgress)
    if progress.state == ProgressState.PENDING:
        return False
    trim_raw = store.get(keys.trim_key(tenant, user))
    trim = 0 if trim_raw is None else decode_value(trim_raw, TrimState).effective
    return progress.mailbox_seq <= trim


def _why_missing(store: KVReader, want: ExpectedEntry) -> str:
    d = want.dispatch
    raw = store.get(keys.dispatch_key(d.tenant_id, d.dispatch_id))
    if raw is None:
        return f"dispatch {d.dispatch_id.hex()} never materialized"
    if decode_value(raw, DispatchProgress).state == ProgressState.PENDING:
        return f"dispatch {d.dispatch_id.hex()} waits for its member slice"
    return f"dispatch {d.dispatch_id.hex()} materialized without it"


def _compare_value(key: EntryKey, got: _Stored, want: ExpectedEntry) -> list[AuditFinding]:
    shard, _, user, _ = key
    mid = want.dispatch.message_id.hex()
    try:
        actual = decode_value(got.value, StoredEntry)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return [AuditFinding("entry_content_mismatch", mid, shard, user, f"undecodable: {exc}")]
    fields = StoredEntry.__struct_fields__
    differ = [f for f in fields if getattr(actual, f) != getattr(want.entry, f)]
    if got.ordinal != want.event_ordinal:
        differ.insert(0, "event_type")
    coords = [f for f in differ if f in ENTRY_COORDINATES]
    other = [f for f in differ if f not in ENTRY_COORDINATES]
    out = []
    if coords:
        out.append(AuditFinding("entry_coordinate_mismatch", mid, shard, user, ",".join(coords)))
    if other:
        out.append(AuditFinding("entry_content_mismatch", mid, shard, user, ",".join(other)))
    return out


def _unexplained(key: EntryKey, got: _Stored, fanout: FanoutConfig) -> AuditFinding:
    shard, tenant, user, event_id = key
    try:
        mid = decode_value(got.value, StoredEntry).message_id.hex()
    except (msgspec.DecodeError, msgspec.ValidationError):
        mid = ""
    home = fanout.shard_of(tenant, user)
    if home != shard:
        return AuditFinding("entry_wrong_partition", mid, shard, user, f"user of shard {home}")
    return AuditFinding("entry_without_commit", mid, shard, user, f"event_id {event_id}")


def audit_dispatch(
    outbox_records: Iterable[OutboxRecord],
    dispatch_records: Iterable[tuple[int, DispatchLogRecord]],
    stores: Mapping[int, KVReader],
    *,
    fanout: FanoutConfig,
    mailbox: MailboxConfig,
    tenants: Collection[str] | None = None,
    later: Collection[tuple[str, bytes]] = (),
) -> DispatchAudit:
    """Every finding of the window (see the module docstring), sorted; empty = sound."""
    outbox = [  # a reaction dispatches nothing (13.6.1), so nothing of it can be missing
        r for r in outbox_records if not isinstance(r, MessageReacted) and _in(tenants, r.tenant_id)
    ]
    log: list[tuple[int, GroupDispatch | MemberSliceRecord]] = [
        (p, r)
        for p, r in dispatch_records
        if isinstance(r, GroupDispatch | MemberSliceRecord)  # user-state commands are not fanout's
        and _in(tenants, r.tenant_id)
        and not (isinstance(r, GroupDispatch) and (r.tenant_id, r.message_id) in later)
    ]
    later_set = {(t, m) for t, m in later if any(m)}  # a create's id is all zeros
    window = [r for r in outbox if (r.tenant_id, r.message_id) not in later_set]
    report = DispatchAudit(outbox_records=len(window), dispatch_records=len(log))
    for f in audit_fanout(window, log, config=fanout):
        report.findings.append(AuditFinding(str(f.kind), f.message_id, f.shard, "", f.detail))
    expected = expected_entries(
        outbox, config=fanout, mention_entries=mailbox.mention_entries, later=later_set
    )
    report.expected_dispatches = expected.dispatches
    known = {f.message_id for f in report.findings if f.kind == "unreplayable"}
    for mid, why in expected.unreplayable:
        if mid not in known:
            report.findings.append(AuditFinding("unreplayable", mid, -1, "", why))
    report.expected_entries = len(expected.entries)
    actual: dict[EntryKey, _Stored] = {}
    for number, kv in sorted(stores.items()):
        actual.update(_scan(kv, number, tenants))
    report.entries_seen = sum(len(s.seqs) for s in actual.values())
    for key, want in sorted(expected.entries.items()):
        shard, _, user, _ = key
        mid = want.dispatch.message_id.hex()
        store = stores.get(shard)
        got = actual.get(key)
        if got is None:
            if store is not None and _excused(store, key, want, mailbox):
                report.excused += 1
                continue
            why = "no store for this shard" if store is None else _why_missing(store, want)
            report.findings.append(AuditFinding("missing_entry", mid, shard, user, why))
            continue
        if len(got.seqs) > 1:
            detail = "mailbox_seqs " + ",".join(str(s) for s in sorted(got.seqs))
            report.findings.append(AuditFinding("duplicate_entry", mid, shard, user, detail))
        report.findings.extend(_compare_value(key, got, want))
    for key, got in sorted(actual.items()):
        if key not in expected.entries:
            if _later(got, later_set, key):
                continue
            report.findings.append(_unexplained(key, got, fanout))
    report.findings.sort()
    return report


def _later(got: _Stored, later: set[tuple[str, bytes]], key: EntryKey) -> bool:
    if not later:
        return False
    try:
        mid = decode_value(got.value, StoredEntry).message_id
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    return (key[1], mid) in later
