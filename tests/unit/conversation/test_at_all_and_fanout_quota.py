"""Spec 11.4.2 (@all gate) and 8.2 L3 / 10.5.2 (``tenant_fanout_quota``) at the writer core."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from qim.core.conversation import Accepted, Duplicate, Rejected, direct_conversation_id
from qim.core.conversation.at_all import DAY_MS, DailyQuota, mentions_all, role_refused
from qim.params import Rate
from qim.schemas.frames import MENTION_ALL, ErrorCode
from qim.schemas.frames.errors import RETRY_AFTER_NEVER_MS
from qim.schemas.records import SendRequest

from .support import NOW, TENANT, Groups, commit, config, direct_request, send_request, writer

ALL = (MENTION_ALL,)
BIG = 1500  # above large_group_member_threshold (1000)


def _refused(decision: object, code: ErrorCode) -> tuple[int | None, str]:
    assert isinstance(decision, Rejected), decision
    assert decision.code is code, decision
    error = decision.reply.error
    assert error is not None
    return error.retry_after_ms, error.detail


def _groups(count: int | None = None) -> Groups:
    groups = Groups()
    groups.add("g:team", [f"u{i}" for i in range(12)], count=count)
    groups.roles[(TENANT, "g:team", "u0")] = "OWNER"
    groups.roles[(TENANT, "g:team", "u1")] = "ADMIN"
    groups.roles[(TENANT, "g:team", "u11")] = "GUEST"
    return groups


def _all(sender: str, cmid: str, conversation: str = "g:team", request_id: int = 1) -> SendRequest:
    return send_request(sender, conversation, cmid, mentions=ALL, request_id=request_id)


def test_mentions_all_reads_mention_targets() -> None:
    assert mentions_all(("bob", MENTION_ALL))
    assert not mentions_all(("bob", "all"))
    assert not mentions_all(())


def test_role_rule_applies_only_above_the_large_group_threshold() -> None:
    def refused(members: int, role: str, min_role: str = "ADMIN") -> bool:
        return role_refused(members, role, min_role=min_role, large_group_member_threshold=1000)

    assert refused(1001, "MEMBER")
    assert not refused(1000, "MEMBER")
    assert not refused(1001, "ADMIN") and not refused(1001, "OWNER")
    assert refused(1001, "")  # unknown ranks lowest
    assert refused(5000, "ADMIN", min_role="OWNER")


def test_11_4_2_a_member_below_at_all_min_role_is_refused_rate_limited_in_a_large_group() -> None:
    groups, state = _groups(BIG), writer()
    before = state.snapshot()
    request = send_request("u5", "g:team", "c-1", mentions=ALL, request_id=77)
    decision = commit(state, request, NOW, groups)
    retry, detail = _refused(decision, ErrorCode.RATE_LIMITED)
    assert retry == RETRY_AFTER_NEVER_MS and detail == "at_all_min_role"
    assert isinstance(decision, Rejected) and decision.reply.error is not None
    assert decision.reply.error.request_id == 77
    assert state.snapshot() == before  # nothing committed, no silent downgrade (I-30)
    # the same text without @all is an ordinary message and goes through
    assert isinstance(commit(state, send_request("u5", "g:team", "c-1"), NOW, groups), Accepted)
    assert isinstance(commit(state, _all("u1", "c-2"), NOW, groups), Accepted)  # an ADMIN


def test_11_4_2_anyone_may_at_all_in_a_small_group_and_min_role_is_per_tenant() -> None:
    groups = _groups()  # 12 members
    assert isinstance(commit(writer(), _all("u11", "c"), NOW, groups), Accepted)  # even a GUEST
    strict = writer(config(at_all_min_role="OWNER", large_group_member_threshold=5))
    _refused(commit(strict, _all("u1", "c"), NOW, groups), ErrorCode.RATE_LIMITED)
    assert isinstance(commit(strict, _all("u0", "c"), NOW, groups), Accepted)


def test_11_4_2_at_all_rate_per_conversation_the_second_at_all_in_10_min_is_refused() -> None:
    groups, state = _groups(), writer()
    assert isinstance(commit(state, _all("u0", "c-1"), NOW, groups), Accepted)
    retry, detail = _refused(
        commit(state, _all("u1", "c-2"), NOW + 1000, groups), ErrorCode.RATE_LIMITED
    )
    assert detail == "at_all_rate_per_conversation"
    assert retry == 10 * 60_000 - 1000
    # another conversation has its own cell; the refused one succeeds once the token is back
    groups.add("g:other", ["u1", "u2"])
    assert isinstance(commit(state, _all("u1", "c-3", "g:other"), NOW + 1000, groups), Accepted)
    assert isinstance(commit(state, _all("u1", "c-2"), NOW + 600_000, groups), Accepted)


def test_11_4_2_the_fourth_at_all_in_a_window_of_three_is_refused() -> None:
    groups = _groups()
    state = writer(config(at_all_rate_per_conversation=Rate(count=3, period_ms=600_000)))
    for i in range(3):
        assert isinstance(commit(state, _all(f"u{i}", f"c{i}"), NOW + i, groups), Accepted)
    retry, detail = _refused(
        commit(state, _all("u3", "c3"), NOW + 3, groups), ErrorCode.RATE_LIMITED
    )
    assert detail == "at_all_rate_per_conversation" and retry is not None and retry > 0
    # one token per 200 s comes back
    assert isinstance(commit(state, _all("u3", "c3"), NOW + 200_000, groups), Accepted)


def test_11_4_2_an_at_all_takes_no_per_conversation_msg_rate_token_but_is_checked_against_it() -> (
    None
):
    groups = Groups()
    groups.add("g:huge", [f"u{i}" for i in range(5)], count=10_001)  # L2: 2 msg/s, capacity 2
    groups.roles.update({(TENANT, "g:huge", u): "ADMIN" for u in ("u0", "u1")})
    state = writer(config(at_all_rate_per_conversation=Rate(count=5, period_ms=600_000)))
    assert isinstance(commit(state, _all("u0", "a0", "g:huge"), NOW, groups), Accepted)
    # other members' normal sends in the same second are not throttled by it (26 #37)
    assert isinstance(commit(state, send_request("u2", "g:huge", "n0"), NOW, groups), Accepted)
    assert isinstance(commit(state, send_request("u3", "g:huge", "n1"), NOW, groups), Accepted)
    # L2 is now empty: a third ordinary send and an @all are both refused by it (in series)
    _, detail = _refused(
        commit(state, send_request("u4", "g:huge", "n2"), NOW, groups), ErrorCode.RATE_LIMITED
    )
    assert detail == ""
    _, detail = _refused(
        commit(state, _all("u1", "a1", "g:huge"), NOW, groups), ErrorCode.RATE_LIMITED
    )
    assert detail == ""


def test_11_4_2_at_all_daily_quota_per_sender_is_a_utc_day() -> None:
    groups = Groups()
    convs = [groups.add(f"g:c{i}", ["alice", "bob"]) for i in range(12)]
    state = writer()
    day_start = (NOW // DAY_MS + 1) * DAY_MS  # a UTC midnight after NOW
    t = day_start + 3_600_000
    for i in range(10):
        assert isinstance(commit(state, _all("alice", f"c{i}", convs[i]), t + i, groups), Accepted)
    retry, detail = _refused(
        commit(state, _all("alice", "c10", convs[10]), t + 10, groups), ErrorCode.RATE_LIMITED
    )
    assert detail == "at_all_daily_quota_per_sender"
    assert retry == day_start + DAY_MS - (t + 10)  # to the next midnight
    assert isinstance(commit(state, _all("bob", "b0", convs[10]), t + 10, groups), Accepted)
    next_day = day_start + DAY_MS
    assert isinstance(commit(state, _all("alice", "c10", convs[11]), next_day, groups), Accepted)


def test_daily_quota_rows_are_evicted_when_their_day_is_over() -> None:
    quota = DailyQuota()
    day = 20_000 * DAY_MS
    quota.debit(("t", "a"), day + 5)
    quota.debit(("t", "b"), day + DAY_MS - 1)
    assert (
        quota.used(("t", "a"), day + 10) == 1
        and quota.check(("t", "a"), 1, day + 10) == DAY_MS - 10
    )
    assert (
        quota.used(("t", "a"), day + DAY_MS) == 0
        and quota.check(("t", "a"), 1, day + DAY_MS) is None
    )
    assert quota.evict(day + DAY_MS) == 2 and len(quota) == 0


def test_10_5_2_unset_tenant_fanout_quota_enforces_nothing() -> None:
    groups, state = _groups(BIG), writer()
    for i in range(8):
        decision = commit(state, send_request(f"u{i}", "g:team", "c"), NOW + i * 1000, groups)
        assert isinstance(decision, Accepted), i


def test_10_5_2_large_group_sends_over_the_tenant_bucket_get_fanout_quota_exceeded() -> None:
    groups = _groups(BIG)
    state = writer(config(tenant_fanout_quota=Rate(count=2000, period_ms=1000)))
    assert isinstance(commit(state, send_request("u0", "g:team", "c0"), NOW, groups), Accepted)
    assert isinstance(commit(state, send_request("u1", "g:team", "c1"), NOW, groups), Accepted)
    # 3000 entries taken from a 2000-entry bucket: overdrawn, the next large-group send waits
    before = state.snapshot()
    request = send_request("u2", "g:team", "c2", request_id=9)
    decision = commit(state, request, NOW, groups)
    retry, _ = _refused(decision, ErrorCode.FANOUT_QUOTA_EXCEEDED)
    assert retry == 501  # until the level is back at one token: (3000 - 1999) x 0.5 ms
    assert isinstance(decision, Rejected) and decision.reason == "fanout_quota_exceeded"
    assert decision.reply.error is not None and decision.reply.error.request_id == 9
    assert state.snapshot() == before
    # per tenant: small groups and 1:1 are not refused, another tenant is untouched
    small = _groups()
    small.add("g:small", ["u0", "u1"])
    assert isinstance(commit(state, send_request("u0", "g:small", "s"), NOW, small), Accepted)
    assert isinstance(commit(state, direct_request("u0", "peer", "d"), NOW), Accepted)
    groups.add("g:team", [f"u{i}" for i in range(12)], tenant="beta", count=BIG)
    other = send_request("u0", "g:team", "o", tenant="beta")
    assert isinstance(commit(state, other, NOW, groups), Accepted)
    # the token is back after the hint (the small sends took 4 more entries: +2 ms)
    assert isinstance(commit(state, request, NOW + 501 + 2, groups), Accepted)


def test_8_2_l3_debits_estimated_entries_a_one_to_one_message_costs_two() -> None:
    def second_large_send(directs: int) -> object:
        groups = _groups(1001)
        state = writer(config(tenant_fanout_quota=Rate(count=1002, period_ms=1000)))
        for i in range(directs):
            assert isinstance(commit(state, direct_request("x", f"p{i}", f"d{i}"), NOW), Accepted)
        assert isinstance(commit(state, send_request("u0", "g:team", "a"), NOW, groups), Accepted)
        return commit(state, send_request("u1", "g:team", "b"), NOW, groups)

    assert isinstance(second_large_send(0), Accepted)  # 1 token left after 1001: admitted
    retry, _ = _refused(second_large_send(2), ErrorCode.FANOUT_QUOTA_EXCEEDED)
    assert retry == 4  # 2 x 2 entries at 999 us each


def test_l3_is_checked_after_l1_l2_and_a_refusal_by_them_takes_no_fanout_token() -> None:
    groups = Groups()
    groups.add("g:huge", [f"u{i}" for i in range(5)], count=10_001)  # L2 2/s
    state = writer(config(tenant_fanout_quota=Rate(count=12_000, period_ms=1000)))
    for i in range(2):
        assert isinstance(
            commit(state, send_request(f"u{i}", "g:huge", "c"), NOW, groups), Accepted
        )
    # both L2 (empty) and L3 (overdrawn) would refuse: L2 answers first, RATE_LIMITED
    before = state.snapshot()
    _refused(commit(state, send_request("u2", "g:huge", "c"), NOW, groups), ErrorCode.RATE_LIMITED)
    assert state.snapshot() == before
    # L2 has a token again at +500 ms, L3 is still overdrawn: FANOUT_QUOTA_EXCEEDED
    late = commit(state, send_request("u2", "g:huge", "c"), NOW + 500, groups)
    _refused(late, ErrorCode.FANOUT_QUOTA_EXCEEDED)


def test_restore_keeps_the_at_all_cells_the_daily_counts_and_the_tenant_bucket() -> None:
    groups = _groups(BIG)
    cfg = config(tenant_fanout_quota=Rate(count=1000, period_ms=1000))
    state = writer(cfg)
    assert isinstance(commit(state, _all("u0", "a"), NOW, groups), Accepted)
    restored = type(state).restore(state.snapshot(), cfg, region_id=1, writer_id=5, fencing_epoch=1)
    assert restored.snapshot() == state.snapshot()
    _, detail = _refused(commit(restored, _all("u1", "b"), NOW + 1, groups), ErrorCode.RATE_LIMITED)
    assert detail == "at_all_rate_per_conversation"
    _refused(
        commit(restored, send_request("u1", "g:team", "c"), NOW + 1, groups),
        ErrorCode.FANOUT_QUOTA_EXCEEDED,
    )


def test_direct_conversation_at_all_has_no_role_gate() -> None:
    conv = direct_conversation_id(TENANT, "alice", "bob")
    request = send_request("alice", conv, "c", peer="bob", mentions=ALL)
    assert isinstance(commit(writer(config(large_group_member_threshold=0)), request), Accepted)


# -- model-based: the writer's @all decisions equal a plain token-bucket / day-count model ----

PERIOD_MS = 600_000
SENDERS = {"u0": "OWNER", "u1": "ADMIN", "u2": "MEMBER", "u11": "GUEST"}


@dataclass
class _Model:
    """11.4.2 from the text: a token bucket (capacity 3, 3 per 10 min) per conversation, a
    count per sender and UTC day (quota 4), the role rule above the threshold."""

    tokens: dict[str, tuple[Fraction, int]] = field(default_factory=dict)
    days: dict[tuple[str, int], int] = field(default_factory=dict)

    def decide(self, sender: str, conv: str, members: int, now: int) -> str:
        if members > 1000 and SENDERS[sender] not in ("OWNER", "ADMIN"):
            return "at_all_min_role"
        level, at = self.tokens.get(conv, (Fraction(3), now))
        level = min(Fraction(3), level + Fraction(now - at, PERIOD_MS // 3))
        if level < 1:
            return "at_all_rate_per_conversation"
        if self.days.get((sender, now // DAY_MS), 0) >= 4:
            return "at_all_daily_quota_per_sender"
        self.tokens[conv] = (level - 1, now)
        self.days[(sender, now // DAY_MS)] = self.days.get((sender, now // DAY_MS), 0) + 1
        return "accepted"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(sorted(SENDERS)),
            st.sampled_from(["g:team", "g:small"]),
            st.sampled_from([0, 1, 1000, 60_000, 199_999, 200_000, 3_600_000, 40_000_000]),
        ),
        min_size=1,
        max_size=60,
    )
)
def test_model_at_all_decisions_match_the_token_bucket_and_day_model(
    program: list[tuple[str, str, int]],
) -> None:
    groups = _groups(BIG)
    groups.add("g:small", sorted(SENDERS))
    groups.roles.update({(TENANT, "g:small", u): r for u, r in SENDERS.items()})
    state = writer(
        config(
            at_all_rate_per_conversation=Rate(count=3, period_ms=PERIOD_MS),
            at_all_daily_quota_per_sender=4,
            sender_in_conversation_min_members=10**9,  # L1a off: the model is the @all gate
        )
    )
    model, now = _Model(), NOW
    for i, (sender, conv, dt) in enumerate(program):
        now += dt
        members = groups.member_count(TENANT, conv)
        decision = commit(state, _all(sender, f"m{i}", conv), now, groups)
        got = "accepted" if isinstance(decision, Accepted) else getattr(decision, "reason", "?")
        assert got == model.decide(sender, conv, members, now), (i, sender, conv)
    replayed = type(state).restore(state.snapshot(), state.config, region_id=1, writer_id=5)
    assert replayed.snapshot() == state.snapshot()


def test_a_resent_at_all_whose_ack_was_lost_gets_the_same_ack_not_a_refusal() -> None:
    groups = _groups(BIG)
    state = writer(config(tenant_fanout_quota=Rate(count=100, period_ms=1000)))
    first = commit(state, _all("u0", "once"), NOW, groups)
    assert isinstance(first, Accepted)
    # 3 s later (L1a's interval) the @all cell (10 min) and the tenant bucket (1500 entries of
    # 100/s) are still spent, yet the retry is a Duplicate with the first SEND_ACK
    again = state.handle_send(_all("u0", "once", request_id=2), NOW + 3000, groups)
    assert isinstance(again, Duplicate)
    assert again.reply.send_ack is not None and first.reply.send_ack is not None
    assert again.reply.send_ack.message_id == first.reply.send_ack.message_id
    _, detail = _refused(
        commit(state, _all("u1", "new"), NOW + 3000, groups), ErrorCode.RATE_LIMITED
    )
    assert detail == "at_all_rate_per_conversation"
    plain = send_request("u1", "g:team", "plain")
    _refused(commit(state, plain, NOW + 3000, groups), ErrorCode.FANOUT_QUOTA_EXCEEDED)
