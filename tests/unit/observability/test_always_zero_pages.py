"""Reading the always-zero counters off a /metrics page: a missing declaration is an error,
never 0; a declared counter without samples is 0; any sample above 0 is named."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from qim.observability.always_zero import ALWAYS_ZERO, NotExported, always_zero_samples, nonzero


def page(values: dict[str, float], labelled: bool = False) -> str:
    registry = CollectorRegistry()
    for name, value in values.items():
        base = name.removesuffix("_total")
        if labelled:
            c = Counter(base, "x", ["tenant"], registry=registry)
            if value:
                c.labels("t1").inc(value)
        else:
            Counter(base, "x", registry=registry).inc(value)
    return generate_latest(registry).decode()


def test_a_page_missing_a_declaration_is_an_error_naming_it() -> None:
    text = page({"qim_fanout_stalled_total": 0})
    with pytest.raises(NotExported, match="cursor_advanced_by_push_total"):
        always_zero_samples(text, ALWAYS_ZERO["gateway"])


def test_declared_without_samples_is_healthy_and_a_moved_counter_is_named() -> None:
    quiet = page({"cursor_advanced_by_push_total": 0}, labelled=True)
    moved = page({"qim_fanout_stalled_total": 2})
    pages = {"gw-1": ("gateway", quiet), "conversation-1": ("conversation", moved)}
    assert nonzero(pages) == {"conversation-1:qim_fanout_stalled_total": 2.0}
    assert nonzero({"gw-1": ("gateway", quiet)}) == {}
