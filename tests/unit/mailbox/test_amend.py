"""Recall / edit / delete on the mailbox side (spec 12.4.2, 12.5.5, 13.4.1 step 5, 13.4.2).

Constructed amend dispatches (CONTROL, own seq, ``target_*`` from the target) are materialized
like any dispatch; checked: the entries (AT-57), the preview repair and the gates (AT-12..14),
the decrement rules (AT-25, AT-27), replay byte-identity (AT-26), the log-consistent recount,
the body copy, and drop-and-rebuild == live.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import msgspec

from qim.agents.mailbox.push import plan_batch_pushes
from qim.client.sessions import SessionList
from qim.core.mailbox import (
    MemoryMailboxStore,
    StoreMailboxReader,
    commit,
    materialize,
    retention_sweep,
)
from qim.core.mailbox.reader import join_bodies
from qim.core.mailbox.replay import store_digest
from qim.core.mailbox.result import MaterializeResult
from qim.core.mailbox.session_store import ShardMessageSource, preview_of
from qim.core.mailbox.sessions import load_projection, rebuild_ops, rebuild_user
from qim.core.push import ShardPresenceCache
from qim.core.push.expand import expand_batch
from qim.core.session_list import DeltaOutcome, SessionRow, session_delta
from qim.schemas.events import EventType
from qim.schemas.frames.base import EntryFlags, MentionType
from qim.schemas.frames.history import SessionDelta
from qim.schemas.frames.mailbox import SyncEntry
from qim.schemas.frames.messaging import PushEvents
from qim.schemas.records.dispatch import EventTemplate, GroupDispatch, ShardLogRecord
from qim.schemas.records.presence import PresenceEntry
from qim.schemas.records.user_state import UserStateCommand
from tests.unit.mailbox.support import (
    BASE_TIME,
    CONFIG,
    EPOCH,
    PLACEHOLDER,
    SHARD,
    T,
    amend,
    dispatch,
    group_slice,
    local_users,
    seq,
)
from tests.unit.push.support import Conn

ME, PEER, THIRD, FOURTH = local_users(4, "a")
CONV = "c:amend"
COUNTS = int(EntryFlags.COUNTS_UNREAD)


def message(n: int, *, sender: str = PEER, counts: bool = True, **kw: object) -> GroupDispatch:
    """Message ``n`` at conversation_seq ``n`` between ME and PEER (payload ``m<n>``)."""
    return dispatch(
        n,
        conversation=kw.pop("conversation", CONV),  # type: ignore[arg-type]
        sender=sender,
        participants=kw.pop("participants", (ME, PEER)),  # type: ignore[arg-type]
        template=kw.pop("template", EventTemplate(counts_unread=counts)),  # type: ignore[arg-type]
        payload=f"m{n}".encode(),
        **kw,  # type: ignore[arg-type]
    )


def mark_read(n: int, read: int) -> UserStateCommand:
    return UserStateCommand(
        tenant_id=T,
        user_id=ME,
        conversation_id=CONV,
        action="mark_read",
        command_id=n.to_bytes(16, "big"),
        target_mailbox_shard=SHARD,
        committed_at=BASE_TIME + n * 1000,
        read_conversation_seq=read,
    )


def run_cut(records: Sequence[ShardLogRecord], cuts: Sequence[int] = ()) -> MemoryMailboxStore:
    store = MemoryMailboxStore()
    log = list(enumerate(records))
    for lo, hi in itertools.pairwise([0, *cuts, len(log)]):
        if hi > lo:
            commit(store, materialize(store, log[lo:hi], shard_epoch=EPOCH, config=CONFIG))
    return store


def row(store: MemoryMailboxStore, user: str = ME) -> SessionRow:
    return load_projection(store, T, user).rows[CONV]


def entries(store: MemoryMailboxStore, user: str = ME) -> list[SyncEntry]:
    reader = StoreMailboxReader(store, CONFIG.lane_count)
    return [e for _, g in reader.read_user_range(T, user, 0, 2**62) for e in g]


FIVE = [message(n) for n in range(1, 6)]


def test_at12_recall_of_the_preview_message() -> None:
    """Preview = seq 5 (latest) recalled: placeholder preview, latest/activity stay, unread -1,
    the row is re-emitted (touched by the CONTROL entry's key)."""
    store = run_cut(FIVE)
    before = row(store)
    assert (before.latest_conversation_seq, before.unread_count) == (5, 5)
    result = materialize(store, [(5, amend(6, FIVE[4]))], shard_epoch=EPOCH, config=CONFIG)
    commit(store, result)
    after = row(store)
    assert after.latest_conversation_seq == 5  # INV-05
    assert after.last_activity_id == before.last_activity_id
    assert after.last_message_id == before.last_message_id
    assert after.unread_count == 4
    assert preview_of(store, T, CONV, 5) == PLACEHOLDER
    (change,) = [c for c in result.sessions if c.user_id == ME]
    assert [conv for conv, _ in change.touched] == [CONV]
    assert change.touched[0][1][0] == seq(5)
    assert change.badge_changed
    assert load_projection(store, T, ME).badge.total_unread == 4


def test_at13_recall_of_an_older_counted_message() -> None:
    """Target seq 3 while the preview is seq 5: unread -1, no preview change, no re-emission."""
    store = run_cut(FIVE)
    result = materialize(store, [(5, amend(6, FIVE[2]))], shard_epoch=EPOCH, config=CONFIG)
    commit(store, result)
    assert row(store).unread_count == 4
    assert row(store).latest_conversation_seq == 5
    assert preview_of(store, T, CONV, 5) == b"m5"
    # the counts changed, so the row's SESSION_DELTA carries them; preview and order stay
    (change,) = [c for c in result.sessions if c.user_id == ME]
    assert [conv for conv, _ in change.touched] == [CONV]
    delta = session_delta(
        row(store),
        load_projection(store, T, ME).state(CONV),
        driving_event_id=change.touched[0][1][2],
        driving_mailbox_seq=change.touched[0][1][0],
        preview=preview_of(store, T, CONV, row(store).latest_conversation_seq),
    )
    assert (delta.preview_or_placeholder, delta.unread_count, delta.latest_conversation_seq) == (
        b"m5",
        4,
        5,
    )
    # an older target that was never counted (own message): no row change, nothing emitted
    own = run_cut([*FIVE[:2], message(3, sender=ME), *FIVE[3:]])
    quiet = materialize(
        own, [(5, amend(6, message(3, sender=ME)))], shard_epoch=EPOCH, config=CONFIG
    )
    assert [c for c in quiet.sessions if c.user_id == ME] == []


def test_at14_edit_then_recall_of_the_preview_message_both_repair() -> None:
    store = run_cut(FIVE)
    edit = materialize(
        store,
        [(5, amend(6, FIVE[4], "edit", new_payload=b"fixed"))],
        shard_epoch=EPOCH,
        config=CONFIG,
    )
    commit(store, edit)
    assert preview_of(store, T, CONV, 5) == b"fixed"
    assert row(store).unread_count == 5  # an edit never decrements
    assert [c for c, _ in next(c for c in edit.sessions if c.user_id == ME).touched] == [CONV]
    recall = materialize(store, [(6, amend(7, FIVE[4]))], shard_epoch=EPOCH, config=CONFIG)
    commit(store, recall)
    assert preview_of(store, T, CONV, 5) == PLACEHOLDER
    assert (row(store).latest_conversation_seq, row(store).unread_count) == (5, 4)
    assert [c for c, _ in next(c for c in recall.sessions if c.user_id == ME).touched] == [CONV]


def test_at25_own_message_and_counts_unread_false_targets_do_not_decrement() -> None:
    own = message(6, sender=ME)
    silent = message(7, counts=False)
    store = run_cut([*FIVE, own, silent])
    assert row(store).unread_count == 5
    run_more = [amend(8, own), amend(9, silent)]
    log = [(7 + i, d) for i, d in enumerate(run_more)]
    commit(store, materialize(store, log, shard_epoch=EPOCH, config=CONFIG))
    assert row(store).unread_count == 5
    assert row(store).latest_conversation_seq == 7
    # the peer's own copy of ITS recalled message: the target flags drop COUNTS_UNREAD
    (peer_control,) = [e for e in entries(store, PEER) if e.event_type == EventType.CONTROL][-1:]
    assert peer_control.target_sender_id == PEER
    assert not (peer_control.target_flags or 0) & COUNTS


def test_at26_the_same_range_replayed_gives_identical_counts_and_bytes() -> None:
    records: list[ShardLogRecord] = [*FIVE, amend(6, FIVE[1]), message(7), amend(8, FIVE[4])]
    one = run_cut(records)
    cut = run_cut(records, [3, 5, 6])
    assert store_digest(one.items()) == store_digest(cut.items())
    assert row(one).unread_count == 4  # 6 counted, 2 recalled
    # from the same checkpoint (after the messages), the recall range twice
    checkpoint = run_cut(FIVE)
    tail = [(5, amend(6, FIVE[1])), (6, message(7)), (7, amend(8, FIVE[4]))]
    a, b = MemoryMailboxStore(), MemoryMailboxStore()
    for s in (a, b):
        s.apply(tuple(checkpoint.items()))
        commit(s, materialize(s, tail, shard_epoch=EPOCH, config=CONFIG))
    commit(b, materialize(b, tail, shard_epoch=EPOCH, config=CONFIG))  # redelivered: skipped
    assert store_digest(a.items()) == store_digest(b.items()) == store_digest(one.items())
    # the same amend re-appended at a later offset is deduplicated by dispatch_id
    commit(b, materialize(b, [(8, amend(6, FIVE[1]))], shard_epoch=EPOCH, config=CONFIG))
    assert row(b).unread_count == 4


def test_at27_recalls_on_an_inexact_200_never_go_below_zero() -> None:
    flood = [message(n) for n in range(1, 301)]
    store = run_cut(flood)
    assert (row(store).unread_count, row(store).unread_exact) == (200, False)
    recalls = [amend(300 + n, flood[n - 1]) for n in range(1, 301)]
    seen = []
    for i in range(0, 300, 50):
        log = [(300 + i + j, d) for j, d in enumerate(recalls[i : i + 50])]
        commit(store, materialize(store, log, shard_epoch=EPOCH, config=CONFIG))
        seen.append(row(store).unread_count)
    assert seen == [150, 100, 50, 0, 0, 0]
    assert row(store).latest_conversation_seq == 300
    assert load_projection(store, T, ME).badge.total_unread == 0


def test_the_recount_after_a_recall_excludes_the_recalled_message() -> None:
    """A MARK_READ after the recall recounts (12.5.4) from the R rows: the recalled message is
    removed as of the recall, so it is not counted again (12.5.1 ``¬recalled``)."""
    store = run_cut([*FIVE, amend(6, FIVE[3]), mark_read(7, 1)])
    assert row(store).unread_count == 3  # seq 2, 3, 5
    assert row(store).unread_exact


def test_removed_as_of_is_log_consistent() -> None:
    store = run_cut([*FIVE, amend(6, FIVE[2])])  # the recall is offset 5
    source = ShardMessageSource(store, T, ME)
    before = {m.conversation_seq: m.removed for m in source.read_range(CONV, 0, 5, 10, seq(4))}
    after = {m.conversation_seq: m.removed for m in source.read_range(CONV, 0, 5, 10, seq(5))}
    assert before == dict.fromkeys(range(1, 6), False)
    assert after == {1: False, 2: False, 3: True, 4: False, 5: False}
    assert [m.conversation_seq for m in source.read_range(CONV, 0, 5, 10, seq(2))] == [1, 2, 3]


def test_a_recalled_body_is_never_served_again_and_a_reapplied_message_does_not_undo_it() -> None:
    inline = message(6, inline_body=True)
    store = run_cut([*FIVE, inline, amend(7, FIVE[1]), amend(8, FIVE[2], "edit", new_payload=b"e")])
    commit(store, materialize(store, [(8, amend(9, inline))], shard_epoch=EPOCH, config=CONFIG))
    joined = {
        e.conversation_seq: (e.body_included, e.payload_or_ciphertext)
        for e in join_bodies(StoreMailboxReader(store, CONFIG.lane_count), T, entries(store))
        if e.event_type == EventType.MESSAGE
    }
    # 13.4 / issue 14: a recalled body is never served again, joined (2) or inline (6)
    assert joined == {
        1: (True, b"m1"),
        2: (False, None),
        3: (True, b"e"),
        4: (True, b"m4"),
        5: (True, b"m5"),
        6: (False, None),
    }
    # message 2 re-appended after its dedup row expired (log time moved past it)
    later = dispatch(
        10, conversation="c:other", participants=(ME, PEER), sender=PEER, committed_at=10**15
    )
    log = [(9, later), (10, FIVE[1])]
    result = materialize(store, log, shard_epoch=EPOCH, config=CONFIG)
    assert result.metrics["dispatch_duplicate_suppressed_total"] == 0  # really re-applied
    commit(store, result)
    assert StoreMailboxReader(store, CONFIG.lane_count).body(T, FIVE[1].message_id).payload == b""  # type: ignore[union-attr]
    assert ShardMessageSource(store, T, ME).read_range(CONV, 1, 2, 10, seq(99))[0].removed


def test_at57_one_control_entry_per_member_with_per_recipient_target_mention_type() -> None:
    """Group of four: the target @-mentions THIRD and replies to FOURTH; its recall gives each
    member one CONTROL entry with every target_* field; mention per recipient (11.4.1)."""
    group = "g:amend"
    members = [(u, 0) for u in (ME, PEER, THIRD, FOURTH)]
    target = dispatch(
        1,
        conversation=group,
        kind="group",
        sender=PEER,
        version=1,
        template=EventTemplate(mention_targets=(THIRD,), reply_to_sender_id=FOURTH),
    )
    recall = amend(2, target, actor=ME)
    log: list[ShardLogRecord] = [*group_slice(group, 1, members), target, recall]
    store = run_cut(log)
    seen = {}
    for user, _ in members:
        controls = [e for e in entries(store, user) if e.event_type == EventType.CONTROL]
        assert len(controls) == 1, user
        (c,) = controls
        assert (c.conversation_seq, c.message_id) == (2, recall.message_id)  # its own seq
        assert (c.target_message_id, c.target_conversation_seq) == (target.message_id, 1)
        assert c.target_sender_id == PEER
        assert c.origin_device_id == ("dev1" if user == ME else None)
        seen[user] = (c.target_mention_type, bool((c.target_flags or 0) & COUNTS), c.flags)
    visible = int(EntryFlags.TIMELINE_VISIBLE)
    assert seen == {
        ME: (MentionType.NONE, True, visible),
        PEER: (MentionType.NONE, False, visible),
        THIRD: (MentionType.AT_ME, True, visible),
        FOURTH: (MentionType.REPLY_ME, True, visible),
    }
    for user in (ME, THIRD, FOURTH):
        p = load_projection(store, T, user).rows[group]
        assert (p.latest_conversation_seq, p.unread_count, p.mention_count) == (1, 0, 0)


def test_rebuild_after_recalls_and_edits_equals_the_live_projection() -> None:
    """Drop-and-rebuild (final 7.5 states first, then every entry) == the live fold, with
    recalls of mentions (the first mention moves), an edit, a delete and a recount between."""
    msgs = [
        message(n, template=EventTemplate(mention_targets=(ME,) if n % 3 else ()))
        for n in range(1, 9)
    ]
    records: list[ShardLogRecord] = [
        *msgs,
        amend(9, msgs[7], "edit", new_payload=b"x"),
        amend(10, msgs[1]),
        mark_read(11, 1),
        amend(12, msgs[7]),
        amend(13, msgs[2], "delete"),
        message(14, template=EventTemplate(mention_targets=(ME,))),
    ]
    store = run_cut(records, [4, 9, 11])
    live = load_projection(store, T, ME)
    r = live.rows[CONV]
    assert r.latest_conversation_seq == 14
    # unread 4..7 and 14; mentions 4, 5, 7, 14 (2 and 8 recalled, 3 deleted, 1 read)
    assert (r.unread_count, r.mention_count, r.mention_first_conversation_seq) == (5, 4, 4)
    rebuilt = rebuild_user(store, T, ME, CONFIG.session_list, CONFIG.lane_count)
    assert rebuilt == live
    store.apply(rebuild_ops(store, T, ME, CONFIG.session_list, CONFIG.lane_count))
    assert load_projection(store, T, ME) == live


def test_at57_push_carries_the_target_fields_end_to_end() -> None:
    """materialize -> committed entries -> PushBatch -> the gateway's spliced PUSH_EVENTS: each
    device gets the CONTROL event with the same target_* as its mailbox entry."""
    group = "g:push"
    members = [(u, 0) for u in (ME, PEER, THIRD, FOURTH)]
    target = dispatch(
        1,
        conversation=group,
        kind="group",
        sender=PEER,
        version=1,
        template=EventTemplate(mention_targets=("@all",), reply_to_sender_id=FOURTH),
    )
    recall = amend(2, target)
    log: list[tuple[int, ShardLogRecord]] = list(
        enumerate([*group_slice(group, 1, members), target])
    )
    store = run_cut([r for _, r in log])
    result = materialize(store, [(len(log), recall)], shard_epoch=EPOCH, config=CONFIG)
    commit(store, result)
    now = BASE_TIME + 10_000
    cache = ShardPresenceCache(SHARD)
    for user, _ in members:
        entry = PresenceEntry(
            tenant_id=T,
            user_id=user,
            device_id="d1",
            connection_id=f"c-{user}",
            node_id="gw1",
            connection_shard=3,
            session_epoch=1,
            lease_expire_at=now + 60_000,
        )
        cache.apply(entry.key, entry, now)
    outcome = plan_batch_pushes(
        result.written,
        [(len(log), recall)],
        reader=StoreMailboxReader(store, CONFIG.lane_count),
        mailbox_shard=SHARD,
        shard_epoch=EPOCH,
        push_from_offset=0,
        presence=cache,
        now_ms=now,
    )
    (plan,) = outcome.plans
    (batch,) = plan.batches
    conns = {
        r.connection_id: Conn(T, r.user_id, r.device_id, r.session_epoch) for r in batch.recipients
    }
    pushed = {}
    for delivery in expand_batch(batch, conns).deliveries:
        (event,) = msgspec.msgpack.decode(delivery.pending.body(1), type=PushEvents).events
        pushed[conns[delivery.connection_id].user_id] = event
    # PEER is the actor: its own device "dev1" is not d1, so it is pushed too
    assert sorted(pushed) == sorted(u for u, _ in members)
    fields = (
        *("target_message_id", "target_conversation_seq", "target_sender_id"),
        *("target_flags", "target_mention_type", "conversation_seq", "mailbox_seq"),
    )
    for user, event in pushed.items():
        (stored,) = [e for e in entries(store, user) if e.event_type == EventType.CONTROL]
        assert event.event_type == EventType.CONTROL
        assert [getattr(event, f) for f in fields] == [getattr(stored, f) for f in fields]
    assert pushed[FOURTH].target_mention_type == MentionType.AT_ALL  # @all outranks REPLY_ME
    assert pushed[PEER].target_mention_type == MentionType.AT_ALL
    assert pushed[ME].target_conversation_seq == 1


def _deltas(store: MemoryMailboxStore, result: MaterializeResult) -> list[SessionDelta]:
    """The SESSION_DELTAs the shell builds from a committed fold (mailbox_session_push)."""
    out = []
    for change in result.sessions:
        if change.user_id != ME:
            continue
        p = load_projection(store, T, ME)
        for conv, key in change.touched:
            r = p.rows[conv]
            preview = preview_of(store, T, conv, r.latest_conversation_seq)
            state = p.state(conv)
            delta = session_delta(
                r, state, driving_event_id=key[2], driving_mailbox_seq=key[0], preview=preview
            )
            out.append(delta)
    return out


def test_sdk_session_list_takes_the_recall_delta_in_place() -> None:
    """The SDK keeps no timeline (qim.client): its session list applies the re-emitted row
    generically -- the new preview replaces the old, the order and latest stay."""
    other = message(0, conversation="c:older", seq_in_conversation=1)
    store = MemoryMailboxStore()
    client = SessionList()
    log = [(0, other), *((n, m) for n, m in enumerate(FIVE, start=1))]
    first = materialize(store, log, shard_epoch=EPOCH, config=CONFIG)
    commit(store, first)
    for delta in _deltas(store, first):
        assert client.apply_delta(delta, delta.driving_mailbox_seq) is DeltaOutcome.APPLIED
    order = [r.conversation_id for r in client.ordered()]
    assert order == [CONV, "c:older"]
    assert client.rows[CONV].preview_or_placeholder == b"m5"
    second = materialize(store, [(6, amend(6, FIVE[4]))], shard_epoch=EPOCH, config=CONFIG)
    commit(store, second)
    (delta,) = _deltas(store, second)
    assert client.apply_delta(delta, delta.driving_mailbox_seq) is DeltaOutcome.APPLIED
    assert [r.conversation_id for r in client.ordered()] == order
    shown = client.rows[CONV]
    assert (shown.preview_or_placeholder, shown.latest_conversation_seq) == (PLACEHOLDER, 5)
    assert shown.unread_count == 4


def test_a_recall_after_retention_folds_the_same_whether_or_not_a_sweep_ran() -> None:
    """18.3 + 12.5.5: the recall of the first mention moves it to the next one, whether or not a
    sweep removed the expired messages yet (found by the sweep-convergence property test): a
    message whose retention ended is read from the user's retained or carried entry (12.5.1
    counts the conversation's messages, issue 14), so the first mention agrees with the count."""
    day = 24 * 3600 * 1000
    mentions = EventTemplate(mention_targets=(ME,))
    old = [
        dispatch(n, conversation=CONV, sender=PEER, participants=(ME, PEER), template=mentions)
        for n in (1, 2, 3)
    ]
    later = BASE_TIME + 10 * day  # the three above are past retention by then
    new = dispatch(
        4, conversation=CONV, sender=PEER, participants=(ME, PEER), template=mentions,
        committed_at=later,
    )  # fmt: skip
    recall = amend(5, old[0], committed_at=later)
    log: list[tuple[int, ShardLogRecord]] = list(enumerate([*old, new, recall]))

    def run_log(sweep_each: bool) -> MemoryMailboxStore:
        store = MemoryMailboxStore()
        for item in log:
            commit(store, materialize(store, [item], shard_epoch=EPOCH, config=CONFIG))
            if sweep_each:
                store.apply(retention_sweep(store, 1 << 62, CONFIG).ops)
        store.apply(retention_sweep(store, 1 << 62, CONFIG).ops)
        return store

    swept, unswept = run_log(True), run_log(False)
    assert store_digest(swept.items()) == store_digest(unswept.items())
    row = load_projection(unswept, T, ME).rows[CONV]
    assert (row.mention_count, row.mention_first_conversation_seq) == (3, 2)  # 2, 3 and 4
    rebuilt = rebuild_user(swept, T, ME, CONFIG.session_list, CONFIG.lane_count).rows[CONV]
    assert msgspec.structs.replace(rebuilt, projection_mailbox_seq=0) == msgspec.structs.replace(
        load_projection(swept, T, ME).rows[CONV], projection_mailbox_seq=0
    )
