"""The writer decides each group message's mailbox_write_policy (spec 10.2.3, decision 46)."""

from __future__ import annotations

from qim.core.conversation import Accepted
from qim.core.fanout.build import message_dispatch
from qim.core.fanout.write_policy import TierRule

from .support import NOW, TENANT, Groups, commit, config, send_request, writer

HOUR = 3_600_000
ON = TierRule(
    enabled=True,
    read_diffusion_min_saving=10,
    read_diffusion_max_active_ratio=0.5,
    policy_switch_min_interval_ms=24 * HOUR,
)


def _groups(members: int) -> Groups:
    groups = Groups()
    groups.add("g:big", [f"u{i}" for i in range(members)])
    return groups


def _policy(state: object, sender: str, cmid: str, now: int, groups: Groups) -> str:
    decision = commit(state, send_request(sender, "g:big", cmid), now, groups)  # type: ignore[arg-type]
    assert isinstance(decision, Accepted), decision
    return decision.record.write_policy


def test_off_by_default_every_message_is_always() -> None:
    state, groups = writer(), _groups(50)
    assert _policy(state, "u0", "c-1", NOW, groups) == "always"
    head = state.head(TENANT, "g:big")
    assert head is not None and (head.write_policy, head.policy_switched_at) == ("always", 0)


def test_on_a_group_over_the_saving_enters_records_the_instant_and_the_dispatch_carries_it() -> (
    None
):
    state, groups = writer(config(write_tier=ON)), _groups(50)
    assert _policy(state, "u0", "c-1", NOW, groups) == "mention_only"
    head = state.head(TENANT, "g:big")
    assert head is not None and (head.write_policy, head.policy_switched_at) == (
        "mention_only",
        head.updated_at,
    )
    switched = head.policy_switched_at
    assert _policy(state, "u1", "c-2", NOW + 1000, groups) == "mention_only"
    head = state.head(TENANT, "g:big")
    assert head is not None and head.policy_switched_at == switched  # no second switch
    # a replay of the outbox rebuilds the same head (the state is the fold of the records)
    replayed = writer(config(write_tier=ON))
    decision = commit(writer(config(write_tier=ON)), send_request("u0", "g:big", "x"), NOW, groups)
    assert isinstance(decision, Accepted)
    replayed.apply(decision.record)
    again = replayed.head(TENANT, "g:big")
    assert again is not None and again.write_policy == "mention_only"
    dispatch = message_dispatch(decision.record, 0)
    assert dispatch.write_policy == "mention_only"


def test_a_small_group_stays_always_and_a_shrunk_one_leaves_only_after_the_hold() -> None:
    state = writer(config(write_tier=ON))
    assert _policy(state, "u0", "c-1", NOW, _groups(10)) == "always"  # 10 x 1 is not > 10
    assert _policy(state, "u0", "c-2", NOW + 1000, _groups(11)) == "mention_only"
    small = _groups(5)  # below T x 0.8 = 8
    assert _policy(state, "u0", "c-3", NOW + 2 * HOUR, small) == "mention_only"  # held
    assert _policy(state, "u0", "c-4", NOW + 25 * HOUR, small) == "always"


def test_direct_conversations_never_switch() -> None:
    from .support import direct_request

    state = writer(config(write_tier=ON))
    decision = commit(state, direct_request("u0", "u1", "c-1"), NOW)
    assert isinstance(decision, Accepted) and decision.record.write_policy == "always"
