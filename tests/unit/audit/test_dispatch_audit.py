"""``audit_dispatch`` is silent on a sound pipeline and names each injected defect (0.2, 19.1).

The world is built by the same doubles the fanout tests use (a writer-like ``Outbox`` and the
real ``FanoutState`` producing the dispatch log), and each shard's MailboxStore is the core's
``replay`` of its partition -- what a MailboxNode holds. Every defect is then made by hand on
one of the three inputs.
"""

from __future__ import annotations

import msgspec

from qim.core.audit import DispatchAudit, audit_dispatch
from qim.core.fanout import FanoutConfig, FanoutState
from qim.core.mailbox import MailboxConfig, MemoryMailboxStore, replay
from qim.core.mailbox import keys as mkeys
from qim.core.mailbox.user_state import USER_STATE_CUSTOM_TYPE
from qim.core.mailbox.values import StoredEntry, TrimState, decode_value, encode_value
from qim.schemas.records.dispatch import DispatchLogRecord, GroupDispatch
from qim.schemas.records.outbox import OutboxRecord
from tests.unit.fanout.support import Outbox, T, pipeline

Log = list[tuple[int, DispatchLogRecord]]
FANOUT = FanoutConfig()
MAILBOX = MailboxConfig(mailbox_shard=0)


def world() -> tuple[list[OutboxRecord], Log]:
    outbox = Outbox()
    outbox.create("g:big", "owner", [f"m{i}" for i in range(40)])
    outbox.send("g:big", "owner")
    outbox.leave("g:big", "m3")
    outbox.send("g:big", "m4", mentions=("m5",))
    outbox.direct("m1", "m2")
    outbox.direct("solo", "peer")
    produced = pipeline(outbox, FanoutState())
    return outbox.log, [(r.partition, r) for r in produced]


def stores(log: Log) -> dict[int, MemoryMailboxStore]:
    """Each partition folded by the MailboxNode's own materialize, offsets = log positions."""
    by_shard: dict[int, Log] = {}
    for partition, record in log:
        part = by_shard.setdefault(partition, [])
        part.append((len(part), record))
    return {
        shard: replay(part, shard_epoch=1, config=MailboxConfig(mailbox_shard=shard))
        for shard, part in by_shard.items()
    }


def audit(
    outbox: list[OutboxRecord],
    log: Log,
    kv: dict[int, MemoryMailboxStore],
    **kw: object,
) -> DispatchAudit:
    return audit_dispatch(outbox, log, kv, fanout=FANOUT, mailbox=MAILBOX, **kw)  # type: ignore[arg-type]


def kinds(report: DispatchAudit) -> list[str]:
    return sorted(report.counts())


def an_entry(kv: dict[int, MemoryMailboxStore]) -> tuple[int, bytes, bytes]:
    """(shard, key, value) of some MESSAGE entry of the group."""
    for shard, store in sorted(kv.items()):
        for key, value in store.scan(mkeys.ENTRY, mkeys.ENTRY, False):
            if decode_value(value, StoredEntry).conversation_id == "g:big":
                return shard, key, value
    raise AssertionError("no group entry")


def test_sound_pipeline_has_no_findings_and_covers_every_recipient() -> None:
    outbox, log = world()
    kv = stores(log)
    report = audit(outbox, log, kv)
    assert report.findings == [] and report.ok
    # 41 members, 2 messages to ~40 each, the leave's CONTROL broadcast, two direct pairs
    assert report.expected_entries > 100
    assert report.entries_seen == report.expected_entries
    again = audit(outbox, log + log, stores(log + log))  # at-least-once redelivery is absorbed
    assert again.findings == []


def test_lost_dispatch_is_commit_without_dispatch_and_its_entries_are_missing() -> None:
    outbox, log = world()
    i = next(i for i, (_, r) in enumerate(log) if isinstance(r, GroupDispatch))
    lost = log[:i] + log[i + 1 :]
    report = audit(outbox, lost, stores(lost))
    assert kinds(report) == ["commit_without_dispatch", "missing_entry"]
    missing = [f for f in report.findings if f.kind == "missing_entry"]
    assert all("never materialized" in f.detail for f in missing)


def test_dispatch_of_an_uncommitted_message_and_its_entries_are_reported() -> None:
    outbox, log = world()
    _, d = next((p, r) for p, r in log if isinstance(r, GroupDispatch) and r.participants)
    assert isinstance(d, GroupDispatch)
    ghost = msgspec.structs.replace(d, message_id=b"\x07" * 16, dispatch_id=b"\x09" * 16)
    bad = [*log, (ghost.partition, ghost)]
    report = audit(outbox, bad, stores(bad))
    assert kinds(report) == ["dispatch_without_commit", "entry_without_commit"]
    assert {f.message_id for f in report.findings} == {ghost.message_id.hex()}


def test_sender_mismatch_on_the_log_and_in_the_store() -> None:
    outbox, log = world()
    i, d = next((i, r) for i, (_, r) in enumerate(log) if isinstance(r, GroupDispatch))
    assert isinstance(d, GroupDispatch)
    forged = [
        *log[:i],
        (d.partition, msgspec.structs.replace(d, sender_id="mallory")),
        *log[i + 1 :],
    ]
    assert "coordinate_mismatch" in kinds(audit(outbox, forged, stores(log)))

    kv = stores(log)
    shard, key, value = an_entry(kv)
    entry = decode_value(value, StoredEntry)
    kv[shard].apply([(key, encode_value(msgspec.structs.replace(entry, sender_id="mallory")))])
    report = audit(outbox, log, kv)
    assert kinds(report) == ["entry_coordinate_mismatch"]
    assert report.findings[0].detail == "sender_id"
    kv[shard].apply([(key, encode_value(msgspec.structs.replace(entry, flags=0x7F)))])
    assert kinds(audit(outbox, log, kv)) == ["entry_content_mismatch"]


def test_record_in_another_partition_and_entry_in_another_shard() -> None:
    outbox, log = world()
    i, (p, d) = next((i, x) for i, x in enumerate(log) if isinstance(x[1], GroupDispatch))
    moved = [*log[:i], ((p + 1) % 64, d), *log[i + 1 :]]
    assert "wrong_partition" in kinds(audit(outbox, moved, stores(log)))

    kv = stores(log)
    shard, key, value = an_entry(kv)
    other = (shard + 1) % 64
    kv.setdefault(other, MemoryMailboxStore()).apply([(key, value)])
    report = audit(outbox, log, kv)
    assert kinds(report) == ["entry_wrong_partition"]
    assert report.findings[0].shard == other


def test_deleted_entry_is_missing_and_a_second_copy_is_a_duplicate() -> None:
    outbox, log = world()
    kv = stores(log)
    shard, key, value = an_entry(kv)
    kv[shard].apply([(key, None)])
    report = audit(outbox, log, kv)
    assert kinds(report) == ["missing_entry"]
    assert "materialized without it" in report.findings[0].detail

    kv = stores(log)
    tail = mkeys.parse_entry_key(key)
    copy = key[:-17] + mkeys.entry_key(T, "x", tail.mailbox_seq + 99, tail.event_ordinal,
                                       tail.event_id)[-17:]  # fmt: skip
    kv[shard].apply([(copy, value)])
    report = audit(outbox, log, kv)
    assert kinds(report) == ["duplicate_entry"]


def test_a_trim_line_excuses_absence_only_where_it_reaches() -> None:
    outbox, log = world()
    kv = stores(log)
    shard, key, _ = an_entry(kv)
    kv[shard].apply([(key, None)])
    tenant, user, _ = key[1:-17].split(b"\x00")
    trim_key = mkeys.trim_key(tenant.decode(), user.decode())
    below = TrimState(user_trim_seq=mkeys.parse_entry_key(key).mailbox_seq - 1)
    kv[shard].apply([(trim_key, encode_value(below))])
    assert kinds(audit(outbox, log, kv)) == ["missing_entry"]
    covering = TrimState(user_trim_seq=mkeys.parse_entry_key(key).mailbox_seq)
    kv[shard].apply([(trim_key, encode_value(covering))])
    report = audit(outbox, log, kv)
    assert report.findings == [] and report.excused == 1


def test_missing_store_and_tenant_scope_and_later_commits() -> None:
    outbox, log = world()
    kv = stores(log)
    shard, _, _ = an_entry(kv)
    del kv[shard]
    report = audit(outbox, log, kv)
    assert kinds(report) == ["missing_entry"]
    assert {f.detail for f in report.findings} == {"no store for this shard"}

    assert audit(outbox, log, stores(log), tenants={"another"}).expected_entries == 0
    # a message committed after the window: its dispatches and entries are not judged
    last = outbox[-1]
    report = audit(outbox[:-1], log, stores(log), later=[(T, last.message_id)])
    assert report.findings == []
    assert audit(outbox[:-1], log, stores(log)).counts()["dispatch_without_commit"] >= 1


def test_a_users_own_state_entry_is_not_a_commit_and_not_a_finding() -> None:
    """CONTROL entries written by a UserStateCommand (MARK_READ ...) come from the user's shard
    log, not from the outbox: the audit does not count them; any other stray entry it does."""
    outbox, log = world()
    kv = stores(log)
    shard, key, value = an_entry(kv)
    stored = decode_value(value, StoredEntry)
    tail = mkeys.parse_entry_key(key)
    own = mkeys.entry_key(T, "reader", tail.mailbox_seq + 500, tail.event_ordinal, 12345)
    state = msgspec.structs.replace(stored, inline_custom_type=USER_STATE_CUSTOM_TYPE)
    kv[shard].apply([(own, encode_value(state))])
    assert kinds(audit(outbox, log, kv)) == []
    kv[shard].apply([(own, encode_value(stored))])  # the same entry as a message: unexplained
    assert kinds(audit(outbox, log, kv)) != []
