"""Acceptance cases of 26.4 and AT-xx (digest ch. 12-16 part 3) expressible on the pure core."""

from __future__ import annotations

import msgspec

from qim.core.session_list import (
    ClearHistory,
    DeleteLocal,
    EntryIn,
    FoldResult,
    MarkRead,
    MarkUnread,
    SessionListConfig,
    SetArchived,
    SetMuted,
    UserProjection,
    badge_of,
    deltas_of,
    display_unread,
    encode_projection,
    fold,
    listed,
)
from qim.schemas.frames.base import MentionType
from tests.unit.session_list.support import U, World

CONFIG = SessionListConfig()


def run(w: World, config: SessionListConfig = CONFIG) -> UserProjection:
    return fold(UserProjection(user_id=U), w.log, w.store, config).projection


def step(w: World, p: UserProjection, start: int, config: SessionListConfig = CONFIG) -> FoldResult:
    """Fold the log from ``start`` onto ``p`` (one compactor window)."""
    return fold(p, w.log[start:], w.store, config)


def test_late_old_message_counts_but_never_reorders_26_4_2() -> None:
    w = World()
    w.send("c1", "a", late=True)  # M0: seq 1, delivered late
    w.send("c1", "a")  # M1: seq 2, first to arrive
    p = run(w)
    before = p.rows["c1"]
    mark = len(w.log)
    w.flush_held()
    after = step(w, p, mark).projection.rows["c1"]
    assert (after.latest_conversation_seq, after.last_activity_id, after.last_message_id) == (
        before.latest_conversation_seq,
        before.last_activity_id,
        before.last_message_id,
    )
    assert after.unread_count == before.unread_count + 1  # content gate apart from order gate


def test_recall_of_the_previewed_message_re_emits_without_moving_AT_12_13_14() -> None:
    w = World()
    for _ in range(3):
        w.send("c1", "a")
    p = run(w)
    row = p.rows["c1"]
    mark = len(w.log)
    w.recall("c1", 3)  # the preview (latest == 3); the CONTROL takes seq 4
    result = step(w, p, mark)
    new = result.projection.rows["c1"]
    assert "c1" in result.touched  # SESSION_DELTA re-emitted for the preview repair
    assert new.latest_conversation_seq == 3 and new.last_activity_id == row.last_activity_id
    assert new.unread_count == 2
    mark = len(w.log)
    w.change("c1", MarkRead(1))
    w.recall("c1", 1)  # below the base: not counted, so no decrement (AT-13)
    again = step(w, result.projection, mark).projection.rows["c1"]
    assert again.unread_count == 1 and again.latest_conversation_seq == 3


def test_own_messages_never_count_AT_15_INV_11() -> None:
    w = World()
    for _ in range(20):
        w.send("c1", U)
    for _ in range(5):
        w.send("c1", "a")
    p = run(w)
    assert p.rows["c1"].unread_count == 5
    # even an own entry that wrongly carries counts_unread is not counted (sender term)
    entry = w.log[0]
    assert isinstance(entry, EntryIn)
    bad = EntryIn(msgspec.structs.replace(entry.entry, flags=0x07))
    q = fold(UserProjection(user_id=U), [bad], w.store, CONFIG).projection
    assert q.rows["c1"].unread_count == 0


def test_manual_unread_shows_survives_refold_and_clears_26_4_7() -> None:
    w = World()
    w.send("c1", "a")
    w.change("c1", MarkRead(1))
    p = run(w)
    assert p.badge.total_unread == 0
    mark = len(w.log)
    w.change("c1", MarkUnread(w.heads["c1"]))
    marked = step(w, p, mark).projection
    assert display_unread(marked.rows["c1"].counts, marked.state("c1")) == (1, False)
    assert marked.badge.total_unread == 1  # badge increment == list increment
    assert encode_projection(run(w)) == encode_projection(marked)  # dropped and refolded
    mark = len(w.log)
    w.change("c1", MarkRead(w.heads["c1"]))
    cleared = step(w, marked, mark).projection
    assert display_unread(cleared.rows["c1"].counts, cleared.state("c1")) == (0, True)
    assert cleared.badge.total_unread == 0


def test_precise_limit_truncates_and_recovers_AT_18_19() -> None:
    w = World()
    for _ in range(150):
        w.send("c1", "a")
    p = run(w)
    assert (p.rows["c1"].unread_count, p.rows["c1"].unread_exact) == (150, True)
    for _ in range(150):
        w.send("c1", "a")
    p = run(w)
    assert (p.rows["c1"].unread_count, p.rows["c1"].unread_exact) == (200, False)
    mark = len(w.log)
    w.change("c1", MarkRead(50))  # latest - base = 250 > 200: still truncated, no big read
    p = step(w, p, mark).projection
    assert (p.rows["c1"].unread_count, p.rows["c1"].unread_exact) == (200, False)
    mark = len(w.log)
    w.change("c1", MarkRead(120))
    p = step(w, p, mark).projection
    assert (p.rows["c1"].unread_count, p.rows["c1"].unread_exact) == (180, True)
    assert max(w.store.reads) <= 200


def test_cross_device_read_below_latest_recounts_never_zeroes_AT_20() -> None:
    w = World()
    for i in range(120):
        w.send("c1", "a" if i >= 110 else U)
    p = run(w)
    mark = len(w.log)
    w.change("c1", MarkRead(100))
    result = step(w, p, mark)
    assert result.projection.rows["c1"].unread_count == 10
    assert result.projection.rows["c1"].unread_base_seq == 100  # INV-14


def test_tri_state_no_op_and_clear_AT_23_24() -> None:
    w = World()
    for _ in range(5):
        w.send("c1", "a")
    w.change("c1", MarkRead(2))
    p = run(w)
    mark = len(w.log)
    w.change("c1", MarkRead(2))  # not an advance: no state write at all
    w.change("c1", SetMuted(False))  # a state record that leaves the base alone
    result = step(w, p, mark)
    assert result.touched == {}  # AT-23: no write
    mark = len(w.log)
    w.change("c1", MarkRead(9))
    row = step(w, result.projection, mark).projection.rows["c1"]
    assert (row.unread_count, row.mention_count, row.unread_exact) == (0, 0, True)
    assert row.unread_base_seq == 9  # AT-24: base = new_base, even past latest
    assert row.unread_base_seq == w.states["c1"].unread_base


def test_recall_rules_use_target_fields_AT_25_27() -> None:
    w = World()
    own = w.send("c1", U)
    silent = w.send("c1", "a", counts_unread=False)
    w.send("c1", "a")
    w.recall("c1", own)
    w.recall("c1", silent)
    assert run(w).rows["c1"].unread_count == 1
    tiny = SessionListConfig(unread_precise_limit=3)
    t = World()
    sent = [t.send("c1", "a") for _ in range(6)]
    assert (run(t, tiny).rows["c1"].unread_count, run(t, tiny).rows["c1"].unread_exact) == (
        3,
        False,
    )
    for seq in sent:
        t.recall("c1", seq)
    row = run(t, tiny).rows["c1"]
    assert row.unread_count == 0 and not row.unread_exact  # clamped (INV-10)


def test_replaying_a_range_with_a_recall_is_idempotent_AT_26() -> None:
    w = World()
    w.send("c1", "a", mention=MentionType.AT_ME)
    w.send("c1", "a", mention=MentionType.AT_ME)
    w.recall("c1", 1)
    once = fold(UserProjection(user_id=U), w.log, w.store, CONFIG).projection
    twice = fold(once, w.log, w.store, CONFIG)
    assert twice.projection == once and twice.touched == {}
    row = once.rows["c1"]
    assert (row.unread_count, row.mention_count, row.mention_first_conversation_seq) == (1, 1, 2)


def test_mute_and_archive_only_change_the_badge_AT_28_29() -> None:
    w = World()
    w.change("c1", SetMuted(True))
    for _ in range(4):
        w.send("c1", "a")
    w.send("c1", "a", mention=MentionType.AT_ME)
    w.send("c2", "b")
    w.change("c2", SetArchived(True))
    p = run(w)
    assert p.rows["c1"].unread_count == 5 and p.rows["c2"].unread_count == 1
    assert (p.badge.total_unread, p.badge.total_mention, p.badge.muted_unread) == (0, 1, 5)
    with_muted = SessionListConfig(include_muted_in_badge=True)
    assert badge_of(run(w, with_muted), with_muted) == (5, 1, 5)
    assert run(w, with_muted).badge.sums == (5, 1, 5)


def test_clear_keeps_the_row_delete_drops_it_new_message_resurrects_AT_42_46() -> None:
    w = World()
    w.send("c1", "a")
    w.send("c2", "a")
    w.change("c1", ClearHistory(w.heads["c1"]))
    w.change("c2", DeleteLocal(w.heads["c2"]))
    p = run(w)
    assert listed(p.rows["c1"], p.state("c1")) and p.rows["c1"].unread_count == 0
    assert "c2" not in p.rows  # INV-32: no row at or below deleted_before
    w.send("c2", "a")
    p = run(w)
    assert listed(p.rows["c2"], p.state("c2")) and p.rows["c2"].unread_count == 1


def test_no_resurrection_after_leave_and_rejoin_hides_the_gap_AT_47_48() -> None:
    w = World()
    w.send("c1", "a")
    w.leave("c1")  # left_at = 2
    p = run(w)
    mark = len(w.log)
    w.send("c1", "a", stray=True)  # seq 3 reaches the mailbox anyway (replay / late)
    result = step(w, p, mark)
    assert result.touched == {} and result.projection.rows == p.rows
    w.join("c1")  # seq 4, joined_at = 3
    w.send("c1", "a")
    rejoined = run(w).rows["c1"]
    assert rejoined.unread_count == 1 and rejoined.latest_conversation_seq == 5


def test_session_delta_values_equal_the_written_row_INV_22() -> None:
    w = World()
    w.send("c1", "a", mention=MentionType.AT_ME)
    w.send("c2", "a")
    result = fold(UserProjection(user_id=U), w.log, w.store, CONFIG)
    deltas = deltas_of(result, {"c1": b"preview"})
    assert [d.conversation_id for d in deltas] == ["c1", "c2"]
    d = deltas[0]
    row = result.projection.rows["c1"]
    assert (d.unread_count, d.mention_count, d.projection_mailbox_seq) == (
        row.unread_count,
        row.mention_count,
        row.projection_mailbox_seq,
    )
    assert d.preview_or_placeholder == b"preview" and d.driving_mailbox_seq == 1


def test_refold_after_dropping_the_projection_lists_the_right_set_AT_01() -> None:
    w = World(conversations=tuple(f"c{i:02d}" for i in range(30)))
    for c in w.conversations:
        w.send(c, "a")
    w.change("c00", ClearHistory(w.heads["c00"]))
    w.change("c01", DeleteLocal(w.heads["c01"]))
    p = run(w)
    shown = [c for c, row in p.rows.items() if listed(row, p.state(c))]
    assert len(shown) == 29 and "c01" not in shown and p.rows["c00"].unread_count == 0


def test_one_write_per_conversation_per_window_AT_03() -> None:
    w = World()
    for _ in range(1000):
        w.send("c1", "a")
    result = fold(UserProjection(user_id=U), w.log, w.store, CONFIG)
    assert list(result.touched) == ["c1"]  # one row write and one SESSION_DELTA
    assert len(deltas_of(result, {})) == 1 and result.badge_changed
    assert result.projection.projection_mailbox_seq == w.log[-1].key[0]


def test_consumption_stops_at_the_lane_watermark_AT_04() -> None:
    w = World()
    for _ in range(6):
        w.send("c1", "a")
    partial = fold(UserProjection(user_id=U), w.log, w.store, CONFIG, watermark=3)
    assert partial.projection.projection_mailbox_seq == 3
    assert partial.projection.rows["c1"].unread_count == 3
    rest = fold(partial.projection, w.log, w.store, CONFIG)
    assert encode_projection(rest.projection) == encode_projection(run(w))
