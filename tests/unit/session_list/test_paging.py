"""Session-list paging (12.8): keyset order, signed cursors, revisions; property (3)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from qim.core.session_list import (
    SessionListConfig,
    SessionRow,
    SnapshotSlot,
    UserConversationState,
    UserProjection,
    load_snapshot,
    merge_in_place,
    page,
    page_all,
    refresh_slot,
    sort_key,
)
from qim.schemas.frames import Error, ErrorCode
from qim.schemas.frames.base import u128_from_bytes
from qim.schemas.frames.codec import encode_body
from qim.schemas.frames.history import PullSessionList, SessionListBatch

KEY = b"k" * 32
CONFIG = SessionListConfig()


def projection(rows: list[tuple[str, int, int | None, bool]]) -> UserProjection:
    """``(conversation_id, last_activity_id, pin_rank, archived)`` rows, all listed."""
    return UserProjection(
        user_id="u",
        rows={
            c: SessionRow(conversation_id=c, latest_conversation_seq=1, last_activity_id=a)
            for c, a, _, _ in rows
        },
        states={
            c: UserConversationState(conversation_id=c, pin_rank=pin, archived=arch)
            for c, _, pin, arch in rows
        },
    )


def pull(snapshot_revision: int, cursor: bytes = b"", limit: int = 0) -> PullSessionList:
    return PullSessionList(snapshot_revision=snapshot_revision, page_cursor=cursor, limit=limit)


def serve(snapshot: object, request: PullSessionList, user: str = "u") -> SessionListBatch:
    batch = page(snapshot, request, CONFIG, key=KEY, tenant_id="t", user_id=user)  # type: ignore[arg-type]
    assert isinstance(batch, SessionListBatch)
    return batch


rows_strategy = st.lists(
    st.tuples(st.integers(0, 40), st.none() | st.integers(-2, 3), st.booleans()),
    max_size=120,
).map(lambda items: [(f"c{i:03d}", a, pin, arch) for i, (a, pin, arch) in enumerate(items)])


@settings(max_examples=150, deadline=None)
@given(rows=rows_strategy, limit=st.integers(0, 300))
def test_paging_visits_every_conversation_once_in_order(
    rows: list[tuple[str, int, int | None, bool]], limit: int
) -> None:
    """Property (3): under one revision, the pages partition the list, in sort order."""
    p = projection(rows)
    snap = load_snapshot(p, 7, CONFIG)
    pages = list(page_all(snap, CONFIG, key=KEY, tenant_id="t", user_id="u", limit=limit))
    seen = [s.conversation_id for b in pages for s in b.sessions]
    assert len(seen) == len(set(seen)) == len(rows)
    expected = sorted(p.rows, key=lambda c: sort_key(p.rows[c], p.state(c)))
    assert seen == expected
    assert all(len(b.sessions) <= CONFIG.page_limit(limit) for b in pages)
    assert [b.has_more for b in pages] == [True] * (len(pages) - 1) + [False]
    zones = [2 if s.archived else int(s.pin_rank is None) for b in pages for s in b.sessions]
    assert zones == sorted(zones)  # pinned, then normal, then the archived partition


@settings(max_examples=100, deadline=None)
@given(rows=rows_strategy, bumps=st.lists(st.integers(0, 119), max_size=10))
def test_in_place_moves_never_duplicate_AT_39(
    rows: list[tuple[str, int, int | None, bool]], bumps: list[int]
) -> None:
    """New activity merged in place (no revision change) moves a row up: later pages never
    repeat it, and every row that did not move is still visited (the moved ones come by
    SESSION_DELTA, 12.8.3)."""
    p = projection(rows)
    snap = load_snapshot(p, 1, CONFIG)
    batch = serve(snap, pull(1, limit=10))
    seen = [s.conversation_id for s in batch.sessions]
    moved: set[str] = set()
    top = 100
    for bump in bumps:
        if not rows or not batch.has_more:
            break
        conv = rows[bump % len(rows)][0]
        top += 1
        row = p.rows[conv]
        p.rows[conv] = SessionRow(
            conversation_id=conv, latest_conversation_seq=2, last_activity_id=top
        )
        assert row.last_activity_id < top
        moved.add(conv)
        snap = merge_in_place(snap, p, [conv])  # same revision (12.8.2)
        assert snap == load_snapshot(p, 1, CONFIG)
        batch = serve(snap, pull(1, batch.next_page_cursor, 10))
        seen += [s.conversation_id for s in batch.sessions]
    while batch.has_more:
        batch = serve(snap, pull(1, batch.next_page_cursor, 10))
        seen += [s.conversation_id for s in batch.sessions]
    assert len(seen) == len(set(seen))
    assert {c for c, *_ in rows} - moved <= set(seen)


def test_limits_and_tampered_cursors_AT_36() -> None:
    p = projection([(f"c{i:04d}", i, None, False) for i in range(600)])
    snap = load_snapshot(p, 1, CONFIG)
    assert len(serve(snap, pull(1, limit=500)).sessions) == 200
    first = serve(snap, pull(1))
    assert len(first.sessions) == 50 and first.has_more
    cursor = first.next_page_cursor
    for bad in (cursor[:-1] + bytes([cursor[-1] ^ 1]), cursor[:5], b"x" * 80):
        error = page(snap, pull(1, bad), CONFIG, key=KEY, tenant_id="t", user_id="u")
        assert isinstance(error, Error) and error.code == ErrorCode.CURSOR_INVALID
    other = page(snap, pull(1, cursor), CONFIG, key=KEY, tenant_id="t", user_id="v")
    assert isinstance(other, Error)  # bound to (tenant, user)
    foreign_key = page(snap, pull(1, cursor), CONFIG, key=b"z" * 32, tenant_id="t", user_id="u")
    assert isinstance(foreign_key, Error)


def test_5000_conversations_in_100_pages_and_repulls_are_identical_26_4_6() -> None:
    p = projection([(f"c{i:05d}", i % 977, None, False) for i in range(5000)])
    snap = load_snapshot(p, 3, CONFIG)
    pages = list(page_all(snap, CONFIG, key=KEY, tenant_id="t", user_id="u", limit=50))
    assert len(pages) == 100
    ids = {s.conversation_id for b in pages for s in b.sessions}
    assert len(ids) == 5000
    again = serve(snap, pull(3, pages[40].next_page_cursor, 50))
    assert encode_body(again) == encode_body(pages[41])


def test_stale_revision_restarts_at_page_one_AT_38() -> None:
    p = projection([(f"c{i:03d}", i, None, False) for i in range(120)])
    snap = load_snapshot(p, 1, CONFIG)
    second = serve(snap, pull(1, serve(snap, pull(1)).next_page_cursor))
    p.states["c000"] = UserConversationState(conversation_id="c000", pin_rank=0)
    slot, reload = refresh_slot(
        SnapshotSlot(1, 0), 10, CONFIG.snapshot_ttl_ms, structural_change=True
    )
    assert reload and slot.revision == 2
    snap2 = load_snapshot(p, slot.revision, CONFIG)
    restarted = serve(snap2, pull(1, second.next_page_cursor))
    assert restarted.snapshot_revision == 2 and restarted.has_more
    assert restarted.sessions[0].conversation_id == "c000"  # the pinned one, exactly once
    rest = list(page_all(snap2, CONFIG, key=KEY, tenant_id="t", user_id="u"))
    all_ids = [s.conversation_id for b in rest for s in b.sessions]
    assert len(all_ids) == len(set(all_ids)) == 120


def test_snapshot_revision_lifecycle_AT_40() -> None:
    slot, reload = refresh_slot(None, 0, 300_000)
    assert (slot.revision, reload) == (1, True)
    slot, reload = refresh_slot(slot, 299_999, 300_000)
    assert (slot.revision, reload) == (1, False)  # deltas merge in place
    slot, reload = refresh_slot(slot, 299_999 + 300_000, 300_000)
    assert (slot.revision, reload) == (2, True)  # idle past snapshot_ttl: reload


def test_pinned_zone_orders_by_rank_then_activity() -> None:
    p = projection(
        [("a", 5, None, False), ("b", 9, 1, False), ("c", 1, 0, False), ("d", 7, 1, False),
         ("e", 99, None, True)]
    )  # fmt: skip
    snap = load_snapshot(p, 1, CONFIG)
    assert [s.conversation_id for s in snap.sessions] == ["c", "b", "d", "a", "e"]
    assert u128_from_bytes(snap.sessions[1].last_activity_id) == 9
