"""The shard's copy of a message's reaction aggregate (13.6, 18.3.1): a ``ReactionSummary`` of
the dispatch log overwrites the counts on the message's facts row when its version is newer,
writes no entry, and PULL_MAILBOX's join returns it with the message, inline or joined."""

from __future__ import annotations

from qim.core.mailbox import MemoryMailboxStore, StoreMailboxReader, join_bodies
from qim.schemas.frames.reactions import MessageReactions
from qim.schemas.records.dispatch import GroupDispatch, ReactionSummary
from tests.unit.mailbox.support import (
    BASE_TIME,
    CONFIG,
    SHARD,
    T,
    amend,
    dispatch,
    local_users,
    numbered,
    run,
    seq,
)


def _summary(
    target: GroupDispatch, version: int, counts: dict[str, int], shard: int = SHARD
) -> ReactionSummary:
    return ReactionSummary(
        tenant_id=T,
        conversation_id=target.conversation_id,
        message_id=target.message_id,
        conversation_seq=target.conversation_seq,
        counts=counts,
        summary_version=version,
        target_mailbox_shard=shard,
        committed_at=BASE_TIME + 100_000 + version,
    )


def _pulled(
    store: MemoryMailboxStore, user: str, up_to: int
) -> list[tuple[bytes, MessageReactions | None]]:
    reader = StoreMailboxReader(store, CONFIG.lane_count)
    entries = [e for _, group in reader.read_user_range(T, user, 0, up_to) for e in group]
    return [(e.message_id, e.reactions) for e in join_bodies(reader, T, entries)]


def test_13_6_a_pulled_entry_carries_the_newest_aggregate_and_no_entry_is_written() -> None:
    a, b = local_users(2)
    message = dispatch(1, sender=b, participants=(a, b))
    log = numbered(
        [
            message,
            _summary(message, 1, {"+1": 1}),
            _summary(message, 3, {"+1": 2, "heart": 1}),
            _summary(message, 2, {"+1": 2}),  # older version arriving later: ignored
            _summary(message, 3, {"+1": 2, "heart": 1}),  # redelivery: ignored
        ]
    )
    result = run(store := MemoryMailboxStore(), log)
    assert result.metrics["mailbox_entries_written_total"] == 2  # the message's two entries only
    [(mid, reactions)] = _pulled(store, a, seq(len(log) - 1))
    assert mid == message.message_id
    assert reactions is not None
    assert reactions.counts == {"+1": 2, "heart": 1}
    assert reactions.summary_version == 3


def test_13_6_an_inline_message_carries_its_aggregate_with_its_own_body() -> None:
    a, b = local_users(2)
    message = dispatch(1, sender=b, participants=(a, b), inline_body=True, payload=b"hi")
    log = numbered([message, _summary(message, 1, {"like": 1})])
    result = run(store := MemoryMailboxStore(), log)
    assert result.metrics["reaction_summary_applied_total"] == 1
    reader = StoreMailboxReader(store, CONFIG.lane_count)
    entries = [e for _, group in reader.read_user_range(T, a, 0, seq(1)) for e in group]
    [joined] = join_bodies(reader, T, entries)
    assert joined.payload_or_ciphertext == b"hi" and joined.body_included
    assert joined.reactions == MessageReactions(counts={"like": 1}, summary_version=1)


def test_13_6_4_a_recall_drops_the_aggregate_from_pulled_entries() -> None:
    a, b = local_users(2)
    message = dispatch(1, sender=b, participants=(a, b))
    run(store := MemoryMailboxStore(), numbered([message, _summary(message, 1, {"+1": 1})]))
    assert dict(_pulled(store, a, seq(1)))[message.message_id] is not None
    run(store, numbered([amend(2, message), _summary(message, 2, {"+1": 2})], start=2))
    pulled = dict(_pulled(store, a, seq(3)))
    assert pulled[message.message_id] is None  # and a later summary does not bring it back
    facts = StoreMailboxReader(store, CONFIG.lane_count).facts(
        T, message.conversation_id, message.conversation_seq, message.message_id
    )
    assert facts is not None and facts.reaction_counts == {}  # gone from the store too


def test_13_6_a_summary_for_a_message_without_copy_or_for_another_shard_changes_nothing() -> None:
    a, b = local_users(2)
    message = dispatch(1, sender=b, participants=(a, b))
    empty = MemoryMailboxStore()
    run(empty, numbered([_summary(message, 1, {"+1": 1})]))
    run(empty, numbered([message], start=1))
    assert _pulled(empty, a, seq(1)) == [(message.message_id, None)]  # not kept ahead of its copy
    run(store := MemoryMailboxStore(), numbered([message]))
    result = run(store, numbered([_summary(message, 1, {"+1": 1}, shard=SHARD + 1)], start=1))
    assert result.metrics["dispatch_misrouted_total"] == 1
    assert _pulled(store, a, seq(1)) == [(message.message_id, None)]


def test_4_2_replaying_a_log_with_summaries_gives_identical_bytes_however_it_is_cut() -> None:
    a, b = local_users(2)
    message = dispatch(1, sender=b, participants=(a, b))
    log = numbered(
        [
            message,
            _summary(message, 1, {"b": 1, "a": 1}),
            dispatch(3, sender=a, participants=(a, b)),
            _summary(message, 2, {"a": 1}),
        ]
    )
    whole = MemoryMailboxStore()
    run(whole, log)
    cut = MemoryMailboxStore()
    for i in range(len(log)):
        run(cut, log[i : i + 1])
    assert sorted(whole.items()) == sorted(cut.items())
