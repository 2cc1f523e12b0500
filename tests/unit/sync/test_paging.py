"""PULL_MAILBOX paging: the three covered_through_seq rules of spec 9.3.3, the spec's examples."""

from __future__ import annotations

import pytest

from qim.core.sync import (
    Group,
    PullLimits,
    PullWindow,
    SyncInvariantError,
    cut_batch,
    pull_mailbox,
    resolve_pull,
)
from qim.params import Settings
from qim.schemas.frames import Error, ErrorCode, MailboxBatch, PullMailbox, encode_body

from .support import Mailbox, entry, group


def batch_of(result: MailboxBatch | Error) -> MailboxBatch:
    assert isinstance(result, MailboxBatch), result
    return result


def error_of(result: MailboxBatch | Error) -> ErrorCode:
    assert isinstance(result, Error), result
    return ErrorCode(result.code)


def user_a() -> Mailbox:
    box = Mailbox(lane_watermark=10_500, trim_watermark=9_000)
    for seq in (10_008, 10_217, 10_491):
        box.add(seq)
    return box


def test_26_1_1_precise_queue_returns_only_the_users_three_entries() -> None:
    box = user_a()
    batch = batch_of(box.pull(PullMailbox(after_seq=10_001, up_to_seq=10_500)))
    assert [e.mailbox_seq for e in batch.entries] == [10_008, 10_217, 10_491]
    assert (batch.covered_through_seq, batch.has_more, batch.lane_watermark) == (
        10_500,
        False,
        10_500,
    )
    assert box.reads == [(10_001, 10_500)]


def test_26_1_2_user_without_entries_advances_to_the_watermark() -> None:
    box = Mailbox(lane_watermark=10_500, trim_watermark=9_000)
    batch = batch_of(box.pull(PullMailbox(after_seq=10_001, up_to_seq=10_500)))
    assert (batch.entries, batch.covered_through_seq, batch.has_more) == ((), 10_500, False)


def test_26_1_2_negative_hole_below_trim_is_cursor_expired_never_has_more_false() -> None:
    box = Mailbox(lane_watermark=10_500, trim_watermark=10_100)
    result = box.pull(PullMailbox(after_seq=10_001, up_to_seq=10_500))
    assert error_of(result) is ErrorCode.CURSOR_EXPIRED
    assert isinstance(result, Error)
    assert (result.trim_watermark, result.rebuild_required) == (10_100, True)
    assert box.reads == []  # refused before any storage read


def test_26_1_3_reads_stop_at_the_lane_watermark() -> None:
    box = Mailbox(lane_watermark=10_299, trim_watermark=9_000)
    for seq in (10_100, 10_300, 10_400):  # 10_300+ stored but not yet visible
        box.add(seq)
    batch = batch_of(box.pull(PullMailbox(after_seq=10_001, up_to_seq=0)))
    assert [e.mailbox_seq for e in batch.entries] == [10_100]
    assert (batch.covered_through_seq, batch.lane_watermark) == (10_299, 10_299)
    assert error_of(box.pull(PullMailbox(after_seq=10_001, up_to_seq=10_500))) is (
        ErrorCode.CURSOR_INVALID
    )


def test_26_1_4_up_to_zero_fills_in_the_current_lane_watermark() -> None:
    box = Mailbox(lane_watermark=20_000, trim_watermark=9_000)
    for seq in range(10_600, 20_000, 500):
        box.add(seq)
    request = PullMailbox(after_seq=10_500, up_to_seq=0, max_items=5)
    seen: list[int] = []
    while True:
        batch = batch_of(box.pull(request))
        assert batch.lane_watermark == 20_000
        seen += [e.mailbox_seq for e in batch.entries]
        if not batch.has_more:
            break
        request = PullMailbox(after_seq=batch.covered_through_seq, up_to_seq=batch.lane_watermark)
    assert batch.covered_through_seq == 20_000
    assert seen == sorted(box.groups)


@pytest.mark.parametrize("max_items", [1, 3])
def test_m4_26_2_2_t25_four_entry_group_comes_whole(max_items: int) -> None:
    s = 10_217
    box = Mailbox(lane_watermark=s + 100, trim_watermark=0)
    box.add(s, 4)
    box.add(s + 40, 2)
    batch = batch_of(box.pull(PullMailbox(after_seq=s - 1, up_to_seq=s + 100, max_items=max_items)))
    assert [(e.mailbox_seq, e.event_ordinal) for e in batch.entries] == [(s, i) for i in range(4)]
    assert (batch.covered_through_seq, batch.has_more) == (s, True)
    rest = batch_of(box.pull(PullMailbox(after_seq=s, up_to_seq=s + 100, max_items=max_items)))
    assert [e.mailbox_seq for e in rest.entries] == [s + 40, s + 40]
    assert (rest.covered_through_seq, rest.has_more) == (s + 100, False)
    unlimited = batch_of(box.pull(PullMailbox(after_seq=s - 1, up_to_seq=s + 100)))
    assert batch.entries + rest.entries == unlimited.entries


def test_m4_last_group_whole_reaches_up_to_seq() -> None:
    box = Mailbox(lane_watermark=500, trim_watermark=0)
    box.add(300, 4)
    batch = batch_of(box.pull(PullMailbox(after_seq=0, up_to_seq=500, max_items=1)))
    assert (len(batch.entries), batch.covered_through_seq, batch.has_more) == (4, 500, False)


def test_t26_empty_scan_that_reached_up_to_covers_it() -> None:
    box = Mailbox(lane_watermark=800, trim_watermark=100)
    box.add(900)  # above the requested range
    batch = batch_of(box.pull(PullMailbox(after_seq=200, up_to_seq=700)))
    assert (batch.entries, batch.covered_through_seq, batch.has_more) == ((), 700, False)


def test_9_3_3_rule_1_bounds_are_open_below_and_closed_above() -> None:
    box = Mailbox(lane_watermark=1_000, trim_watermark=0)
    for seq in (100, 200, 300):
        box.add(seq)
    batch = batch_of(box.pull(PullMailbox(after_seq=100, up_to_seq=300)))
    assert [e.mailbox_seq for e in batch.entries] == [200, 300]


def test_9_3_3_after_equal_up_to_is_a_final_empty_batch_without_a_read() -> None:
    box = user_a()
    batch = batch_of(box.pull(PullMailbox(after_seq=10_500, up_to_seq=0)))
    assert (batch.entries, batch.covered_through_seq, batch.has_more) == ((), 10_500, False)
    assert box.reads == []


@pytest.mark.parametrize(
    "request_",
    [
        PullMailbox(after_seq=10_501, up_to_seq=0),  # after_seq > W
        PullMailbox(after_seq=10_400, up_to_seq=10_300),  # after_seq > up_to_seq
        PullMailbox(after_seq=10_001, up_to_seq=10_501),  # up_to_seq > W
        PullMailbox(after_seq=10_001, up_to_seq=0, acked_seq=10_501),  # T29
    ],
    ids=["after>W", "after>up_to", "up_to>W", "acked>W"],
)
def test_9_3_2_t29_out_of_range_seqs_are_cursor_invalid(request_: PullMailbox) -> None:
    assert error_of(user_a().pull(request_)) is ErrorCode.CURSOR_INVALID


def test_t29_acked_seq_never_changes_what_is_returned() -> None:
    plain = user_a().pull(PullMailbox(after_seq=10_001, up_to_seq=0))
    acked = user_a().pull(PullMailbox(after_seq=10_001, up_to_seq=0, acked_seq=10_500))
    assert plain == acked


def test_9_6_1_zero_after_seq_is_exempt_from_the_trim_check() -> None:
    box = user_a()
    batch = batch_of(box.pull(PullMailbox(after_seq=0, up_to_seq=0)))
    assert len(batch.entries) == 3 and not batch.has_more


def test_9_3_3_max_bytes_is_soft_for_the_first_group() -> None:
    box = Mailbox(lane_watermark=100, trim_watermark=0)
    box.add(10, 2, body=600)
    box.add(20, 1, body=600)
    batch = batch_of(box.pull(PullMailbox(after_seq=0, up_to_seq=100, max_bytes=100)))
    assert [e.mailbox_seq for e in batch.entries] == [10, 10]
    assert (batch.covered_through_seq, batch.has_more) == (10, True)


def test_9_3_3_max_frame_bytes_is_hard_and_a_lone_oversize_group_loses_its_bodies() -> None:
    limits = PullLimits(max_frame_bytes=2_000)
    box = Mailbox(lane_watermark=100, trim_watermark=0)
    box.add(10, 1, body=300)
    box.add(20, 3, body=900)  # 2.7 KB of bodies: cannot share a frame, cannot fit alone
    first = batch_of(box.pull(PullMailbox(after_seq=0, up_to_seq=100), limits))
    assert ([e.mailbox_seq for e in first.entries], first.covered_through_seq) == ([10], 10)
    second = batch_of(box.pull(PullMailbox(after_seq=10, up_to_seq=100), limits))
    assert [e.mailbox_seq for e in second.entries] == [20, 20, 20]
    assert all(not e.body_included and e.payload_or_ciphertext is None for e in second.entries)
    assert (second.covered_through_seq, second.has_more) == (100, False)  # T32: still advances
    assert len(encode_body(second)) <= limits.max_frame_bytes


def test_b3_limits_default_and_cap() -> None:
    limits = PullLimits(max_items=10, max_bytes=1_000)
    window = resolve_pull(
        PullMailbox(max_items=0, max_bytes=5_000), lane_watermark=5, trim_watermark=0, limits=limits
    )
    assert isinstance(window, PullWindow) and (window.max_items, window.max_bytes) == (10, 1_000)
    settings = Settings.load()
    assert PullLimits.from_settings(settings) == PullLimits()


def test_i22_a_reader_breaking_the_range_is_our_bug() -> None:
    window = PullWindow(after_seq=10, up_to_seq=20, lane_watermark=20, max_items=5, max_bytes=999)
    cases: list[list[Group]] = [[(25, group(25))], [(15, group(15)), (12, group(12))], [(15, [])]]
    for groups in cases:
        with pytest.raises(SyncInvariantError):
            cut_batch(groups, window, max_frame_bytes=10_000)
    with pytest.raises(SyncInvariantError):
        cut_batch([(15, [entry(16)])], window, max_frame_bytes=10_000)


def test_seed003_trim_passing_after_seq_during_the_scan_is_expired() -> None:
    box = user_a()
    result = pull_mailbox(
        box.read,
        PullMailbox(after_seq=10_001, up_to_seq=0),
        lane_watermark=box.lane_watermark,
        trim_watermark=box.trim_watermark,
        trim_after_scan=lambda: 10_200,
    )
    assert error_of(result) is ErrorCode.CURSOR_EXPIRED
