"""Property tests of PULL_MAILBOX paging over random sparse logs (spec 9.3.2-9.3.4, I-22)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from random import Random

from hypothesis import given, settings
from hypothesis import strategies as st

from qim.core.sync import PullLimits, SyncProgress
from qim.schemas.frames import MailboxBatch, OnlineReady, PullMailbox, SyncComplete, encode_body

from .support import Mailbox

Key = tuple[int, int, int]


@dataclass
class Scenario:
    box: Mailbox
    after: int
    up_to_zero: bool
    max_items: int
    max_bytes: int
    limits: PullLimits


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    w = draw(st.integers(0, 400))
    trim = draw(st.integers(0, w))
    box = Mailbox(lane_watermark=w, trim_watermark=trim)
    for seq in draw(st.sets(st.integers(trim + 1, 450), max_size=40)):  # some stored above W
        box.add(seq, draw(st.integers(1, 4)), body=draw(st.sampled_from([0, 0, 40, 500])))
    return Scenario(
        box=box,
        after=draw(st.one_of(st.just(0), st.integers(trim, w))),
        up_to_zero=draw(st.booleans()),
        max_items=draw(st.integers(0, 6)),
        max_bytes=draw(st.integers(0, 1_500)),
        limits=PullLimits(
            max_items=5, max_bytes=1_000, max_frame_bytes=draw(st.integers(900, 3_000))
        ),
    )


def key(e: object) -> Key:
    return (e.mailbox_seq, e.event_ordinal, e.event_id)  # type: ignore[attr-defined]


def check_batch_rules(
    box: Mailbox, after: int, up_to: int, batch: MailboxBatch, frame: int
) -> None:
    """Rules 1 and 2 of 9.3.3 for one batch, and the A.4 has_more equation."""
    seqs = [e.mailbox_seq for e in batch.entries]
    assert all(after < s <= batch.covered_through_seq for s in seqs)  # rule 1
    assert after <= batch.covered_through_seq <= up_to
    assert batch.has_more == (batch.covered_through_seq != up_to)
    assert batch.entries or not batch.has_more  # never an empty non-final batch
    for s in set(seqs):  # event groups whole
        assert [key(e) for e in batch.entries if e.mailbox_seq == s] == [
            key(e) for e in box.groups[s]
        ]
    if batch.has_more:  # cut exactly after a returned group, nothing of the range skipped
        assert seqs and seqs[-1] == batch.covered_through_seq
    assert len(encode_body(batch)) <= frame
    assert batch.lane_watermark == box.lane_watermark


def pull_range(
    s: Scenario, after: int, up_to: int, progress: SyncProgress | None = None
) -> list[Key]:
    got: list[Key] = []
    request = PullMailbox(
        after_seq=after, up_to_seq=up_to, max_items=s.max_items, max_bytes=s.max_bytes
    )
    for _ in range(len(s.box.groups) + 2):
        batch = s.box.pull(request, s.limits)
        assert isinstance(batch, MailboxBatch)
        bound = up_to or s.box.lane_watermark
        check_batch_rules(s.box, request.after_seq, bound, batch, s.limits.max_frame_bytes)
        if progress is not None:
            progress.record(request.after_seq, batch.covered_through_seq)
        got += [key(e) for e in batch.entries]
        if not batch.has_more:
            return got
        assert batch.covered_through_seq > request.after_seq  # strict progress
        request = PullMailbox(
            after_seq=batch.covered_through_seq,
            up_to_seq=bound,
            max_items=s.max_items,
            max_bytes=s.max_bytes,
        )
    raise AssertionError("paging did not terminate")


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_i22_pulling_until_done_returns_exactly_the_users_entries(s: Scenario) -> None:
    w = s.box.lane_watermark
    got = pull_range(s, s.after, 0 if s.up_to_zero else w)
    expected = [key(e) for e in s.box.entries_in(s.after, w)]
    assert got == expected  # no duplicates, no gaps, ascending


@settings(max_examples=200, deadline=None)
@given(scenarios(), st.integers(1, 4), st.randoms(use_true_random=False))
def test_t28_pipelined_subranges_cover_in_any_order(s: Scenario, parts: int, rnd: Random) -> None:
    w = s.box.lane_watermark
    low = max(s.after, s.box.trim_watermark)
    parts = max(1, min(parts, w - low))
    bounds = [low + (w - low) * i // parts for i in range(parts + 1)]
    bounds[0] = s.after
    ranges = list(pairwise(bounds))
    rnd.shuffle(ranges)
    progress = SyncProgress(low, w)
    got: list[Key] = []
    for index, (after, up_to) in enumerate(ranges):
        if index == len(ranges) - 1:  # the barrier holds until the last sub-range is in
            assert progress.is_covered() == (up_to <= low)
        got += pull_range(s, after, up_to, progress)
    assert sorted(got) == [key(e) for e in s.box.entries_in(s.after, w)]
    assert len(set(got)) == len(got)
    assert isinstance(progress.complete(SyncComplete(sync_to_seq=w)), OnlineReady)
