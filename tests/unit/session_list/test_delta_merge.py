"""The ConnectionNode's merge window (12.6.3), pure: replace never add, versions only forward,
conversations independent, windows by the injected ``now``, badge latest-wins, close drops."""

from __future__ import annotations

import pytest

from qim.core.session_list.delta_merge import DeltaMergeBuffer
from qim.schemas.frames.history import BadgeUpdate, SessionDelta

W = 150


def delta(conv: str, version: int, unread: int, mentions: int = 0) -> SessionDelta:
    return SessionDelta(
        conversation_id=conv,
        projection_mailbox_seq=version,
        driving_mailbox_seq=version,
        latest_conversation_seq=version * 10,
        unread_count=unread,
        mention_count=mentions,
        preview_or_placeholder=f"p{version}".encode(),
    )


def badge(version: int, unread: int) -> BadgeUpdate:
    return BadgeUpdate(total_unread=unread, badge_projection_mailbox_seq=version)


def test_a_later_delta_replaces_the_held_one_whole_never_adds() -> None:
    buf: DeltaMergeBuffer[str] = DeltaMergeBuffer(W)
    assert buf.offer("c1", delta("a", 5, unread=3, mentions=1), now_ms=1000) == 0
    assert buf.offer("c1", delta("a", 7, unread=4, mentions=0), now_ms=1010) == 1
    ((key, frames),) = buf.due(1000 + W)
    assert key == "c1"
    assert frames == (delta("a", 7, unread=4, mentions=0),)  # 4, not 7; mentions 0, not 1
    assert (buf.offered, buf.merged_away) == (2, 1)


def test_a_lower_version_never_replaces_a_higher_one_an_equal_one_does() -> None:
    buf: DeltaMergeBuffer[str] = DeltaMergeBuffer(W)
    buf.offer("c1", delta("a", 9, unread=6), now_ms=0)
    assert buf.offer("c1", delta("a", 8, unread=5), now_ms=1) == 1  # late: dropped
    assert buf.held("c1") == (delta("a", 9, unread=6),)
    replay = SessionDelta(conversation_id="a", projection_mailbox_seq=9, unread_count=6)
    buf.offer("c1", replay, now_ms=2)
    assert buf.held("c1") == (replay,)
    assert buf.merged_away == 2


def test_different_conversations_and_connections_all_survive_in_first_arrival_order() -> None:
    buf: DeltaMergeBuffer[str] = DeltaMergeBuffer(W)
    buf.offer("c1", delta("b", 3, unread=1), now_ms=0)
    buf.offer("c1", delta("a", 4, unread=2), now_ms=1)
    buf.offer("c1", delta("b", 5, unread=9), now_ms=2)  # replaces b, keeps b's place
    buf.offer("c2", delta("b", 2, unread=7), now_ms=3)  # another connection: separate
    due = dict(buf.due(10_000))
    assert due["c1"] == (delta("b", 5, unread=9), delta("a", 4, unread=2))
    assert due["c2"] == (delta("b", 2, unread=7),)
    assert buf.merged_away == 1 and len(buf) == 0


def test_a_window_ends_a_fixed_time_after_its_first_frame() -> None:
    buf: DeltaMergeBuffer[str] = DeltaMergeBuffer(W)
    assert buf.next_due_ms() is None
    buf.offer("c1", delta("a", 1, unread=1), now_ms=100)
    buf.offer("c2", delta("a", 1, unread=1), now_ms=120)
    buf.offer("c1", delta("a", 2, unread=2), now_ms=240)  # later frames do not extend it
    assert buf.next_due_ms() == 100 + W
    assert buf.due(100 + W - 1) == []
    assert [k for k, _ in buf.due(100 + W)] == ["c1"]
    assert buf.next_due_ms() == 120 + W
    buf.offer("c1", delta("a", 3, unread=3), now_ms=300)  # a new window for c1
    assert [k for k, _ in buf.due(120 + W)] == ["c2"]
    assert buf.next_due_ms() == 300 + W
    assert buf.due(300 + W) == [("c1", (delta("a", 3, unread=3),))]
    assert buf.next_due_ms() is None


def test_the_badge_is_the_latest_version_and_goes_after_the_deltas() -> None:
    buf: DeltaMergeBuffer[str] = DeltaMergeBuffer(W)
    buf.offer("c1", badge(4, unread=8), now_ms=0)
    buf.offer("c1", delta("a", 4, unread=8), now_ms=0)
    buf.offer("c1", badge(6, unread=5), now_ms=1)
    assert buf.offer("c1", badge(5, unread=7), now_ms=2) == 1  # reordered: dropped
    assert buf.due(W) == [("c1", (delta("a", 4, unread=8), badge(6, unread=5)))]
    assert buf.merged_away == 2


def test_discard_drops_the_held_frames_and_their_window() -> None:
    buf: DeltaMergeBuffer[str] = DeltaMergeBuffer(W)
    buf.offer("c1", delta("a", 1, unread=1), now_ms=0)
    buf.offer("c1", badge(1, unread=1), now_ms=0)
    buf.offer("c2", delta("a", 1, unread=1), now_ms=10)
    assert buf.discard("c1") == 2
    assert buf.discard("c1") == 0
    assert buf.next_due_ms() == 10 + W  # c1's window is gone with it
    assert [k for k, _ in buf.due(10_000)] == ["c2"]
    buf.offer("c1", delta("a", 2, unread=2), now_ms=20)  # a new connection life: fresh window
    assert buf.due(20 + W - 1) == []
    assert buf.due(20 + W) == [("c1", (delta("a", 2, unread=2),))]


def test_a_zero_window_is_due_at_once_and_a_negative_one_is_refused() -> None:
    buf: DeltaMergeBuffer[str] = DeltaMergeBuffer(0)
    buf.offer("c1", delta("a", 1, unread=1), now_ms=5)
    assert buf.due(5) == [("c1", (delta("a", 1, unread=1),))]
    with pytest.raises(ValueError):
        DeltaMergeBuffer(-1)
