"""The SDK's local session list (qim.client.sessions): 12.6.2 overwrite, 12.8.3 dedup, gaps."""

from __future__ import annotations

import msgspec

from qim.client.sessions import SessionList
from qim.core.mailbox.user_state import USER_STATE_CUSTOM_TYPE
from qim.core.session_list import DeltaOutcome, UserConversationState
from qim.schemas.frames import PushEvents, SyncEntry
from qim.schemas.frames.base import EventType, u128_to_bytes
from qim.schemas.frames.control import ReadSync
from qim.schemas.frames.history import BadgeUpdate, SessionDelta, SessionEntry, SessionListBatch


def entry(conv: str, activity: int, unread: int = 0, **fields: object) -> SessionEntry:
    return SessionEntry(
        conversation_id=conv,
        latest_conversation_seq=activity,
        last_activity_id=u128_to_bytes(activity),
        unread_count=unread,
        **fields,  # type: ignore[arg-type]
    )


def delta(conv: str, version: int, *, driving: int, unread: int, activity: int) -> SessionDelta:
    return SessionDelta(
        conversation_id=conv,
        driving_mailbox_seq=driving,
        projection_mailbox_seq=version,
        latest_conversation_seq=activity,
        last_activity_id=u128_to_bytes(activity),
        unread_count=unread,
        unread_exact=True,
    )


def page(revision: int, *rows: SessionEntry, more: bool = False) -> SessionListBatch:
    return SessionListBatch(sessions=rows, snapshot_revision=revision, has_more=more)


def test_deltas_overwrite_by_version_and_reorder_the_list() -> None:
    s = SessionList()
    assert s.apply_page(page(1, entry("a", 9, 2), entry("b", 5, 1), more=True), first=True)
    assert s.apply_delta(delta("b", 10, driving=10, unread=3, activity=12), 10) is (
        DeltaOutcome.APPLIED
    )
    assert [r.conversation_id for r in s.ordered()] == ["b", "a"]
    # a duplicate or older frame changes nothing (never additive)
    assert s.apply_delta(delta("b", 10, driving=10, unread=9, activity=13), 10) is (
        DeltaOutcome.DROPPED
    )
    assert s.rows["b"].unread_count == 3
    # a later page repeating "b" does not undo the delta (12.8.3 dedup by conversation_id)
    assert s.apply_page(page(1, entry("b", 5, 1)), first=False)
    assert s.rows["b"].unread_count == 3


def test_a_reloaded_page_brings_pin_and_archive_to_a_delta_versioned_row() -> None:
    s = SessionList()
    s.apply_page(page(1, entry("a", 9, 2)), first=True)
    s.apply_delta(delta("a", 10, driving=10, unread=3, activity=12), 10)
    # another device pinned and archived "a": no delta carries that, a new revision's page does
    s.apply_page(page(2, entry("a", 9, 2, pin_rank=1, archived=True, muted=True)), first=True)
    row = s.rows["a"]
    assert (row.pin_rank, row.archived, row.muted) == (1, True, True)
    assert (row.unread_count, row.latest_conversation_seq) == (3, 12)  # the delta's content


def test_a_new_revision_mid_paging_restarts() -> None:
    s = SessionList()
    s.apply_page(page(1, entry("a", 9), more=True), first=True)
    assert not s.apply_page(page(2, entry("z", 1)), first=False)
    assert s.rows == {} and s.revision == 2


def test_a_gap_is_held_until_the_mailbox_catches_up() -> None:
    s = SessionList()
    s.apply_page(page(1, entry("a", 9, 4)), first=True)
    assert s.apply_delta(delta("a", 20, driving=20, unread=0, activity=9), 15) is DeltaOutcome.GAP
    assert s.rows["a"].unread_count == 4  # nothing guessed
    assert s.caught_up(19) == 0
    assert s.caught_up(20) == 1
    assert s.rows["a"].unread_count == 0


def test_read_sync_is_forward_only_and_clears_a_fully_read_row() -> None:
    s = SessionList()
    s.apply_page(page(1, entry("a", 9, 4), entry("b", 7, 2)), first=True)
    assert s.apply_read_sync(ReadSync(conversation_id="a", read_conversation_seq=9))
    assert (s.rows["a"].unread_count, s.rows["a"].read_conversation_seq) == (0, 9)
    assert not s.apply_read_sync(ReadSync(conversation_id="a", read_conversation_seq=3))
    assert s.apply_read_sync(ReadSync(conversation_id="b", read_conversation_seq=5))
    assert s.rows["b"].unread_count == 2  # partly read: the SESSION_DELTA brings the count


def test_badge_only_moves_forward_and_zones_order_pinned_normal_archived() -> None:
    s = SessionList()
    assert s.on_frame(BadgeUpdate(total_unread=5, badge_projection_mailbox_seq=7), 0)
    s.on_frame(BadgeUpdate(total_unread=9, badge_projection_mailbox_seq=6), 0)
    assert s.badge is not None and s.badge.total_unread == 5
    s.apply_page(
        page(1, entry("n", 50), entry("p", 1, pin_rank=0), entry("x", 99, archived=True)),
        first=True,
    )
    assert [r.conversation_id for r in s.ordered()] == ["p", "n", "x"]
    assert [r.conversation_id for r in s.ordered(include_archived=False)] == ["p", "n"]


def test_pushed_user_state_entries_bring_pin_mute_archive_and_delete_at_once() -> None:
    def control(conv: str, seq: int, state: UserConversationState) -> SyncEntry:
        return SyncEntry(
            mailbox_seq=seq,
            event_type=EventType.CONTROL,
            conversation_id=conv,
            custom_type=USER_STATE_CUSTOM_TYPE,
            payload_or_ciphertext=msgspec.msgpack.encode(state),
        )

    s = SessionList()
    s.apply_page(page(1, entry("a", 9, 2), entry("b", 5, 1)), first=True)
    pinned = UserConversationState(conversation_id="a", pin_rank=1, muted=True, archived=True)
    deleted = UserConversationState(conversation_id="b", deleted_before_conversation_seq=5)
    assert not s.on_frame(PushEvents(events=(control("a", 20, pinned),)), 0)  # the sync's frame
    row = s.rows["a"]
    assert (row.pin_rank, row.muted, row.archived) == (1, True, True)
    # an older state entry (redelivered) never undoes a newer one
    s.apply_state_entries([control("a", 19, UserConversationState(conversation_id="a"))])
    assert s.rows["a"].pin_rank == 1
    s.apply_state_entries([control("b", 21, deleted)])
    assert "b" not in s.rows  # INV-32: a deleted conversation leaves the list
    # a message above deleted_before brings it back through the next SESSION_DELTA / page
    s.apply_delta(delta("b", 30, driving=30, unread=1, activity=6), 30)
    assert s.rows["b"].unread_count == 1
