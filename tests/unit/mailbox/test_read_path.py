"""PULL_MAILBOX's storage reads and the read-time join (spec 2.3 criterion 1, 9.1, 7.3, 18.3.1)."""

from __future__ import annotations

from qim.core.mailbox import MemoryMailboxStore, StoreMailboxReader, join_bodies
from qim.core.mailbox.keys import user_entry_prefix
from qim.schemas import EventType, lane_id
from qim.schemas.frames.base import EntryFlags, MentionType
from qim.schemas.records.dispatch import EventTemplate
from tests.unit.mailbox.support import CONFIG, T, dispatch, local_users, numbered, run, seq


def _shard_with_500_events() -> tuple[MemoryMailboxStore, str, list[int]]:
    """500 one-to-one messages among 40 users of the shard; user ``a`` is in exactly 3."""
    users = local_users(41)
    a, others = users[0], users[1:]
    records = []
    a_offsets = [7, 216, 490]
    for n in range(500):
        if n in a_offsets:
            pair = (a, others[n % len(others)])
        else:
            pair = (others[n % len(others)], others[(n * 7 + 1) % len(others)])
            if pair[0] == pair[1]:
                pair = (pair[0], others[(n + 3) % len(others)])
        records.append(
            dispatch(n + 1, conversation=f"d:{n}", sender=pair[1], participants=sorted(pair))
        )
    store = MemoryMailboxStore()
    run(store, numbered(records))
    return store, a, [seq(o) for o in a_offsets]


def test_2_3_criterion_1_pull_reads_at_most_3_keys_plus_1_seek_and_no_other_user() -> None:
    store, a, a_seqs = _shard_with_500_events()
    reader = StoreMailboxReader(store, CONFIG.lane_count)
    up_to = reader.lane_watermark(lane_id(T, a, CONFIG.lane_count))
    store.access.reset()
    groups = list(reader.read_user_range(T, a, 0, up_to))
    assert [s for s, _ in groups] == a_seqs
    assert store.access.seeks == 1
    assert store.access.key_reads <= 3
    assert store.access.seeks + store.access.key_reads <= 3 + 1
    prefix = user_entry_prefix(T, a)
    assert all(key.startswith(prefix) for key in store.access.keys)


def test_9_3_range_is_open_below_closed_above_and_reads_one_key_past_up_to() -> None:
    store, a, a_seqs = _shard_with_500_events()
    reader = StoreMailboxReader(store, CONFIG.lane_count)
    store.access.reset()
    groups = list(reader.read_user_range(T, a, a_seqs[0], a_seqs[1]))
    assert [s for s, _ in groups] == [a_seqs[1]]
    assert store.access.key_reads == 2  # the entry, and the one key that ends the scan
    assert list(reader.read_user_range(T, a, a_seqs[2], a_seqs[2])) == []


def test_6_7_reader_returns_an_event_group_whole_in_ordinal_order() -> None:
    from qim.core.mailbox import MailboxConfig

    config = MailboxConfig(mailbox_shard=0, mailbox_shard_count=4, mention_entries=True)
    a, b = local_users(2)
    d = dispatch(
        1,
        sender=b,
        participants=(a, b),
        template=EventTemplate(mention_targets=(a,)),
    )
    store = MemoryMailboxStore()
    run(store, numbered([d]), config)
    reader = StoreMailboxReader(store, config.lane_count)
    [(mailbox_seq, entries)] = list(reader.read_user_range(T, a, 0, seq(0)))
    assert mailbox_seq == seq(0)
    assert [e.event_type for e in entries] == [EventType.MESSAGE, EventType.MENTION]
    assert all(e.mailbox_seq == mailbox_seq for e in entries)


def test_18_3_1_bodies_are_joined_once_per_message_and_inline_entries_skip_the_join() -> None:
    a, b = local_users(2)
    store = MemoryMailboxStore()
    records = [
        dispatch(1, sender=b, participants=(a, b), payload=b"joined"),
        dispatch(2, sender=b, participants=(a, b), payload=b"inline", inline_body=True),
    ]
    run(store, numbered(records))
    reader = StoreMailboxReader(store, CONFIG.lane_count)
    entries = [e for _, group in reader.read_user_range(T, a, 0, seq(1)) for e in group]
    assert [e.body_included for e in entries] == [False, True]
    assert entries[1].payload_or_ciphertext == b"inline"
    store.access.reset()
    joined = join_bodies(reader, T, entries + entries)
    # per message once, however many entries: its facts row (recall state 13.4 and reaction
    # aggregate 13.6 in one read), and message 1's body
    assert store.access.gets == 3
    assert [e.payload_or_ciphertext for e in joined] == [b"joined", b"inline"] * 2
    assert all(e.body_included for e in joined)


def test_7_3_entry_reference_fields_come_from_the_dispatch() -> None:
    a, b = local_users(2)
    d = dispatch(3, sender=b, participants=(a, b), template=EventTemplate(mention_targets=(a,)))
    store = MemoryMailboxStore()
    run(store, numbered([d]))
    reader = StoreMailboxReader(store, CONFIG.lane_count)
    [(_, [entry])] = list(reader.read_user_range(T, a, 0, seq(0)))
    assert entry.message_id == d.message_id and entry.last_activity_id == d.last_activity_id
    assert (entry.conversation_id, entry.conversation_seq) == (d.conversation_id, 3)
    assert entry.created_at == d.committed_at and entry.sender_id == b
    assert entry.flags == EntryFlags.COUNTS_UNREAD | EntryFlags.AFFECTS_SESSION_ORDER | (
        EntryFlags.TIMELINE_VISIBLE
    )
    assert entry.mention_type == MentionType.AT_ME
    assert entry.client_message_id is None and entry.body_included is False
