"""The always-zero counters of spec 24.1.5 per process, and how to read them off a /metrics
page. The audit test and ``qim chaos`` share this list, so a counter added to one check is in
both. A name the page does not declare is an error, never 0: a counter that no process exports
proves nothing (``qim/observability/names.py`` says which halves cannot move yet)."""

from __future__ import annotations

__all__ = ["ALWAYS_ZERO", "NotExported", "always_zero_samples", "nonzero"]

ALWAYS_ZERO: dict[str, tuple[str, ...]] = {
    # per process kind, every always-zero counter it exports: 24.1.5 and our own invariants of
    # the fold and the fanout. A labelled counter never incremented has its declaration and no
    # sample: 0. silent_gap_detected_total and event_id_nondeterminism_total are exported by no
    # process yet (names.py says why). Each listed one moves on an injected violation:
    # tests/unit/observability/test_always_zero.py.
    "mailbox": (
        "mailbox_seq_regression_count",
        "mailbox_cursor_rebase_count_total",  # the spec name, as prometheus_client exports it
        "lane_watermark_regression_total",
        "dispatch_misrouted_total",
        "member_slice_invalid_total",
        "stale_epoch_dispatch_dropped_total",
    ),
    "conversation": ("qim_fanout_stalled_total",),
    "gateway": ("cursor_advanced_by_push_total",),
}


class NotExported(ValueError):
    """A page lacks the declaration of counters it must export."""


def always_zero_samples(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Every sample (``name{labels}`` -> value) of ``names`` on a /metrics page; raises
    :class:`NotExported` naming each one the page does not declare."""
    declared = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    missing = [n for n in names if n not in declared and n.removesuffix("_total") not in declared]
    if missing:
        raise NotExported(f"not exported: {missing}")
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name_labels, _, value = line.rpartition(" ")
        if name_labels.split("{", 1)[0] in names:
            out[name_labels] = float(value)
    return out


def nonzero(pages: dict[str, tuple[str, str]]) -> dict[str, float]:
    """``process:sample -> value`` of every always-zero sample above 0 over ``pages``
    (process name -> (kind, page text)); an empty dict is the healthy answer."""
    out: dict[str, float] = {}
    for process, (kind, text) in sorted(pages.items()):
        for sample, value in always_zero_samples(text, ALWAYS_ZERO[kind]).items():
            if value:
                out[f"{process}:{sample}"] = value
    return out
