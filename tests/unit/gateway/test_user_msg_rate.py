"""``per_user_msg_rate`` buckets of the ConnectionNode (``qim.gateway.routing.send_rate``)."""

from __future__ import annotations

import json

import pytest

from qim.gateway.routing.send_rate import UserMsgRate, tenant_views
from qim.params import Settings

DEFAULTS = Settings.load(env={})  # B.5: 20 msg/s, burst 40


def _admitted(rate: UserMsgRate, tenant: str, user: str, count: int, now_ms: int = 0) -> int:
    return sum(rate.take(tenant, user, now_ms).admitted for _ in range(count))


def test_the_burst_passes_then_each_refusal_says_when_a_retry_succeeds() -> None:
    rate = UserMsgRate(DEFAULTS)
    assert _admitted(rate, "t", "spammer", 100) == 40
    hint = rate.take("t", "spammer", 0).retry_after_ms
    assert hint is not None and hint > 0
    assert rate.take("t", "spammer", hint + 10_000).admitted  # the bucket refilled


def test_users_and_tenants_have_their_own_buckets() -> None:
    rate = UserMsgRate(DEFAULTS)
    assert _admitted(rate, "t", "spammer", 100) == 40
    assert _admitted(rate, "t", "carol", 10) == 10
    assert _admitted(rate, "other", "spammer", 10) == 10


def test_a_tenant_override_sets_its_rate_and_burst() -> None:
    raw = json.dumps(
        {"bulk": {"per_user_msg_rate": {"count": 500, "period_ms": 1000},
                  "per_user_msg_rate_burst": 1000}}
    )  # fmt: skip
    rate = UserMsgRate(DEFAULTS, tenant_views(DEFAULTS, raw))
    assert _admitted(rate, "bulk", "u", 2000) == 1000
    assert _admitted(rate, "t", "u", 100) == 40


def test_overrides_that_are_not_an_object_are_refused() -> None:
    assert tenant_views(DEFAULTS, None) == {}
    with pytest.raises(ValueError, match="JSON object"):
        tenant_views(DEFAULTS, "[1]")
