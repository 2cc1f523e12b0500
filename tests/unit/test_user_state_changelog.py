"""UserConversationState changelog (qim.tables.user_state_changelog, topology decision 41):
records from a WriteBatch, the Faust table layout, restore onto a store, and the replay on top
of restored rows that skips what a row already reflects."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import faust
from faust.types import TP

from qim.agents.mailbox.shard import OwnedShard
from qim.core.mailbox import MemoryMailboxStore, commit, materialize
from qim.core.mailbox.session_store import CONV_STATE, decode_state, state_key, state_prefix
from qim.schemas.records.dispatch import ShardLogRecord
from qim.schemas.records.user_state import UserStateCommand
from qim.schemas.seqs import compose_mailbox_seq
from qim.streams.topics import USER_CONVERSATION_STATE_CHANGELOG
from qim.tables.user_state_changelog import (
    APP_ID,
    CHANGED_KEY,
    PUBLISHED_KEY,
    changed_rows,
    changelog_key,
    changelog_records,
    declare_table,
    decode_changelog_value,
    restore_ops,
    unpublished_rows,
)
from tests.unit.mailbox.support import BASE_TIME, CONFIG, EPOCH, SHARD, T, dispatch, local_users

ME, OTHER = local_users(2, "s")
CONV = f"d:{ME}:{OTHER}"


def _command(action: str, n: int, **fields: object) -> UserStateCommand:
    return UserStateCommand(
        tenant_id=T,
        user_id=ME,
        conversation_id=CONV,
        action=action,
        command_id=n.to_bytes(16, "big"),
        target_mailbox_shard=SHARD,
        committed_at=BASE_TIME + n,
        origin_device_id="phone",
        **fields,  # type: ignore[arg-type]
    )


def _log() -> list[ShardLogRecord]:
    msgs = [
        dispatch(
            n, conversation=CONV, sender=OTHER, participants=(ME, OTHER), seq_in_conversation=n
        )
        for n in range(1, 4)
    ]
    return [
        *msgs,
        _command("mark_read", 101, read_conversation_seq=2),  # offset 3
        _command("pin", 102, pin_rank=1),  # offset 4
        _command("mute", 103, flag=True),  # offset 5
        _command("pin", 104, pin_rank=None),  # offset 6: unpinned again
        _command("pin", 105, pin_rank=3),  # offset 7
    ]


def _fold(store: MemoryMailboxStore, log: Sequence[tuple[int, ShardLogRecord]]) -> list[object]:
    result = materialize(store, log, shard_epoch=EPOCH, config=CONFIG)
    commit(store, result)
    return list(result.ops)


def _u_rows(store: MemoryMailboxStore) -> dict[bytes, bytes]:
    return dict(store.scan(CONV_STATE, CONV_STATE, False))


def _changelog_of(store: MemoryMailboxStore) -> dict[bytes, bytes]:
    """What the changelog holds after publishing every row of ``store``."""
    records = changelog_records(sorted(_u_rows(store).items()), mailbox_shard=SHARD, mailbox_seq=0)
    return {k: v for k, v in records if v is not None}


def test_a_batch_gives_one_record_per_changed_row_with_its_own_offset() -> None:
    store = MemoryMailboxStore()
    ops = materialize(store, list(enumerate(_log())), shard_epoch=EPOCH, config=CONFIG).ops
    rows = changed_rows(ops)
    assert [k for k, _ in rows] == [state_key(T, ME, CONV)]
    (record,) = changelog_records(rows, mailbox_shard=SHARD, mailbox_seq=0)
    assert record[0] == changelog_key(state_key(T, ME, CONV)) == state_key(T, ME, CONV)[1:]
    assert record[1] is not None
    value = decode_changelog_value(record[1])
    assert (value.mailbox_shard, value.shard_epoch, value.offset) == (SHARD, EPOCH, 7)
    state = value.state()
    assert (state.read_conversation_seq, state.pin_rank, state.muted) == (2, 3, True)
    assert value.row == dict(ops)[state_key(T, ME, CONV)]


def test_restore_then_replaying_the_whole_retained_tail_equals_the_live_rows() -> None:
    """The log's head (offsets 0-4) is gone; rows come back from the changelog, the tail
    (5-7: mute, unpin, pin) replays on top and changes nothing the rows already reflect --
    without the skip, the pin commands would bump state_version again."""
    log = list(enumerate(_log()))
    live = MemoryMailboxStore()
    _fold(live, log)
    changelog = _changelog_of(live)
    fresh = MemoryMailboxStore()
    ops, newest = restore_ops(fresh, changelog)
    assert newest == compose_mailbox_seq(EPOCH, 7)
    fresh.apply(ops)
    _fold(fresh, log[5:])
    assert _u_rows(fresh) == _u_rows(live)
    # and a later command applies normally on both
    later = [(8, _command("mute", 106, flag=False))]
    _fold(live, later)
    _fold(fresh, later)
    assert _u_rows(fresh) == _u_rows(live)
    assert decode_state(_u_rows(live)[state_key(T, ME, CONV)]).muted is False


def test_restore_keeps_a_row_the_store_already_has_at_a_later_change() -> None:
    log = list(enumerate(_log()))
    older, newer = MemoryMailboxStore(), MemoryMailboxStore()
    _fold(older, log[:5])
    _fold(newer, log)
    stale = _changelog_of(older)
    ops, newest = restore_ops(newer, stale)
    assert ops == [] and newest == 0
    ops, _ = restore_ops(MemoryMailboxStore(), stale)
    assert ops == sorted(_u_rows(older).items())


def test_unpublished_rows_are_those_changed_after_the_published_mark() -> None:
    store = MemoryMailboxStore()
    _fold(store, list(enumerate(_log())))
    assert [k for k, _ in unpublished_rows(store, compose_mailbox_seq(EPOCH, 6))] == [
        state_key(T, ME, CONV)
    ]
    assert list(unpublished_rows(store, compose_mailbox_seq(EPOCH, 7))) == []
    assert all(k.startswith(state_prefix(T, ME)) for k, _ in unpublished_rows(store, 0))


def test_a_faust_rocksdb_table_over_the_topic_recovers_and_reads_the_rows(tmp_path: Path) -> None:
    """What Faust's table recovery does with the changelog's records (apply_changelog_batch
    into its RocksDB store), then a read by key: the MailboxNode's bytes come back as written."""
    app = faust.App(APP_ID, broker="kafka://127.0.0.1:1", store="rocksdb://", datadir=tmp_path)
    table = declare_table(app, partitions=8)
    name = table.changelog_topic.get_topic_name()
    assert name == USER_CONVERSATION_STATE_CHANGELOG.name
    assert USER_CONVERSATION_STATE_CHANGELOG.cleanup == "compact"
    store = MemoryMailboxStore()
    ops = materialize(store, list(enumerate(_log())), shard_epoch=EPOCH, config=CONFIG).ops
    ((key, value),) = changelog_records(changed_rows(ops), mailbox_shard=SHARD, mailbox_seq=0)
    assert value is not None
    message = SimpleNamespace(tp=TP(name, SHARD), partition=SHARD, offset=0, key=key, value=value)
    table.apply_changelog_batch([SimpleNamespace(message=message)])
    read = table[key]
    assert read == value
    assert decode_changelog_value(read).state().pin_rank == 3


def test_a_shard_counts_its_unpublished_rows_across_restarts() -> None:
    """``ucs-changed`` is in the fold's WriteBatch, ``ucs-published`` only after the acks: a
    restart between them sees rows to re-publish; a store folded before the changelog existed
    (rows, no markers) re-publishes everything once."""
    store = MemoryMailboxStore()
    shard = OwnedShard(SHARD, store, CONFIG, EPOCH)
    assert (shard.ucs_changed, shard.ucs_published) == (0, 0)
    result = shard.materialize(list(enumerate(_log())))
    rows = shard.write(result)
    assert [k for k, _ in rows] == [state_key(T, ME, CONV)]
    again = OwnedShard(SHARD, store, CONFIG, EPOCH)  # "crashed" before the produce
    assert again.ucs_changed == result.applied_seq > again.ucs_published == 0
    again.mark_ucs_published(again.ucs_changed)
    done = OwnedShard(SHARD, store, CONFIG, EPOCH)
    assert done.ucs_changed == done.ucs_published == result.applied_seq
    legacy = MemoryMailboxStore()
    legacy.apply((k, v) for k, v in store.items() if k not in (CHANGED_KEY, PUBLISHED_KEY))
    old = OwnedShard(SHARD, legacy, CONFIG, EPOCH)
    assert old.ucs_changed > old.ucs_published == 0
