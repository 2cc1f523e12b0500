"""The session list folded inside ``materialize`` (qim.core.mailbox.sessions, user_state).

Checks the shard-side wiring against a reference computed from the dispatched history alone:
order, previews, unread and mention counts; MARK_READ as a log record; the byte-identical
replay under any batch cutting; drop-and-rebuild; mark unread, delete and resurrection.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

import msgspec

from qim.core.fanout.build import MEMBERSHIP_TEMPLATE
from qim.core.mailbox import (
    MemoryMailboxStore,
    StoreMailboxReader,
    commit,
    materialize,
    store_digest,
)
from qim.core.mailbox.sessions import (
    drop_ops,
    load_projection,
    preview_of,
    rebuild_ops,
    rebuild_user,
)
from qim.core.mailbox.user_state import USER_STATE_CUSTOM_TYPE
from qim.core.session_list import SessionListConfig, UserProjection, load_snapshot
from qim.schemas.events import EventType
from qim.schemas.frames.history import SessionEntry
from qim.schemas.records.dispatch import EventTemplate, GroupDispatch, ShardLogRecord
from qim.schemas.records.membership import (
    MEMBERSHIP_CUSTOM_TYPE,
    MembershipControl,
    encode_control,
)
from qim.schemas.records.user_state import UserStateCommand
from tests.unit.mailbox.support import (
    BASE_TIME,
    CONFIG,
    EPOCH,
    SHARD,
    T,
    amend,
    dispatch,
    local_users,
    run,
)

ME, *SENDERS = local_users(4, "s")
CONVS = [f"c{i}" for i in range(5)]
LIMIT = CONFIG.session_list.unread_precise_limit


def _history(count: int, seed: int = 7) -> list[GroupDispatch]:
    """``count`` messages from 3 senders (and some of ME's own) into 5 direct conversations."""
    rng = random.Random(seed)
    seqs = dict.fromkeys(CONVS, 0)
    out = []
    for n in range(1, count + 1):
        conv = rng.choice(CONVS)
        seqs[conv] += 1
        sender = rng.choice([*SENDERS, ME]) if n % 7 else ME
        mention = (ME,) if rng.random() < 0.2 else ()
        out.append(
            dispatch(
                n,
                conversation=conv,
                sender=sender,
                participants=(ME, sender) if sender != ME else (ME, SENDERS[0]),
                seq_in_conversation=seqs[conv],
                template=EventTemplate(mention_targets=mention),
                payload=f"m{n}".encode(),
            )
        )
    return out


def _reference(history: Sequence[GroupDispatch], read: dict[str, int]) -> list[tuple[object, ...]]:
    """The list from history alone: (conv, latest, preview, unread, exact, mentions), ordered
    by last activity descending."""
    rows = []
    for conv in CONVS:
        msgs = [d for d in history if d.conversation_id == conv]
        if not msgs:
            continue
        last = max(msgs, key=lambda d: d.conversation_seq)
        base = read.get(conv, 0)
        others = [d for d in msgs if d.sender_id != ME and d.conversation_seq > base]
        unread = len(others)
        mentions = sum(1 for d in others if ME in d.event_template.mention_targets)
        exact = unread <= LIMIT
        rows.append(
            (
                last.last_activity_id,
                conv,
                last.conversation_seq,
                last.payload,
                min(unread, LIMIT),
                exact,
                mentions,
            )
        )
    rows.sort(reverse=True)
    return [r[1:] for r in rows]


def _listed(
    store: MemoryMailboxStore, projection: UserProjection | None = None
) -> list[SessionEntry]:
    p = projection or load_projection(store, T, ME)
    previews = {c: preview_of(store, T, c, r.latest_conversation_seq) for c, r in p.rows.items()}
    return list(load_snapshot(p, 1, CONFIG.session_list, previews).sessions)


def _shown(entries: Sequence[SessionEntry]) -> list[tuple[object, ...]]:
    return [
        (
            e.conversation_id,
            e.latest_conversation_seq,
            e.preview_or_placeholder,
            e.unread_count,
            e.unread_exact,
            e.mention_count,
        )
        for e in entries
    ]


def _command(action: str, conv: str, n: int, **fields: object) -> UserStateCommand:
    return UserStateCommand(
        tenant_id=T,
        user_id=ME,
        conversation_id=conv,
        action=action,
        command_id=n.to_bytes(16, "big"),
        target_mailbox_shard=SHARD,
        committed_at=BASE_TIME + n,
        origin_device_id="phone",
        **fields,  # type: ignore[arg-type]
    )


def _cut_run(records: Sequence[ShardLogRecord], cuts: Sequence[int]) -> MemoryMailboxStore:
    store = MemoryMailboxStore()
    log = list(enumerate(records))
    bounds = [0, *cuts, len(log)]
    for lo, hi in itertools.pairwise(bounds):
        if hi > lo:
            commit(store, materialize(store, log[lo:hi], shard_epoch=EPOCH, config=CONFIG))
    return store


def test_list_equals_the_reference_from_history_and_replay_is_byte_identical() -> None:
    """300 messages, 3 senders, 5 conversations: order, previews, unread, mentions as computed
    from history; own messages never count; any batch cutting gives the same store bytes."""
    history = _history(300)
    one = _cut_run(history, [])
    many = _cut_run(history, [1, 17, 18, 150, 299])
    assert _shown(_listed(one)) == _reference(history, {})
    assert store_digest(one.items()) == store_digest(many.items())
    badge = load_projection(one, T, ME).badge
    assert badge.total_unread == sum(r[3] for r in _reference(history, {}))  # type: ignore[misc]


def test_mark_read_is_a_log_record_with_a_control_entry_and_forward_only() -> None:
    history = _history(120)
    conv = history[-1].conversation_id
    latest = history[-1].conversation_seq
    records: list[ShardLogRecord] = [
        *history,
        _command("mark_read", conv, 1001, read_conversation_seq=latest),
    ]
    records.append(_command("mark_read", conv, 1002, read_conversation_seq=1))  # backwards
    store = _cut_run(records, [60])
    result_rows = _shown(_listed(store))
    assert result_rows == _reference(history, {conv: latest})
    entries = [
        e
        for _, group in StoreMailboxReader(store, CONFIG.lane_count).read_user_range(
            T, ME, 0, 2**62
        )
        for e in group
        if e.event_type == EventType.CONTROL
    ]
    assert len(entries) == 1  # the backwards MARK_READ wrote nothing
    assert entries[0].custom_type == USER_STATE_CUSTOM_TYPE
    assert entries[0].origin_device_id == "phone"
    assert entries[0].conversation_seq == latest


def test_250_unread_is_inexact_and_a_rebuild_gives_the_identical_list() -> None:
    """Case 26.4.3: drop the projection, rebuild from entries + 7.5 state -> the same list,
    the manual-unread mark included; 250 unread in one conversation -> unread_exact=false."""
    flood = [
        dispatch(
            n,
            conversation="big",
            sender=SENDERS[1],
            participants=(ME, SENDERS[1]),
            seq_in_conversation=n,
            payload=b"x",
        )
        for n in range(1, 251)
    ]
    history = _history(40)
    shifted = [
        dispatch(
            300 + i,
            conversation=d.conversation_id,
            sender=d.sender_id,
            participants=d.participants,
            seq_in_conversation=d.conversation_seq,
            template=d.event_template,
            payload=d.payload,
        )
        for i, d in enumerate(history)
    ]
    conv = shifted[0].conversation_id
    records: list[ShardLogRecord] = [*flood, *shifted]
    records.append(_command("mark_read", conv, 2001, read_conversation_seq=10**6))
    records.append(_command("mark_unread", conv, 2002))
    store = _cut_run(records, [100, 260])
    before = _listed(store)
    big = next(e for e in before if e.conversation_id == "big")
    assert (big.unread_count, big.unread_exact) == (LIMIT, False)
    marked = next(e for e in before if e.conversation_id == conv)
    assert (marked.unread_count, marked.unread_exact) == (1, False)

    store.apply(drop_ops(store, T, ME))  # drop header and rows
    assert load_projection(store, T, ME).rows == {}
    rebuilt = rebuild_user(store, T, ME, CONFIG.session_list, CONFIG.lane_count)
    assert _shown(_listed(store, rebuilt)) == _shown(before)
    assert rebuilt.badge.sums == load_projection(_cut_run(records, []), T, ME).badge.sums
    store.apply(rebuild_ops(store, T, ME, CONFIG.session_list, CONFIG.lane_count))
    assert _shown(_listed(store)) == _shown(before)


def test_delete_hides_and_a_new_message_resurrects() -> None:
    history = _history(30)
    conv = history[-1].conversation_id
    store = _cut_run([*history, _command("delete", conv, 3001)], [])
    assert conv not in [e.conversation_id for e in _listed(store)]
    # INV-32: the live fold keeps no row at or below deleted_before, exactly like a rebuild
    # (`qim replay projections` compares the two row for row)
    live = load_projection(store, T, ME)
    assert conv not in live.rows
    assert live.rows == rebuild_user(store, T, ME, CONFIG.session_list, CONFIG.lane_count).rows
    later = dispatch(
        500,
        conversation=conv,
        sender=SENDERS[2],
        participants=(ME, SENDERS[2]),
        seq_in_conversation=history[-1].conversation_seq + 1,
        payload=b"back",
    )
    run(store, [(len(history) + 1, later)])
    (row,) = [e for e in _listed(store) if e.conversation_id == conv]
    assert (row.preview_or_placeholder, row.unread_count) == (b"back", 1)
    assert _listed(store)[0].conversation_id == conv  # newest activity first


def test_session_config_default_is_the_b6_one() -> None:
    assert SessionListConfig().unread_precise_limit == LIMIT == 200


def _membership(
    n: int, group: str, seq: int, action: str, actor: str | None = None
) -> GroupDispatch:
    control = MembershipControl(
        action=action,
        group_id=group,
        actor=actor or ME,
        targets=(ME,),
        membership_version=n,
        member_count=3,
    )
    return msgspec.structs.replace(
        dispatch(
            n,
            conversation=group,
            kind="group",
            sender=ME,
            participants=(ME,),
            seq_in_conversation=seq,
            template=MEMBERSHIP_TEMPLATE,
        ),
        event_type=int(EventType.MEMBERSHIP),
        custom_type=MEMBERSHIP_CUSTOM_TYPE,
        payload=encode_control(control),
    )


def _in_group(n: int, group: str, seq: int) -> GroupDispatch:
    return dispatch(
        n,
        conversation=group,
        kind="group",
        sender=SENDERS[0],
        participants=(ME, SENDERS[0]),
        seq_in_conversation=seq,
    )


def test_leave_hides_the_group_and_late_messages_do_not_resurrect_it() -> None:
    """7.5: a leave at J sets left_at = J (state record before its MEMBERSHIP entry); the
    group leaves the list and the badge; a message above J (even if it reached the mailbox)
    and a late one below J bring nothing back; a re-join shows it again."""
    group = "g:club"
    records: list[ShardLogRecord] = [_in_group(1, group, 1)]
    store = _cut_run(records, [])
    assert [e.conversation_id for e in _listed(store)] == [group]
    late = _in_group(5, group, 2)  # committed before the leave, dispatched after it
    run_more = [_membership(3, group, 3, "leave"), _in_group(4, group, 5), late]
    store = _cut_run([*records, *run_more], [2])
    assert _listed(store) == []
    assert load_projection(store, T, ME).rows[group].latest_conversation_seq == 2
    assert load_projection(store, T, ME).badge.sums == (0, 0, 0)
    state = load_projection(store, T, ME).state(group)
    assert (state.membership_state, state.left_at_conversation_seq) == ("LEFT", 3)
    rejoined = _cut_run(
        [*records, *run_more, _membership(6, group, 6, "add"), _in_group(7, group, 7)], []
    )
    (row,) = _listed(rejoined)
    assert (row.conversation_id, row.latest_conversation_seq, row.unread_count) == (group, 7, 1)
    assert load_projection(rejoined, T, ME).badge.total_unread == 1


def test_a_removal_in_its_own_batch_clears_the_badge_share_and_replays_identically() -> None:
    """12.9: a removal clears that conversation's unread and the badge is the sum over the
    user's conversations, also when the MEMBERSHIP dispatch is the first record of a batch
    that touches the group (the live cutting) -- and the store equals a replay's in one batch.
    A recall after the removal changes nothing."""
    group = "g:removed"
    direct = dispatch(4, conversation="d:direct", sender=SENDERS[1], participants=(ME, SENDERS[1]))
    messages = [_in_group(n, group, n) for n in (1, 2, 3)]
    removal = _membership(5, group, 4, "remove", actor=SENDERS[0])
    recall = amend(6, messages[1], seq_in_conversation=5)
    records: list[ShardLogRecord] = [*messages, direct, removal, recall]
    live = _cut_run(records, [4, 5])
    assert [e.conversation_id for e in _listed(live)] == ["d:direct"]
    assert load_projection(live, T, ME).badge.sums == (1, 0, 0)
    assert store_digest(live.items()) == store_digest(_cut_run(records, []).items())


def test_a_created_group_is_a_membership_entry_and_a_top_row_for_every_member() -> None:
    """10.1.3 / 12.9: create is a MEMBERSHIP event; every initial member (the creator too)
    gets its entry and the group at the top of the list, unread 0, before any message."""
    from qim.core.fanout import FanoutConfig, FanoutState
    from tests.unit.fanout.support import Outbox, pipeline

    creator, *invitees = local_users(3, "cg")
    outbox = Outbox(shards=CONFIG.mailbox_shard_count, tenant=T)
    outbox.direct(invitees[1], invitees[0])
    outbox.create("g:new", creator, invitees)
    produced = pipeline(outbox, FanoutState(FanoutConfig(mailbox_shard_count=4)))
    mine = [r for r in produced if getattr(r, "target_mailbox_shard", None) == SHARD]
    mine += [r for r in produced if getattr(r, "mailbox_shard", None) == SHARD]
    store = MemoryMailboxStore()
    run(store, list(enumerate(sorted(mine, key=produced.index))))
    reader = StoreMailboxReader(store, CONFIG.lane_count)
    for user in (creator, *invitees):
        entries = [e for _, g in reader.read_user_range(T, user, 0, 1 << 62) for e in g]
        kinds = [(e.conversation_id, e.event_type) for e in entries]
        assert ("g:new", EventType.MEMBERSHIP) in kinds
        p = load_projection(store, T, user)
        previews = {
            c: preview_of(store, T, c, r.latest_conversation_seq) for c, r in p.rows.items()
        }
        listed = load_snapshot(p, 1, CONFIG.session_list, previews).sessions
        assert listed[0].conversation_id == "g:new"
        assert listed[0].unread_count == 0
        assert p.state("g:new").membership_state == "ACTIVE"
