"""A trimmed mailbox keeps its session list, live and rebuilt alike (issue 14, spec 12.1, 12.2).

The finding: on the suite's shared stack ``qim replay projections`` reported a direct
conversation with 3 unread as ``badge (3, 0, 0) != (0, 0, 0)``. Its 3 messages were committed
40 days before the log time (``test_mailbox_node``'s expiry case); the retention sweep trimmed
the entries, the live projection kept the row (12.1: "the list stays correct after the mailbox
has been trimmed"), and the rebuild, which refolded only the retained entries, lost the row
and its unread. The same happens when the entry cap evicts. Trimming now keeps what the fold
needs of the trimmed entries (``qim.core.mailbox.carry``), so a rebuild gives the live list.
"""

from __future__ import annotations

import msgspec

from qim.core.mailbox import (
    DAY_MS,
    MailboxConfig,
    MemoryMailboxStore,
    replay,
    retention_sweep,
    store_digest,
)
from qim.core.mailbox.sessions import load_projection, rebuild_user
from qim.core.session_list import UserProjection
from qim.schemas.records.dispatch import EventTemplate, GroupDispatch, ShardLogRecord
from qim.schemas.records.user_state import UserStateCommand
from tests.unit.mailbox.support import BASE_TIME, CONFIG, EPOCH, T, amend, dispatch, local_users

ME, ALICE, BOB = local_users(3, "p")
DAY0 = BASE_TIME - BASE_TIME % DAY_MS
LIMIT = CONFIG.session_list.unread_precise_limit


def _content(p: UserProjection) -> tuple[object, ...]:
    """What a device sees (``projection_replay._content``): rows without stamps, the badge."""
    rows = {c: msgspec.structs.replace(r, projection_mailbox_seq=0) for c, r in p.rows.items()}
    return rows, p.badge.sums


def _old_then_new() -> list[tuple[int, ShardLogRecord]]:
    """ALICE writes ME 3 messages on day 0 (one mentions ME); 20 days later BOB writes once."""
    old = [
        dispatch(
            n,
            conversation="d:alice",
            sender=ALICE,
            participants=(ME, ALICE),
            seq_in_conversation=n,
            committed_at=DAY0 + n * 1000,
            template=EventTemplate(mention_targets=(ME,) if n == 2 else ()),
        )
        for n in (1, 2, 3)
    ]
    new = dispatch(
        4,
        conversation="d:bob",
        sender=BOB,
        participants=(ME, BOB),
        seq_in_conversation=1,
        committed_at=DAY0 + 20 * DAY_MS,
    )
    return list(enumerate([*old, new]))


def _rebuilt(store: MemoryMailboxStore, config: MailboxConfig = CONFIG) -> UserProjection:
    return rebuild_user(store, T, ME, config.session_list, config.lane_count)


def test_a_time_trimmed_conversation_keeps_its_row_and_unread_in_the_rebuild() -> None:
    store = replay(_old_then_new(), shard_epoch=EPOCH, config=CONFIG)
    before = load_projection(store, T, ME)
    assert before.rows["d:alice"].unread_count == 3
    assert before.badge.sums == (4, 1, 0)
    store.apply(retention_sweep(store, 1 << 62, CONFIG).ops)
    assert store_digest(store.items()) != store_digest(
        replay(_old_then_new(), shard_epoch=EPOCH, config=CONFIG).items()
    ), "the sweep trimmed nothing: the case does not test trimming"
    live = load_projection(store, T, ME)
    assert _content(live) == _content(before)  # trimming never touches the list (12.1)
    assert _content(_rebuilt(store)) == _content(live)


def test_a_recall_after_the_trim_is_decremented_once_live_and_rebuilt() -> None:
    log = _old_then_new()
    target = log[2][1]
    assert isinstance(target, GroupDispatch)
    store = replay(log, shard_epoch=EPOCH, config=CONFIG)
    store.apply(retention_sweep(store, 1 << 62, CONFIG).ops)
    recall = amend(5, target, actor=ALICE, committed_at=DAY0 + 20 * DAY_MS + 1)
    replay([(5, recall)], shard_epoch=EPOCH, config=CONFIG, store=store)
    live = load_projection(store, T, ME)
    assert live.rows["d:alice"].unread_count == 2
    assert _content(_rebuilt(store)) == _content(live)


def test_an_entry_cap_eviction_keeps_the_row_and_unread_in_the_rebuild() -> None:
    config = MailboxConfig(mailbox_shard=0, mailbox_shard_count=4, max_mailbox_entries_per_user=10)
    log = [
        (
            n,
            dispatch(
                n + 1,
                conversation=f"d:{n % 3}",
                sender=ALICE if n % 4 else ME,
                participants=(ME, ALICE),
                seq_in_conversation=n // 3 + 1,
            ),
        )
        for n in range(25)
    ]
    store = replay(log, shard_epoch=EPOCH, config=config, batch_sizes=[4])
    live = load_projection(store, T, ME)
    assert sum(r.unread_count for r in live.rows.values()) > 10  # more than the mailbox holds
    assert _content(_rebuilt(store, config)) == _content(live)


def test_carrying_the_trimmed_entries_keeps_replay_byte_identical_under_any_sweeps() -> None:
    """The carry is a function of the set of trimmed entries: sweeping after every record
    leaves what one final sweep leaves (``qim replay mailbox``'s identical-after-sweep)."""
    log = _old_then_new()
    once = replay(log, shard_epoch=EPOCH, config=CONFIG)
    once.apply(retention_sweep(once, 1 << 62, CONFIG).ops)
    often = MemoryMailboxStore()
    for item in log:
        replay([item], shard_epoch=EPOCH, config=CONFIG, store=often)
        often.apply(retention_sweep(often, 1 << 62, CONFIG).ops)
    assert store_digest(often.items()) == store_digest(once.items())


def test_more_trimmed_unread_than_the_precise_limit_stays_inexact_in_the_rebuild() -> None:
    flood = [
        (
            n,
            dispatch(
                n + 1,
                conversation="d:flood",
                sender=ALICE,
                participants=(ME, ALICE),
                seq_in_conversation=n + 1,
                committed_at=DAY0 + n,
            ),
        )
        for n in range(LIMIT + 20)
    ]
    late = dispatch(
        LIMIT + 30,
        conversation="d:bob",
        sender=BOB,
        participants=(ME, BOB),
        seq_in_conversation=1,
        committed_at=DAY0 + 20 * DAY_MS,
    )
    store = replay([*flood, (LIMIT + 20, late)], shard_epoch=EPOCH, config=CONFIG)
    store.apply(retention_sweep(store, 1 << 62, CONFIG).ops)
    live = load_projection(store, T, ME)
    row = live.rows["d:flood"]
    assert (row.unread_count, row.unread_exact) == (LIMIT, False)
    assert _content(_rebuilt(store)) == _content(live)


def _read(n: int, conv: str, read_seq: int, committed_at: int) -> UserStateCommand:
    return UserStateCommand(
        tenant_id=T,
        user_id=ME,
        conversation_id=conv,
        action="mark_read",
        command_id=n.to_bytes(16, "big"),
        origin_device_id="phone",
        target_mailbox_shard=CONFIG.mailbox_shard,
        committed_at=committed_at,
        read_conversation_seq=read_seq,
    )


def test_a_partial_read_after_the_expiry_still_counts_the_expired_messages_above_it() -> None:
    """12.5.1 counts the conversation's messages, not the mailbox's: reading 1 of 3 expired
    messages leaves 2 unread, before and after the sweep, live and rebuilt alike."""
    log = _old_then_new()
    later = DAY0 + 20 * DAY_MS + 5
    swept_first = replay(log, shard_epoch=EPOCH, config=CONFIG)
    swept_first.apply(retention_sweep(swept_first, 1 << 62, CONFIG).ops)
    replay(
        [(4, _read(1, "d:alice", 1, later))], shard_epoch=EPOCH, config=CONFIG, store=swept_first
    )
    unswept = replay([*log, (4, _read(1, "d:alice", 1, later))], shard_epoch=EPOCH, config=CONFIG)
    for store in (swept_first, unswept):
        live = load_projection(store, T, ME)
        assert live.rows["d:alice"].unread_count == 2
        assert live.rows["d:alice"].mention_count == 1  # seq 2 mentions ME
    assert _content(load_projection(swept_first, T, ME)) == _content(
        load_projection(unswept, T, ME)
    )
    assert _content(_rebuilt(swept_first)) == _content(load_projection(swept_first, T, ME))
    unswept.apply(retention_sweep(unswept, 1 << 62, CONFIG).ops)
    assert store_digest(unswept.items()) == store_digest(swept_first.items())
