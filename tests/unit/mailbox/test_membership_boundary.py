"""Seed 003 M-5 / spec 10.1 step 9 on the MailboxNode: ``[joined_at, left_at)`` for ANY pinned
version, not only the current one.

A version's slice is cut when the version is published, so it cannot know a later leave; the
later version's slice lists the leaver's closed interval and the MailboxNode keeps it. These
tests run the producer (Outbox -> writer slices -> FanoutCoordinator) and the MailboxNode core
on one shard, then append dispatches pinned to the OLD version, as a recovery or a re-append
could, and check who got entries.
"""

from __future__ import annotations

import msgspec

from qim.core.fanout import FanoutConfig, FanoutState
from qim.core.mailbox import MailboxConfig, MemoryMailboxStore, StoreMailboxReader
from qim.core.mailbox.keys import DEPARTURE
from qim.core.membership import SliceAssembler
from qim.schemas import dispatch_id
from qim.schemas.events import EventType
from qim.schemas.records.dispatch import DispatchLogRecord, GroupDispatch
from qim.schemas.records.membership import MemberSliceRecord
from tests.unit.fanout.support import Outbox, delivered, pipeline
from tests.unit.mailbox.support import T, numbered, run

G = "g:m5"
CONFIG = MailboxConfig(mailbox_shard=0, mailbox_shard_count=1)


def _scenario() -> tuple[list[DispatchLogRecord], int, int]:
    """owner + u (v1); u leaves (v2, left_at = J); u rejoins with y (v3). Returns the log,
    J and the rejoin's seq."""
    outbox = Outbox(shards=1, tenant=T)
    outbox.create(G, "owner", ["u"])
    outbox.send(G, "owner", payload=b"before")
    leave = outbox.leave(G, "u")
    outbox.send(G, "owner", payload=b"away")
    rejoin = outbox.add(G, ["u", "y"])
    assert rejoin is not None
    outbox.send(G, "owner", payload=b"back")
    log = pipeline(outbox, FanoutState(FanoutConfig(mailbox_shard_count=1)))
    return log, leave.conversation_seq, rejoin.conversation_seq


def _pinned(template: GroupDispatch, version: int, seq: int, payload: bytes) -> GroupDispatch:
    """A copy of ``template`` pinned to ``version`` at ``seq``, with its own ids."""
    mid = (0xABC << 64 | seq << 8 | version).to_bytes(16, "big")
    return msgspec.structs.replace(
        template,
        message_id=mid,
        last_activity_id=mid,
        dispatch_id=dispatch_id(int.from_bytes(mid, "big"), 0),
        conversation_seq=seq,
        membership_version=version,
        payload=payload,
    )


def _payloads(store: MemoryMailboxStore, user: str, log: list[DispatchLogRecord]) -> set[bytes]:
    """The payloads of owner's messages in ``user``'s entries (bodies are joined at read
    time, so they are looked up in the log by message_id); the create's entry left out."""
    bodies = {
        r.message_id: r.payload
        for r in log
        if isinstance(r, GroupDispatch) and r.event_type != EventType.MEMBERSHIP
    }
    reader = StoreMailboxReader(store, CONFIG.lane_count)
    entries = [e for _, group in reader.read_user_range(T, user, 0, 1 << 62) for e in group]
    return {
        bodies[e.message_id] for e in entries if e.message_id in bodies and e.sender_id == "owner"
    }


def test_m5_the_later_slice_lists_the_leavers_closed_interval() -> None:
    log, left_at, _ = _scenario()
    assembler = SliceAssembler()
    done = [assembler.apply(r) for r in log if isinstance(r, MemberSliceRecord)]
    by_version = {s.membership_version: s for s in done if s is not None}
    assert by_version[1].left == ()
    assert by_version[2].left == (("u", 0, left_at),)
    assert "u" not in by_version[2].user_ids
    assert by_version[3].left == ()  # the rejoin overwrote the row: a new interval is open


def test_m5_a_dispatch_pinned_to_an_old_version_stops_at_left_at() -> None:
    """v1 lists u with joined_at 0. v1-pinned dispatches: below left_at -> u gets it; at
    left_at, between leave and rejoin, and after the rejoin -> u does not (its new slot
    belongs to v3's interval, not v1's); owner gets every one; y (not in v1) none."""
    log, left_at, rejoined = _scenario()
    template = next(r for r in log if isinstance(r, GroupDispatch) and r.payload == b"back")
    stale = [
        _pinned(template, 1, left_at - 1, b"v1 below left_at"),
        _pinned(template, 1, left_at, b"v1 at left_at"),
        _pinned(template, 1, left_at + 1, b"v1 while away"),
        _pinned(template, 1, rejoined + 2, b"v1 after rejoin"),
        _pinned(template, 2, rejoined + 3, b"v2 after rejoin"),
    ]
    store, full = MemoryMailboxStore(), [*log, *stale]
    run(store, numbered(full), CONFIG)

    assert _payloads(store, "u", full) == {b"before", b"v1 below left_at", b"back"}
    assert _payloads(store, "y", full) == {b"back"}
    owner = {b"before", b"away", b"back"} | {s.payload for s in stale}
    assert _payloads(store, "owner", full) == owner
    assert sum(1 for key, _ in store.items() if key.startswith(DEPARTURE)) == 1


def test_m5_the_reference_model_and_the_node_agree_and_replay_is_byte_identical() -> None:
    """``delivered`` (the fanout reference) applies the same departures; one batch and one
    record per batch give the same store bytes (the departure keys included)."""
    log, left_at, rejoined = _scenario()
    template = next(r for r in log if isinstance(r, GroupDispatch) and r.payload == b"back")
    stale = _pinned(template, 1, left_at + 1, b"v1 while away")
    full = [*log, stale]
    expected = delivered(full, 1, T)[stale.message_id]
    assert {d.user_id for d in expected} == {"owner"}

    whole, piecewise = MemoryMailboxStore(), MemoryMailboxStore()
    run(whole, numbered(full), CONFIG)
    for offset, record in numbered(full):
        run(piecewise, [(offset, record)], CONFIG)
    assert sorted(whole.items()) == sorted(piecewise.items())
    assert rejoined > left_at
