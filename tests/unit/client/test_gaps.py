"""The client's 10.2.3 gap rule: compare against the server's bound, never seq differences."""

from __future__ import annotations

from qim.client.gaps import HistoryCoverage
from qim.schemas.frames.history import HistoryBatch, HistoryMessage, SessionEntry

G = "g:big"


def _row(policy: str, latest: int, delivered: int | None = None) -> SessionEntry:
    return SessionEntry(
        conversation_id=G,
        latest_conversation_seq=latest,
        write_policy=policy,
        delivered_conversation_seq=delivered,
    )


def _batch(seqs: list[int], latest: int, more: bool) -> HistoryBatch:
    return HistoryBatch(
        messages=tuple(HistoryMessage(conversation_seq=s) for s in seqs),
        latest_conversation_seq=latest,
        has_more=more,
    )


def test_always_never_asks_and_mention_only_asks_for_everything_above_coverage() -> None:
    coverage = HistoryCoverage()
    assert coverage.gap(_row("always", 520)) is None  # control 1 of 26.3.10
    assert coverage.gap(None) is None
    coverage.through[G] = 100
    assert coverage.gap(_row("mention_only", 520, delivered=500)) == (100, 520)


def test_26_3_10_pages_fill_the_gap_and_a_sparse_page_is_not_a_hole() -> None:
    coverage = HistoryCoverage(through={G: 100})
    # seqs 101..300 with holes (targeted, deleted): sparse is legal, the page's end counts
    assert coverage.filled(G, 100, _batch([101, 150, 300], latest=520, more=True)) == 300
    assert coverage.gap(_row("mention_only", 520)) == (300, 520)
    assert coverage.filled(G, 300, _batch([301, 520], latest=520, more=False)) == 520
    assert coverage.gap(_row("mention_only", 520)) is None
    # a page pulled from above the coverage proves nothing about what lies below it
    assert coverage.filled(G, 900, _batch([901], latest=901, more=False)) == 520
