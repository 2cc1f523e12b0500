"""The dispatch executor's rules (spec 10.1, 7.8, 19.2.1, 6.7, 6.9.1; seed 003 section 3.1)."""

from __future__ import annotations

import pytest

from qim.core.mailbox import (
    MailboxConfig,
    MemoryMailboxStore,
    StoreMailboxReader,
    materialize,
)
from qim.core.mailbox.keys import BODY, DISPATCH, ENTRY
from qim.schemas import EventType, event_id
from qim.schemas.frames.base import MENTION_ALL, EntryFlags, MentionType
from qim.schemas.frames.mailbox import SyncEntry
from qim.schemas.records.dispatch import DispatchLogRecord, EventTemplate, GroupDispatch
from tests.unit.mailbox.support import (
    CONFIG,
    EPOCH,
    T,
    dispatch,
    group_slice,
    local_users,
    numbered,
    remote_user,
    run,
    seq,
)

G = "g:team"


def _entries(store: MemoryMailboxStore, user: str) -> list[SyncEntry]:
    reader = StoreMailboxReader(store, CONFIG.lane_count)
    return [e for _, group in reader.read_user_range(T, user, 0, 1 << 62) for e in group]


def _count(store: MemoryMailboxStore, tag: bytes) -> int:
    return sum(1 for key, _ in store.items() if key.startswith(tag))


def test_10_1_2_reappended_dispatch_is_ignored_and_its_first_offset_defines_the_seq() -> None:
    a, b = local_users(2)
    d = dispatch(1, sender=b, participants=(a, b))
    store = MemoryMailboxStore()
    first = run(store, [(5, d)])
    again = run(store, [(9, d)])
    assert [e.mailbox_seq for e in _entries(store, a)] == [seq(5)]
    assert first.metrics["mailbox_entries_written_total"] == 2
    assert again.metrics["dispatch_duplicate_suppressed_total"] == 1
    assert again.metrics["mailbox_entries_written_total"] == 0
    assert again.written == ()


def test_19_2_1_stale_fencing_epoch_is_dropped_whole_and_counted() -> None:
    a, b = local_users(2)
    store = MemoryMailboxStore()
    log = numbered(
        [
            dispatch(1, sender=b, participants=(a, b), fencing_epoch=2),
            dispatch(2, sender=b, participants=(a, b), fencing_epoch=3),
            dispatch(3, sender=b, participants=(a, b), fencing_epoch=2),  # late old writer
            dispatch(4, sender=b, participants=(a, b), fencing_epoch=3),
        ]
    )
    result = run(store, log)
    assert [e.conversation_seq for e in _entries(store, a)] == [1, 2, 4]
    assert result.metrics["stale_epoch_dispatch_dropped_total"] == 1
    later = run(store, [(10, dispatch(5, sender=b, participants=(a, b), fencing_epoch=1))])
    assert later.metrics["stale_epoch_dispatch_dropped_total"] == 1  # the max is durable


def test_10_1_step_9_members_who_joined_at_or_after_the_seq_get_nothing() -> None:
    old, joiner, late = local_users(3)
    store = MemoryMailboxStore()
    members = [(old, 10), (joiner, 499), (late, 500)]  # joined_at = join event seq - 1 (7.5)
    at_500 = dispatch(
        9, conversation=G, kind="group", sender=old, version=7, seq_in_conversation=500
    )
    run(store, numbered([*group_slice(G, 7, members), at_500]))
    assert [e.visibility_floor_conversation_seq for e in _entries(store, old)] == [10]
    assert [e.visibility_floor_conversation_seq for e in _entries(store, joiner)] == [499]
    assert _entries(store, late) == []


def test_10_1_step_9_a_leaver_gets_its_own_notice_at_left_at_and_nothing_after() -> None:
    stay, leaver = local_users(2)
    before = [(stay, 0), (leaver, 0)]
    in_flight = dispatch(
        1, conversation=G, kind="group", sender=stay, version=2, seq_in_conversation=9
    )
    leave = dispatch(  # LEAVE_GROUP commits seq 10 = left_at and publishes version 3 (A.3)
        2,
        conversation=G,
        kind="group",
        sender=leaver,
        version=3,
        seq_in_conversation=10,
        participants=(leaver,),
        event_type=EventType.MEMBERSHIP,
        template=EventTemplate(counts_unread=False),
    )
    after = dispatch(
        3, conversation=G, kind="group", sender=stay, version=3, seq_in_conversation=11
    )
    slices = [*group_slice(G, 2, before), *group_slice(G, 3, [(stay, 0)])]
    log: list[DispatchLogRecord] = [*slices, in_flight, leave, after]
    store = MemoryMailboxStore()
    run(store, numbered(log))
    assert [(e.conversation_seq, e.event_type) for e in _entries(store, leaver)] == [
        (9, EventType.MESSAGE),  # left before: seq 9 < left_at = 10 is still delivered
        (10, EventType.MEMBERSHIP),  # left at exactly the seq: only its own notice
    ]
    assert [e.conversation_seq for e in _entries(store, stay)] == [9, 10, 11]


def test_6_9_1_sender_entry_carries_client_message_id_and_never_counts_unread() -> None:
    a, b = local_users(2)
    template = EventTemplate(mention_targets=(a, b))
    d = dispatch(1, sender=b, participants=(a, b), template=template, client_message_id="c-1")
    store = MemoryMailboxStore()
    run(store, numbered([d]))
    [own] = _entries(store, b)
    [theirs] = _entries(store, a)
    assert own.client_message_id == "c-1" and theirs.client_message_id is None
    assert not own.flags & EntryFlags.COUNTS_UNREAD
    assert theirs.flags & EntryFlags.COUNTS_UNREAD


def test_9_7_control_events_carry_origin_device_id_on_the_senders_entry_only() -> None:
    a, b = local_users(2)
    d = dispatch(1, sender=b, participants=(a, b), event_type=EventType.CONTROL)
    store = MemoryMailboxStore()
    run(store, numbered([d]))
    assert [e.origin_device_id for e in _entries(store, b)] == ["dev1"]
    assert [e.origin_device_id for e in _entries(store, a)] == [None]
    assert [e.event_ordinal for e in _entries(store, a)] == [EventType.CONTROL]


def test_6_7_message_and_mention_form_one_event_group_with_deterministic_event_ids() -> None:
    config = MailboxConfig(mailbox_shard=0, mailbox_shard_count=4, mention_entries=True)
    a, b = local_users(2)
    d = dispatch(1, sender=b, participants=(a, b), template=EventTemplate(mention_targets=(a,)))
    store = MemoryMailboxStore()
    run(store, [(4, d)], config)
    message, mention = _entries(store, a)
    assert message.mailbox_seq == mention.mailbox_seq == seq(4)
    assert (message.event_ordinal, mention.event_ordinal) == (0, 1)
    assert message.event_id == event_id(T, d.dispatch_id, a, EventType.MESSAGE)
    assert mention.event_id == event_id(T, d.dispatch_id, a, EventType.MENTION)
    assert message.mention_type == mention.mention_type == MentionType.AT_ME
    assert mention.flags == 0  # unread and order stay with the MESSAGE entry
    assert [e.event_type for e in _entries(store, b)] == [EventType.MESSAGE]


def test_11_4_1_under_always_mentions_only_set_mention_type_on_the_message_entry() -> None:
    a, b, c = local_users(3)
    members = [(a, 0), (b, 0), (c, 0)]
    template = EventTemplate(mention_targets=(a, MENTION_ALL), reply_to_sender_id=c)
    d = dispatch(1, conversation=G, kind="group", sender=b, version=1, template=template)
    store = MemoryMailboxStore()
    run(store, numbered([*group_slice(G, 1, members), d]))
    assert [e.mention_type for e in _entries(store, a)] == [MentionType.AT_ME]
    assert [e.mention_type for e in _entries(store, c)] == [MentionType.AT_ALL]
    assert _count(store, ENTRY) == 3  # I-29: one entry per recipient, no MENTION entries


def test_11_4_1_reply_to_me_when_not_otherwise_mentioned() -> None:
    a, b = local_users(2)
    d = dispatch(1, sender=b, participants=(a, b), template=EventTemplate(reply_to_sender_id=a))
    store = MemoryMailboxStore()
    run(store, numbered([d]))
    assert [e.mention_type for e in _entries(store, a)] == [MentionType.REPLY_ME]


def test_7_8_direct_dispatch_reaches_only_participants_on_this_shard() -> None:
    (a,) = local_users(1)
    far = remote_user()
    store = MemoryMailboxStore()
    result = run(store, numbered([dispatch(1, sender=far, participants=(a, far))]))
    assert [(d.user_id, d.mailbox_seq) for d in result.written] == [(a, seq(0))]
    assert _entries(store, far) == []


def test_7_8_a_dispatch_for_another_shard_is_counted_and_changes_nothing() -> None:
    a, b = local_users(2)
    store = MemoryMailboxStore()
    result = run(store, numbered([dispatch(1, sender=b, participants=(a, b), shard=3)]))
    assert result.metrics["dispatch_misrouted_total"] == 1
    assert _count(store, ENTRY) == 0 and _count(store, DISPATCH) == 0


def test_2_3_criterion_2_a_group_body_is_stored_once_per_shard() -> None:
    members = [(u, 0) for u in local_users(100)]
    store = MemoryMailboxStore()
    d = dispatch(1, conversation=G, kind="group", sender=members[0][0], version=1)
    run(store, numbered([*group_slice(G, 1, members, chunk=30), d]))
    assert _count(store, ENTRY) == 100
    assert _count(store, BODY) == 1
    assert all(not e.body_included for e in _entries(store, members[5][0]))


def test_10_1_3_a_membership_event_without_broadcast_reaches_only_its_subjects() -> None:
    a, b, c = local_users(3)

    def notice(n: int, version: int) -> GroupDispatch:
        membership = EventType.MEMBERSHIP
        return dispatch(
            n,
            conversation=G,
            kind="group",
            sender=a,
            version=version,
            participants=(b,),
            event_type=membership,
        )

    quiet = notice(1, version=0)  # above the broadcast threshold: pins no version (10.1.3)
    store = MemoryMailboxStore()
    run(store, numbered([*group_slice(G, 2, [(a, 0), (b, 0), (c, 0)]), quiet]))
    assert [e.event_type for e in _entries(store, b)] == [EventType.MEMBERSHIP]
    assert _entries(store, a) == [] and _entries(store, c) == []
    loud = notice(2, version=2)  # broadcast: the other members get a MESSAGE entry
    run(store, [(5, loud)])
    assert [e.event_type for e in _entries(store, b)][-1] == EventType.MEMBERSHIP
    assert [e.event_type for e in _entries(store, c)] == [EventType.MESSAGE]


def test_7_8_pending_slice_dispatch_is_materialized_at_its_own_seq_when_the_slice_completes() -> (
    None
):
    members = [(u, 0) for u in local_users(10)]
    first, second = group_slice(G, 3, members, chunk=5)
    d = dispatch(1, conversation=G, kind="group", sender=members[0][0], version=3)
    store = MemoryMailboxStore()
    waiting = run(store, [(0, first), (1, d), (2, d)])  # ADR-0017: chunk 2 retried after d
    assert waiting.metrics["dispatch_pending_slice_total"] == 1
    assert waiting.metrics["dispatch_duplicate_suppressed_total"] == 1
    assert [p.mailbox_seq for p in waiting.pending] == [seq(1)]
    assert _count(store, ENTRY) == 0
    done = run(store, [(3, second)])
    assert done.metrics["dispatch_slice_resolved_total"] == 1
    assert done.pending == ()
    assert {e.mailbox_seq for u, _ in members for e in _entries(store, u)} == {seq(1)}


def test_unknown_event_type_is_refused_not_guessed() -> None:
    a, b = local_users(2)
    store = MemoryMailboxStore()
    result = run(store, numbered([dispatch(1, sender=b, participants=(a, b), event_type=9)]))
    assert result.metrics["dispatch_invalid_total"] == 1 and _count(store, ENTRY) == 0


def test_6_5_epochs_start_at_1_and_never_go_back() -> None:
    store = MemoryMailboxStore()
    with pytest.raises(ValueError, match="shard_epoch"):
        materialize(store, [], shard_epoch=0, config=CONFIG)
    a, b = local_users(2)
    run(store, numbered([dispatch(1, sender=b, participants=(a, b))]), epoch=EPOCH + 1)
    with pytest.raises(ValueError, match="shard_epoch"):
        materialize(store, [], shard_epoch=EPOCH, config=CONFIG)
