"""The ``mailbox_write_policy`` of a group: the reserved ``mention_only`` tier (spec 10.2.3).

Why a pure rule here and its state in the ConversationHead: the ConversationWriter is the
single writer of a conversation and of its membership, so it alone knows ``N =
GroupMembershipVersion.member_count`` at the seq it allocates; it decides the policy once per
message and stamps it on the outbox record (like the inline-body decision, ADR-0005), so no
MailboxNode decides it again and a replay of the outbox rebuilds the same state. The switch
instant (``switched_at_ms``, log time) is conversation metadata kept on the head.

Rules (10.2.3, I-34, Appendix B.5.1):

* **Admission** (entering ``mention_only``), both must hold: ``N x (1 - a) >
  read_diffusion_min_saving`` and ``a < read_diffusion_max_active_ratio``, ``a = |active| /
  N``. Either parameter unset (Appendix B: "to be measured") -> never admitted.
* **Exit** (back to ``always``): ``N`` below the equivalent threshold times
  ``policy_switch_exit_ratio``. The equivalent threshold is the ``N`` at which the saving test
  holds with equality at the current ratio, ``T(a) = read_diffusion_min_saving / (1 - a)``
  (``big_group_lazy_threshold`` is that number measured; it MUST NOT switch anything itself).
* **Hold**: no switch within ``policy_switch_min_interval`` of the previous one.
* **Tenant switch** (``mailbox_write_policy``, off = ``always``): nothing enters while it is
  off; turning it off returns a ``mention_only`` conversation to ``always`` at once, without
  the hold: falling back to full writes restores the 10.2.3 promise and cannot leave a gap.

Only groups take part: a direct conversation always writes every entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from qim.params import Settings

__all__ = [
    "ALWAYS",
    "MENTION_ONLY",
    "TierRule",
    "TierState",
    "WritePolicy",
    "admits",
    "decide",
    "equivalent_threshold",
    "exits",
]

WritePolicy: TypeAlias = Literal["always", "mention_only"]
ALWAYS: Final = "always"
MENTION_ONLY: Final = "mention_only"


@dataclass(frozen=True, slots=True)
class TierRule:
    """One tenant's view of the tier's Appendix B.5.1 values."""

    enabled: bool = False
    """The tenant switch: ``mailbox_write_policy = mention_only`` (off by default, I-32)."""
    read_diffusion_min_saving: int | None = None
    read_diffusion_max_active_ratio: float | None = None
    policy_switch_exit_ratio: float = 0.8
    policy_switch_min_interval_ms: int = 24 * 3_600_000

    def __post_init__(self) -> None:
        if not 0 < self.policy_switch_exit_ratio <= 1:
            raise ValueError("policy_switch_exit_ratio must be in (0, 1]")
        if self.policy_switch_min_interval_ms < 0:
            raise ValueError("policy_switch_min_interval must be >= 0")

    @classmethod
    def from_settings(cls, settings: Settings) -> TierRule:
        ratio = settings.read_diffusion_max_active_ratio
        return cls(
            enabled=str(settings.mailbox_write_policy) == MENTION_ONLY,
            read_diffusion_min_saving=settings.read_diffusion_min_saving,
            read_diffusion_max_active_ratio=None if ratio is None else float(ratio),
            policy_switch_exit_ratio=float(settings.policy_switch_exit_ratio),
            policy_switch_min_interval_ms=int(settings.policy_switch_min_interval),
        )


@dataclass(frozen=True, slots=True)
class TierState:
    """A conversation's policy and the log time of its last switch (0 = never switched)."""

    policy: WritePolicy = ALWAYS
    switched_at_ms: int = 0


def _ratio(member_count: int, active_count: int) -> float:
    if member_count <= 0:
        return 1.0
    return min(1.0, max(0, active_count) / member_count)


def admits(rule: TierRule, member_count: int, active_count: int) -> bool:
    """The 10.2.3 admission test (both criteria), False while a parameter is unmeasured."""
    saving, max_ratio = rule.read_diffusion_min_saving, rule.read_diffusion_max_active_ratio
    if saving is None or max_ratio is None or member_count <= 0:
        return False
    alpha = _ratio(member_count, active_count)
    return member_count * (1 - alpha) > saving and alpha < max_ratio


def equivalent_threshold(rule: TierRule, member_count: int, active_count: int) -> float:
    """``T(a) = read_diffusion_min_saving / (1 - a)``; +inf when unmeasured or ``a = 1``."""
    saving = rule.read_diffusion_min_saving
    alpha = _ratio(member_count, active_count)
    if saving is None or alpha >= 1:
        return float("inf")
    return saving / (1 - alpha)


def exits(rule: TierRule, member_count: int, active_count: int) -> bool:
    """The exit test: ``N < T(a) x policy_switch_exit_ratio``."""
    threshold = equivalent_threshold(rule, member_count, active_count)
    return member_count < threshold * rule.policy_switch_exit_ratio


def decide(
    rule: TierRule, state: TierState, member_count: int, active_count: int, now_ms: int
) -> TierState:
    """The policy for the next message at log time ``now_ms`` (module docstring)."""
    held = state.switched_at_ms > 0 and now_ms - state.switched_at_ms < (
        rule.policy_switch_min_interval_ms
    )
    if state.policy == ALWAYS:
        if rule.enabled and not held and admits(rule, member_count, active_count):
            return TierState(MENTION_ONLY, max(1, now_ms))
        return state
    if not rule.enabled:
        return TierState(ALWAYS, max(1, now_ms))
    if not held and exits(rule, member_count, active_count):
        return TierState(ALWAYS, max(1, now_ms))
    return state
