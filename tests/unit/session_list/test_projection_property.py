"""Property (1): incremental projection == refold from scratch == the 12.5.1 formula.

Random streams for one user over three conversations: messages from self and others (some
``counts_unread=false``, some @-mentions, some delivered late so ``conversation_seq`` and
mailbox order disagree), recalls and edits (some delivered twice in a row), MARK_READ from
several devices (stale ones included), mark unread, clear history, local delete, pin / mute /
archive, leave and rejoin. The log is folded (a) in one pass and (b) in random batches, each
after a checkpoint encode/decode and with the tail of the previous batch redelivered; both
must be byte-identical, equal the formula for every conversation the user is a member of, keep
the badge equal to its recomputation, and leave a client that applied every SESSION_DELTA with
the final values.
"""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qim.core.session_list import (
    ClearHistory,
    ClientSessionCache,
    DeleteLocal,
    DeltaOutcome,
    EntryIn,
    HeadFacts,
    MarkRead,
    MarkUnread,
    SessionListConfig,
    SetArchived,
    SetMuted,
    SetPin,
    StateIn,
    UserConversationState,
    UserProjection,
    badge_of,
    decode_projection,
    deltas_of,
    encode_projection,
    fold,
    rebuild_from_state,
    session_delta,
    unread_formula,
)
from qim.schemas.frames.base import EntryFlags, EventType, MentionType, u128_from_bytes
from tests.unit.session_list.support import U, World

CONVS = ("c1", "c2", "c3")
conv = st.sampled_from(CONVS)
send = st.tuples(
    st.just("send"),
    conv,
    st.sampled_from((U, "a", "b", "a")),
    st.sampled_from((True, True, True, False)),
    st.sampled_from((MentionType.NONE, MentionType.NONE, MentionType.AT_ME)),
    st.sampled_from((False, False, True)),
)
other = st.one_of(
    st.tuples(st.just("deliver"), st.integers(0, 4)),
    st.tuples(st.just("recall"), conv, st.integers(0, 30)),
    st.tuples(st.just("edit"), conv, st.integers(0, 30), st.booleans()),
    st.tuples(st.just("read"), conv, st.integers(0, 40)),
    st.tuples(st.just("unread"), conv),
    st.tuples(st.just("clear"), conv),
    st.tuples(st.just("delete"), conv),
    st.tuples(st.just("pin"), conv, st.none() | st.integers(0, 3)),
    st.tuples(st.just("mute"), conv, st.booleans()),
    st.tuples(st.just("archive"), conv, st.booleans()),
    st.tuples(st.just("leave"), conv),
    st.tuples(st.just("join"), conv),
    st.tuples(st.just("stray"), conv),
)
# about half sends, a fifth recalls and deliveries of late messages, the rest user actions
op = st.integers(0, 9).flatmap(
    lambda n: (
        send
        if n < 5
        else st.tuples(st.just("recall"), conv, st.integers(0, 30), st.booleans())
        if n == 5
        else st.tuples(st.just("deliver"), st.integers(0, 4))
        if n == 6
        else other
    )
)


def play(ops: list[tuple[Any, ...]]) -> World:
    w = World(conversations=CONVS)
    for kind, *args in ops:
        c: str = args[0] if kind != "deliver" else ""
        if kind == "send":
            _, sender, counts, mention, late = args
            if sender == U and not w.member_at(c, w.heads[c] + 1):
                continue  # the writer refuses a non-member's send
            w.send(c, sender, counts_unread=counts, mention=mention, late=late)
        elif kind == "stray":
            w.send(c, "b", stray=True)
        elif kind == "deliver" and w.held:
            w.deliver_held(args[0] % len(w.held))
        elif kind in ("recall", "edit"):
            stored = sorted(w.store.rows.get(c, {}).items())
            live = [seq for seq, fact in stored if fact.removed_at is None]
            dup = len(args) > 2 and args[2]
            if live:
                w.recall(c, live[args[1] % len(live)], edit=kind == "edit", dup=dup)
        elif kind == "read":
            w.change(c, MarkRead(args[1] % (w.heads[c] + 1)))  # devices read anywhere
        elif kind in ("unread", "clear", "delete"):
            head = w.heads[c]
            w.change(
                c,
                MarkUnread(head)
                if kind == "unread"
                else ClearHistory(head)
                if kind == "clear"
                else DeleteLocal(head),
            )
        elif kind == "pin":
            w.change(c, SetPin(args[1]))
        elif kind == "mute":
            w.change(c, SetMuted(args[1]))
        elif kind == "archive":
            w.change(c, SetArchived(args[1]))
        elif kind == "leave" and w.states[c].active:
            w.leave(c)
        elif kind == "join" and not w.states[c].active:
            w.join(c)
    w.flush_held()
    return w


def batched(
    w: World, cuts: list[int], redeliver: int, config: SessionListConfig
) -> tuple[UserProjection, ClientSessionCache]:
    log = w.log
    bounds = sorted({min(c, len(log)) for c in cuts} | {0, len(log)})
    projection = UserProjection(user_id=U)
    client = ClientSessionCache()
    for lo, hi in itertools.pairwise(bounds):
        projection = decode_projection(encode_projection(projection))  # checkpoint
        chunk: list[EntryIn | StateIn] = [*log[max(0, lo - redeliver) : lo], *log[lo:hi]]
        result = fold(projection, chunk, w.store, config)
        for delta in deltas_of(result, {}):
            outcome = client.apply_delta(delta, last_applied_mailbox_seq=delta.driving_mailbox_seq)
            assert outcome is DeltaOutcome.APPLIED
        projection = result.projection
    return projection, client


def reference_sort_fields(w: World) -> dict[str, tuple[int, int]]:
    """``(latest_conversation_seq, last_activity_id)`` by the 12.4.2 gates, from the log."""
    states: dict[str, UserConversationState] = {}
    out: dict[str, tuple[int, int]] = {}
    for item in w.log:
        if isinstance(item, StateIn):
            conv = item.state.conversation_id
            states[conv] = item.state
            if out.get(conv, (0, 0))[0] <= item.state.deleted_before_conversation_seq:
                out.pop(conv, None)  # INV-32: no row at or below deleted_before
            continue
        e = item.entry
        state = states.get(
            e.conversation_id, UserConversationState(conversation_id=e.conversation_id)
        )
        anchored = e.target_conversation_seq is not None
        if e.event_type == EventType.MENTION or anchored or not state.visible(e.conversation_seq):
            continue
        if e.conversation_seq <= e.visibility_floor_conversation_seq:
            continue
        latest, activity = out.get(e.conversation_id, (0, 0))
        if e.flags & EntryFlags.AFFECTS_SESSION_ORDER:
            activity = max(activity, u128_from_bytes(e.last_activity_id))
        out[e.conversation_id] = (max(latest, e.conversation_seq), activity)
    return out


def check_against_formula(w: World, p: UserProjection, config: SessionListConfig) -> None:
    sort_fields = reference_sort_fields(w)
    assert sorted(p.rows) == sorted(sort_fields)
    for c, row in p.rows.items():
        assert (row.latest_conversation_seq, row.last_activity_id) == sort_fields[c]
    for c in CONVS:
        state = w.states[c]
        assert p.state(c) == state
        left = state.left_at_conversation_seq
        if left is not None and c in p.rows:
            assert p.rows[c].latest_conversation_seq < left  # INV-30
        if not state.active:
            continue  # C-3: a leaver gets no recall after left_at; only members are compared
        expected = unread_formula(U, state, w.store.final_facts(c), w.heads[c])
        found = p.rows.get(c)
        if found is None:
            assert expected.unread_count == expected.mention_count == 0
            continue
        row = found
        assert row.unread_base_seq == state.unread_base
        assert 0 <= row.unread_count <= config.unread_precise_limit
        assert row.mention_count >= 0
        if row.unread_exact:
            assert row.unread_count == expected.unread_count
            assert row.mention_count == expected.mention_count
            if config.unread_precise_limit >= 200:
                assert row.counts == expected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(op, min_size=10, max_size=80),
    cuts=st.lists(st.integers(0, 200), max_size=6),
    redeliver=st.integers(0, 5),
)
def test_incremental_equals_refold_equals_formula(
    ops: list[tuple[Any, ...]], cuts: list[int], redeliver: int
) -> None:
    config = SessionListConfig()
    w = play(ops)
    single = fold(UserProjection(user_id=U), w.log, w.store, config).projection
    incremental, client = batched(w, cuts, redeliver, config)
    assert encode_projection(incremental) == encode_projection(single)
    check_against_formula(w, single, config)
    assert single.badge.sums == badge_of(single, config)
    assert max(w.store.reads, default=0) <= config.unread_precise_limit  # INV-13
    for c, held in client.sessions.items():
        if c not in single.rows:  # deleted (INV-32): devices learn it from the CONTROL entry
            assert single.state(c).deleted_before_conversation_seq >= held.latest_conversation_seq
            continue
        final = session_delta(
            single.rows[c],
            single.state(c),
            driving_event_id=held.driving_event_id,
            driving_mailbox_seq=held.driving_mailbox_seq,
        )
        assert held == final
    # the 12.7 REBUILD from UserConversationState + heads gives the formula's unread
    heads = {
        c: HeadFacts(r.latest_conversation_seq, r.last_activity_id, r.last_message_id)
        for c, r in single.rows.items()
    }
    rebuilt = rebuild_from_state(
        U, w.states, heads, w.store, config, at_mailbox_seq=single.projection_mailbox_seq
    )
    for c, row in rebuilt.rows.items():
        if w.states[c].active:
            expected = unread_formula(U, w.states[c], w.store.final_facts(c), w.heads[c])
            assert row.counts == expected


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, min_size=10, max_size=80), cuts=st.lists(st.integers(0, 200), max_size=4))
def test_tiny_precise_limit_keeps_bounds_and_exactness(
    ops: list[tuple[Any, ...]], cuts: list[int]
) -> None:
    """With ``unread_precise_limit = 3``: never above it, never below 0, exact => formula."""
    config = SessionListConfig(unread_precise_limit=3)
    w = play(ops)
    single = fold(UserProjection(user_id=U), w.log, w.store, config).projection
    incremental, _ = batched(w, cuts, 2, config)
    assert encode_projection(incremental) == encode_projection(single)
    check_against_formula(w, single, config)
    assert max(w.store.reads, default=0) <= 3
