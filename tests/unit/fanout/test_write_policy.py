"""The mention_only tier's admission, exit and hold rules (spec 10.2.3, I-34, 26.3.11)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from qim.core.fanout.write_policy import (
    ALWAYS,
    MENTION_ONLY,
    TierRule,
    TierState,
    admits,
    decide,
    equivalent_threshold,
    exits,
)
from qim.params import Settings

HOUR = 3_600_000
RULE = TierRule(
    enabled=True,
    read_diffusion_min_saving=1000,
    read_diffusion_max_active_ratio=0.5,
    policy_switch_exit_ratio=0.8,
    policy_switch_min_interval_ms=24 * HOUR,
)


def reference(
    rule: TierRule, policy: str, last_switch: int | None, n: int, active: int, now: int
) -> tuple[str, int | None]:
    """The 10.2.3 text, transcribed literally with exact fractions."""
    from fractions import Fraction

    alpha = Fraction(min(active, n), n) if n > 0 else Fraction(1)
    saving, ratio = rule.read_diffusion_min_saving, rule.read_diffusion_max_active_ratio
    measured = saving is not None and ratio is not None
    holding = last_switch is not None and now - last_switch < rule.policy_switch_min_interval_ms
    if policy == ALWAYS:
        enter = (
            rule.enabled
            and measured
            and n > 0
            and n * (1 - alpha) > saving  # type: ignore[operator]
            and alpha < Fraction(ratio)  # type: ignore[arg-type]
        )
        if enter and not holding:
            return MENTION_ONLY, now
        return policy, last_switch
    if not rule.enabled:
        return ALWAYS, now
    if saving is None or alpha == 1:
        leave = True
    else:
        threshold = Fraction(saving) / (1 - alpha)
        leave = n < threshold * Fraction(rule.policy_switch_exit_ratio)
    if leave and not holding:
        return ALWAYS, now
    return policy, last_switch


def test_defaults_keep_every_group_on_always() -> None:
    rule = TierRule.from_settings(Settings.load())
    assert not rule.enabled and rule.read_diffusion_min_saving is None
    assert decide(rule, TierState(), 100_000, 0, 10 * HOUR) == TierState()
    on = TierRule(enabled=True)  # switched on but unmeasured: still nothing is admitted
    assert not admits(on, 100_000, 0)
    assert decide(on, TierState(), 100_000, 0, 10 * HOUR).policy == ALWAYS


def test_the_tenant_switch_comes_from_the_tenant_view() -> None:
    cluster = Settings.load(overrides={"read_diffusion_min_saving": 10})
    tenant = cluster.for_tenant("t1", {"mailbox_write_policy": "mention_only"})
    assert not TierRule.from_settings(cluster).enabled
    assert TierRule.from_settings(tenant).enabled
    assert TierRule.from_settings(tenant).read_diffusion_min_saving == 10


def test_admission_is_the_alpha_test_not_a_head_count() -> None:
    # 10.2.3's examples: a 5000-person group at a = 0.15 saves 4250 entries, a 2000-person work
    # group at a = 0.7 is excluded by the ratio although its head count is larger than needed
    assert admits(RULE, 5000, 750)
    assert not admits(RULE, 5000, 3500)
    assert not admits(RULE, 1100, 110)  # saves 990 <= 1000
    assert admits(RULE, 1200, 120)  # saves 1080
    assert equivalent_threshold(RULE, 5000, 0) == 1000
    assert exits(RULE, 799, 0) and not exits(RULE, 800, 0)


def test_a_switch_is_recorded_and_held() -> None:
    entered = decide(RULE, TierState(), 5000, 0, 5 * HOUR)
    assert entered == TierState(MENTION_ONLY, 5 * HOUR)
    # the group shrinks far below the exit line at once: held for the minimum interval
    assert decide(RULE, entered, 10, 0, 6 * HOUR) == entered
    left = decide(RULE, entered, 10, 0, 29 * HOUR)
    assert left == TierState(ALWAYS, 29 * HOUR)
    # and it cannot re-enter within the hold either
    assert decide(RULE, left, 5000, 0, 30 * HOUR) == left


def test_switching_the_tenant_off_returns_at_once() -> None:
    entered = decide(RULE, TierState(), 5000, 0, 5 * HOUR)
    off = TierRule(
        enabled=False, read_diffusion_min_saving=1000, read_diffusion_max_active_ratio=0.5
    )
    assert decide(off, entered, 5000, 0, 5 * HOUR + 1) == TierState(ALWAYS, 5 * HOUR + 1)


def test_26_3_11_no_flapping_near_the_threshold() -> None:
    """N oscillates T-1 / T+1 once an hour for 48 h: at most one entry and one exit, at least
    policy_switch_min_interval apart."""
    t = 1001  # the first N the saving test admits at a = 0
    state, switches = TierState(), []
    for hour in range(48):
        n = t + 1 if hour % 2 else t - 1
        new = decide(RULE, state, n, 0, (hour + 1) * HOUR)
        if new.policy != state.policy:
            switches.append(new.switched_at_ms)
        state = new
    assert 1 <= len(switches) <= 2
    assert all(b - a >= RULE.policy_switch_min_interval_ms for a, b in itertools.pairwise(switches))
    assert state.policy == MENTION_ONLY  # T-1 is far above the exit line T x 0.8


rules = st.builds(
    TierRule,
    enabled=st.booleans(),
    read_diffusion_min_saving=st.none() | st.integers(0, 5000),
    read_diffusion_max_active_ratio=st.none() | st.sampled_from([0.1, 0.25, 0.5, 0.9, 1.0]),
    policy_switch_exit_ratio=st.sampled_from([0.5, 0.8, 1.0]),
    policy_switch_min_interval_ms=st.integers(0, 48).map(lambda h: h * HOUR),
)
steps = st.lists(
    st.tuples(st.integers(0, 10_000), st.integers(0, 10_000), st.integers(0, 12 * HOUR)),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(rules, steps)
def test_decide_matches_the_reference_model(
    rule: TierRule, trace: list[tuple[int, int, int]]
) -> None:
    state, policy, last = TierState(), ALWAYS, None
    now = 1
    for n, active, gap in trace:
        now += gap
        state = decide(rule, state, n, active, now)
        policy, last = reference(rule, policy, last, n, active, now)
        assert state.policy == policy
        assert state.switched_at_ms == (last or 0)
