"""Live state == replayed state, byte for byte (style.md items 3, 7, 8; direction.md 4.7).

Random interleavings of sends, retries with the same client_message_id, strangers, oversize
payloads, clock steps (absorbed and unsafe), bursts that hit RATE_LIMITED, @alls that meet the
11.4.2 gate (role, per-conversation rate, daily quota across UTC days), large-group sends over
the tenant's fanout quota (FANOUT_QUOTA_EXCEEDED), membership CONTROL
records sharing the seq space, and zombie appends with an older fencing epoch. The live state is
driven exactly as the shell will drive it (``handle_send``, then ``apply`` of what was appended);
then the outbox is replayed from empty, from a snapshot taken midway, and from that snapshot with
an overlap, under another incarnation too: every rebuild's snapshot bytes equal the live ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from qim.core.conversation import (
    Accepted,
    ConversationWriterState,
    Duplicate,
    Rejected,
    direct_conversation_id,
    replay,
)
from qim.params import Rate
from qim.schemas.frames import MENTION_ALL, SendAck
from qim.schemas.records import (
    MessageCommitted,
    decode_outbox_record,
    encode_outbox_record,
)
from qim.schemas.records.membership import MembershipCommitted, encode_membership_record
from qim.schemas.records.outbox import OutboxRecord, RetentionClass

from .support import NOW, REGION, WRITER, Groups, config, send_request

USERS = ("u0", "u1", "u2", "u3", "stranger")
GROUPS = Groups()
GROUPS.add("g:small", USERS[:4])
GROUPS.add("g:big", USERS[:4], count=1500)
GROUPS.add("g:small", ["u0"], tenant="beta")
GROUPS.roles[("acme", "g:big", "u0")] = "OWNER"
GROUPS.roles[("acme", "g:big", "u1")] = "ADMIN"
LIMITS = {
    "at_all_rate_per_conversation": Rate(count=1, period_ms=20_000),
    "at_all_daily_quota_per_sender": 2,
    "tenant_fanout_quota": Rate(count=4000, period_ms=1000),
}
"""Small enough that the @all cells, the UTC-day counts and the L3 bucket all refuse."""
CONVERSATIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # (tenant, conversation_id, who may send)
    ("acme", direct_conversation_id("acme", "u0", "u1"), ("u0", "u1")),
    ("acme", direct_conversation_id("acme", "u2", "u2"), ("u2",)),
    ("acme", "g:small", USERS[:4]),
    ("acme", "g:big", USERS[:4]),
    ("beta", "g:small", ("u0",)),
)


@dataclass(frozen=True)
class Send:
    sender: int  # see _sender_and_peer
    conversation: int
    cmid: int  # -1: empty; otherwise an index into a small pool, so retries happen
    size: int
    dt: int
    ephemeral: bool
    at_all: bool = False


@dataclass(frozen=True)
class Burst:
    """``count`` fresh sends into one conversation in the same millisecond (hits L1/L2)."""

    conversation: int
    count: int


@dataclass(frozen=True)
class Control:
    dt: int


@dataclass(frozen=True)
class Zombie:
    pass


sends = st.builds(
    Send,
    sender=st.integers(0, 8),
    conversation=st.integers(0, len(CONVERSATIONS) - 1),
    cmid=st.integers(-1, 12),
    size=st.sampled_from([0, 10, 700, 2048, 32 * 1024, 32 * 1024 + 1]),
    dt=st.one_of(
        st.just(0),
        st.just(0),
        st.integers(0, 60),
        st.integers(-5200, 3500),
        st.just(7_200_000),
        st.just(30_000),
    ),
    ephemeral=st.booleans(),
    at_all=st.sampled_from([False, False, True]),
)
ops = st.lists(
    st.one_of(
        sends,
        sends,
        sends,
        st.builds(Burst, st.integers(0, len(CONVERSATIONS) - 1), st.integers(2, 45)),
        st.builds(Control, st.integers(0, 50)),
        st.just(Zombie()),
    ),
    min_size=10,
    max_size=80,
)


def _sender_and_peer(conversation: int, pick: int) -> tuple[str, str]:
    """Mostly a member (pick < 7); otherwise a stranger or, for direct ids, a wrong peer."""
    _, conv, members = CONVERSATIONS[conversation]
    sender = members[pick % len(members)] if pick < 7 else USERS[pick % len(USERS)]
    if not conv.startswith("d:"):
        return sender, ""
    if len(members) == 1:
        return sender, sender
    return sender, "u1" if sender == "u0" else "u0"


def _expand(program: list[Send | Burst | Control | Zombie]) -> list[Send | Control | Zombie]:
    """Bursts become sends with fresh cmids (1000+), members in turn, all at dt = 0."""
    steps: list[Send | Control | Zombie] = []
    for op in program:
        if isinstance(op, Burst):
            fresh = 1000 + len(steps)
            steps += [Send(i % 7, op.conversation, fresh + i, 5, 0, False) for i in range(op.count)]
        else:
            steps.append(op)
    return steps


def _ack_fields(ack: SendAck | None) -> tuple[str, bytes, int, bytes]:
    assert ack is not None
    return (ack.client_message_id, ack.message_id, ack.conversation_seq, ack.last_activity_id)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops, st.data())
def test_replay_from_empty_and_from_a_midway_snapshot_equals_live(
    program: list[Send | Burst | Control | Zombie], data: st.DataObject
) -> None:
    cfg = config(**LIMITS)
    live = ConversationWriterState(cfg, region_id=REGION, writer_id=WRITER, fencing_epoch=2)
    log: list[bytes] = []
    acks: dict[tuple[str, str, str], tuple[str, bytes, int, bytes]] = {}
    steps = _expand(program)
    cut = data.draw(st.integers(0, len(steps)), label="snapshot before step")
    mid_snapshot, mid_offset = live.snapshot(), 0
    now = NOW
    for index, op in enumerate(steps):
        if index == cut:
            mid_snapshot, mid_offset = live.snapshot(), len(log)
        before = live.snapshot()
        if isinstance(op, Send):
            now += op.dt
            tenant, conv, _ = CONVERSATIONS[op.conversation]
            sender, peer = _sender_and_peer(op.conversation, op.sender)
            cmid = "" if op.cmid < 0 else f"cm{op.cmid}"
            request = send_request(
                sender,
                conv,
                cmid,
                tenant=tenant,
                peer=peer,
                payload=b"p" * op.size,
                mentions=(MENTION_ALL,) if op.at_all else (),
            )
            retention: RetentionClass = "ephemeral_24h" if op.ephemeral else "default"
            decision = live.handle_send(request, now, GROUPS, retention_class=retention)
            assert live.snapshot() == before  # deciding never mutates
            event(
                type(decision).__name__
                + (f" {decision.reason}" if isinstance(decision, Rejected) else "")
            )
            if isinstance(decision, Accepted):
                log.append(encode_outbox_record(decision.record))
                live.apply(decision.record)
                if cmid:
                    # a key accepted again means the window expired: the new ack rules
                    acks[(tenant, sender, cmid)] = _ack_fields(decision.reply.send_ack)
            elif isinstance(decision, Duplicate):
                assert _ack_fields(decision.reply.send_ack) == acks[(tenant, sender, cmid)]
            else:
                assert isinstance(decision, Rejected)
        elif isinstance(op, Control):
            now += op.dt
            try:
                stamp = live.next_coordinates("acme", "g:small", now)
            except Exception:  # CLOCK_UNSAFE: the control change is simply not committed
                continue
            control = MembershipCommitted(
                tenant_id="acme",
                group_id="g:small",
                action="add",
                actor="u0",
                targets=("u3",),
                membership_version=2,
                member_count=4,
                conversation_seq=stamp.conversation_seq,
                message_id=stamp.message_id,
                last_activity_id=stamp.last_activity_id,
                committed_at=stamp.committed_at,
            )
            log.append(encode_membership_record(control))
            live.apply(control)
        else:  # a zombie's append: an older epoch, landing in the log after ours
            last = next((r for r in reversed(log) if b"\xa7message" in r), None)
            if last is None:
                continue
            stored = decode_outbox_record(last)
            assert isinstance(stored, MessageCommitted)
            ghost = msgspec.structs.replace(
                stored, fencing_epoch=1, conversation_seq=stored.conversation_seq + 1
            )
            log.append(encode_outbox_record(ghost))
            live.apply(ghost)
            assert live.snapshot() == before

    final = live.snapshot()
    records = [decode_outbox_record(raw) for raw in log]
    _check_ordering(records)

    assert replay(log, cfg, region_id=REGION, writer_id=WRITER).snapshot() == final
    tail = log[mid_offset:]
    assert (
        replay(tail, cfg, region_id=REGION, writer_id=WRITER, snapshot=mid_snapshot).snapshot()
        == final
    )
    overlap = replay(log, cfg, region_id=REGION, writer_id=WRITER, snapshot=mid_snapshot)
    assert overlap.snapshot() == final  # idempotent: records before the snapshot are skipped
    other = replay(
        tail, cfg, region_id=3, writer_id=WRITER + 1, fencing_epoch=9, snapshot=mid_snapshot
    )
    assert other.snapshot() == final  # the snapshot does not depend on the incarnation
    for record in records:
        live.apply(record)
    assert live.snapshot() == final


def _check_ordering(records: list[OutboxRecord]) -> None:
    """Seq strictly increasing per conversation, ids strictly increasing, co-ordered (6.3, 6.4)."""
    seqs: dict[tuple[str, str], int] = {}
    last_id = 0
    for record in records:
        if isinstance(record, MessageCommitted) and record.fencing_epoch < 2:
            continue  # the zombie's appends are not ours
        if isinstance(record, MembershipCommitted):
            conv = record.group_id
        else:
            conv = record.conversation_id
        key = (record.tenant_id, conv)
        assert record.conversation_seq == seqs.get(key, 0) + 1
        seqs[key] = record.conversation_seq
        message_id = int.from_bytes(record.message_id, "big")
        assert message_id > last_id
        assert record.last_activity_id == record.message_id
        last_id = message_id
