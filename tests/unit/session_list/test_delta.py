"""SESSION_DELTA / BADGE_UPDATE: absolute values, replacement merge, versioned client apply."""

from __future__ import annotations

import inspect

from qim.core.session_list import (
    ClientSessionCache,
    DeltaOutcome,
    MarkRead,
    UserConversationState,
    apply_change,
    badge_update,
    delta_merge,
    read_sync,
)
from qim.core.session_list.delta_merge import DeltaMergeBuffer
from qim.schemas.frames.history import SessionDelta


def delta(conv: str, version: int, unread: int, driving: int | None = None) -> SessionDelta:
    return SessionDelta(
        conversation_id=conv,
        driving_event_id=version * 10,
        driving_mailbox_seq=version if driving is None else driving,
        projection_mailbox_seq=version,
        unread_count=unread,
        unread_exact=True,
    )


def test_absolute_value_idempotency_26_4_4_AT_30() -> None:
    client = ClientSessionCache()
    frame = delta("k", 500, 7)
    outcomes = [client.apply_delta(frame, last_applied_mailbox_seq=500) for _ in range(100)]
    assert outcomes[0] is DeltaOutcome.APPLIED
    assert outcomes[1:] == [DeltaOutcome.DROPPED] * 99
    late = delta("k", 499, 3)
    assert client.apply_delta(late, last_applied_mailbox_seq=500) is DeltaOutcome.DROPPED
    held = client.sessions["k"]
    assert (held.unread_count, held.projection_mailbox_seq) == (7, 500)


def test_client_handler_has_no_additive_unread_path_26_4_4() -> None:
    source = inspect.getsource(ClientSessionCache.apply_delta)
    assert "unread" not in source  # whole-frame overwrite: no field arithmetic at all
    merge_source = inspect.getsource(delta_merge._merge)  # the window's merge rule
    assert "+" not in merge_source.split('"""')[-1]


def test_merge_window_replaces_per_conversation_AT_32() -> None:
    window: DeltaMergeBuffer[str] = DeltaMergeBuffer(100)
    for v in range(1, 11):
        window.offer("conn", delta("a", v, v), now_ms=0)
    window.offer("conn", delta("b", 3, 1), now_ms=0)
    window.offer("conn", delta("a", 4, 99), now_ms=0)  # older than the held one: dropped
    [(_, frames)] = window.due(100)
    assert [f.conversation_id for f in frames if isinstance(f, SessionDelta)] == ["a", "b"]
    a = frames[0]
    assert isinstance(a, SessionDelta)
    assert (a.unread_count, a.projection_mailbox_seq) == (10, 10)  # the last frame, not 55


def test_gap_pulls_instead_of_applying_and_is_rate_limited_AT_33() -> None:
    client = ClientSessionCache(resync_min_interval_ms=5000)
    assert client.apply_delta(delta("k", 90, 4, driving=90), 80) is DeltaOutcome.GAP
    assert "k" not in client.sessions
    assert client.may_resync(now_ms=1000)
    assert not client.may_resync(now_ms=5999)
    assert client.may_resync(now_ms=6000)


def test_badge_applies_only_strictly_newer_INV_54() -> None:
    client = ClientSessionCache()
    assert client.apply_badge(badge_update(3, 1, 0, 10))
    assert not client.apply_badge(badge_update(9, 9, 9, 10))
    assert not client.apply_badge(badge_update(9, 9, 9, 9))
    assert client.apply_badge(badge_update(0, 0, 0, 11))
    assert client.badge is not None and client.badge.total_unread == 0


def test_read_sync_only_when_mark_read_advances_AT_44() -> None:
    base = UserConversationState(conversation_id="c", read_conversation_seq=10)
    ahead = apply_change(base, MarkRead(12), activity_id=1)
    frame = read_sync(base, ahead)
    assert frame is not None and frame.read_conversation_seq == 12
    assert read_sync(ahead, apply_change(ahead, MarkRead(11), activity_id=2)) is None
