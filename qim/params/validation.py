"""Relations between parameters that the spec requires, checked at load time.

Each value can be fine on its own and still break the system in combination: a shard count that
is not a power of two mis-routes users; a failover wait shorter than the lease lets two writers
run. These rules are data, so the generated table lists exactly what is enforced.

The routing rules are also in ``qim.schemas.routing.validate_shard_config``; they are repeated
here on purpose so this module stays free of the schema package until the two are unified.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from qim.params.errors import ConstraintError
from qim.params.units import DAY, HOUR

__all__ = ["CONSTRAINTS", "Constraint", "check_constraints", "is_power_of_two"]

MAX_LANE_COUNT: Final = 256  # lane_id uses only blake3 digest byte 0 (§6.5.1)

Values = Mapping[str, Any]


def is_power_of_two(value: object) -> bool:
    """Counts are used as ``& (count - 1)`` masks, which is a modulus only for powers of two."""
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    return value > 0 and value & (value - 1) == 0


@dataclass(frozen=True, slots=True)
class Constraint:
    """One rule over named parameters; ``holds`` gets all values and says whether it holds."""

    names: tuple[str, ...]
    rule: str
    ref: str
    holds: Callable[[Values], bool]

    def message(self, values: Values) -> str:
        """What broke, with the values involved, for the error a boot fails with."""
        got = ", ".join(f"{name}={values[name]!r}" for name in self.names)
        return f"{self.rule} ({self.ref}); got {got}"


def _pow2(name: str) -> Constraint:
    rule = f"{name} must be a power of two"
    return Constraint((name,), rule, "§5.2, B.1", lambda v: is_power_of_two(v[name]))


CONSTRAINTS: Final[tuple[Constraint, ...]] = (
    _pow2("virtual_bucket_count"),
    _pow2("mailbox_shard_count"),
    _pow2("connection_shard_count"),
    _pow2("lane_count"),
    Constraint(
        ("lane_count",),
        f"lane_count must be <= {MAX_LANE_COUNT} (lane_id uses blake3 digest byte 0)",
        "§6.5.1, B.1",
        lambda v: v["lane_count"] <= MAX_LANE_COUNT,
    ),
    Constraint(
        ("mailbox_shard_count", "virtual_bucket_count"),
        "mailbox_shard_count must be <= virtual_bucket_count",
        "§5.2 hard constraint 1",
        lambda v: v["mailbox_shard_count"] <= v["virtual_bucket_count"],
    ),
    Constraint(
        ("connection_shard_count", "virtual_bucket_count"),
        "connection_shard_count must be <= virtual_bucket_count",
        "§5.2 corollary 1",
        lambda v: v["connection_shard_count"] <= v["virtual_bucket_count"],
    ),
    Constraint(
        ("connection_shard_count", "mailbox_shard_count"),
        "connection_shard_count must be an integer multiple of mailbox_shard_count",
        "§5.2 hard constraint 2, I-24",
        lambda v: v["connection_shard_count"] % v["mailbox_shard_count"] == 0,
    ),
    Constraint(
        ("log_retention_days", "checkpoint_interval", "shard_rto_target"),
        "log_retention_days must be >= (checkpoint_interval + T_recover) × 2, T_recover capped "
        "by shard_rto_target",
        "§19.3.3",
        lambda v: (
            v["log_retention_days"] * DAY >= 2 * (v["checkpoint_interval"] + v["shard_rto_target"])
        ),
    ),
    Constraint(
        ("dispatch_progress_retention", "log_retention_days"),
        "dispatch_progress_retention must be >= log_retention_days",
        "B.3, I-17",
        lambda v: v["dispatch_progress_retention"] >= v["log_retention_days"] * DAY,
    ),
    Constraint(
        ("membership_version_retention", "dispatch_progress_retention", "log_retention_days"),
        "membership_version_retention must exceed max(dispatch_progress_retention, "
        "log_retention_days) by a margin",
        "B.3, I-23",
        lambda v: (
            v["membership_version_retention"]
            > max(v["dispatch_progress_retention"], v["log_retention_days"] * DAY)
        ),
    ),
    Constraint(
        ("default_history_retention_days", "default_history_retention_days_max"),
        "default_history_retention_days must be <= default_history_retention_days_max",
        "B.3, ADR-0019",
        lambda v: v["default_history_retention_days"] <= v["default_history_retention_days_max"],
    ),
    Constraint(
        ("ping_interval_initial", "ping_interval_max_foreground", "ping_interval_max_background"),
        "ping_interval_initial <= ping_interval_max_foreground <= ping_interval_max_background",
        "B.4, §15.1",
        lambda v: (
            v["ping_interval_initial"]
            <= v["ping_interval_max_foreground"]
            <= v["ping_interval_max_background"]
        ),
    ),
    Constraint(
        ("presence_lease_renew", "presence_lease_ttl"),
        "presence_lease_renew must be < presence_lease_ttl",
        "B.4",
        lambda v: v["presence_lease_renew"] < v["presence_lease_ttl"],
    ),
    Constraint(
        ("token_refresh_lead", "access_token_ttl"),
        "token_refresh_lead must be < access_token_ttl",
        "B.4, §15.3",
        lambda v: v["token_refresh_lead"] < v["access_token_ttl"],
    ),
    Constraint(
        ("revocation_record_retention", "access_token_ttl"),
        "revocation_record_retention must be >= access_token_ttl (access_token_ttl + margin)",
        "B.4, §15.3.3",
        lambda v: v["revocation_record_retention"] >= v["access_token_ttl"],
    ),
    Constraint(
        ("client_dedup_window_hours", "fanout_retry_max_window"),
        "the client local_dedup window must be >= fanout_retry_max_window",
        "B.2, B.6",
        lambda v: v["client_dedup_window_hours"] * HOUR >= v["fanout_retry_max_window"],
    ),
    Constraint(
        ("conn_send_low_watermark", "conn_send_soft_watermark", "conn_send_hard_watermark"),
        "conn_send_low_watermark < soft.bytes, and soft <= hard in bytes and items",
        "B.5, §11.3",
        lambda v: (
            v["conn_send_low_watermark"] < v["conn_send_soft_watermark"].bytes
            and v["conn_send_soft_watermark"].bytes <= v["conn_send_hard_watermark"].bytes
            and v["conn_send_soft_watermark"].items <= v["conn_send_hard_watermark"].items
        ),
    ),
    Constraint(
        ("per_user_msg_rate_burst", "per_user_msg_rate"),
        "per_user_msg_rate_burst must be >= per_user_msg_rate (per second)",
        "B.5, §8.2",
        lambda v: v["per_user_msg_rate_burst"] >= v["per_user_msg_rate"].per_second,
    ),
    Constraint(
        ("inline_body_max_bytes", "inline_body_budget_bytes"),
        "inline_body_max_bytes must be <= inline_body_budget_bytes",
        "B.5.1, ADR-0005",
        lambda v: v["inline_body_max_bytes"] <= v["inline_body_budget_bytes"],
    ),
    Constraint(
        ("push_confirm_extended_window", "tcp_user_timeout", "push_grace_window"),
        "push_confirm_extended_window must equal tcp_user_timeout + push_grace_window",
        "B.5.2, §16.1.2",
        lambda v: (
            v["push_confirm_extended_window"] == v["tcp_user_timeout"] + v["push_grace_window"]
        ),
    ),
    Constraint(
        ("writer_self_fence_deadline", "shard_lease_ttl", "writer_failover_wait"),
        "writer_self_fence_deadline < shard_lease_ttl < writer_failover_wait "
        "(the anti-split-brain inequality)",
        "§19.2.2, I15",
        lambda v: (
            v["writer_self_fence_deadline"] < v["shard_lease_ttl"] < v["writer_failover_wait"]
        ),
    ),
    Constraint(
        ("writer_lease_renew_interval", "shard_lease_ttl"),
        "writer_lease_renew_interval must be <= shard_lease_ttl / 3",
        "§19.2.2",
        lambda v: 3 * v["writer_lease_renew_interval"] <= v["shard_lease_ttl"],
    ),
    Constraint(
        ("member_page_hard_limit", "member_page_limit"),
        "member_page_hard_limit must be >= member_page_limit",
        "B.6.1",
        lambda v: v["member_page_hard_limit"] >= v["member_page_limit"],
    ),
)


def _holds(constraint: Constraint, values: Values) -> bool:
    try:
        return constraint.holds(values)
    except (ArithmeticError, TypeError, AttributeError):  # e.g. a zero count as a divisor
        return False


def check_constraints(values: Values, *, context: str = "") -> None:
    """Raise ``ConstraintError`` naming every broken rule at once, so one fix round suffices."""
    broken = [c.message(values) for c in CONSTRAINTS if not _holds(c, values)]
    if broken:
        where = f" for {context}" if context else ""
        raise ConstraintError(f"invalid parameters{where}:\n  " + "\n  ".join(broken))
