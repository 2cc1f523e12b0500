"""Spec 8.2 admission: L1a -> L1b -> L2, RATE_LIMITED with retry_after_ms, nothing consumed."""

from __future__ import annotations

from qim.core.conversation import Accepted, Rejected, direct_conversation_id, group_id_for
from qim.core.conversation.admission import AdmissionBuckets, Cell, Charge
from qim.schemas.frames import ErrorCode

from .support import NOW, Groups, commit, config, direct_request, send_request, writer


def _rejected(decision: object) -> Rejected:
    assert isinstance(decision, Rejected), decision
    return decision


def _retry(decision: object) -> int | None:
    rejected = _rejected(decision)
    assert rejected.code is ErrorCode.RATE_LIMITED
    assert rejected.reply.error is not None
    return rejected.reply.error.retry_after_ms


def test_gcra_cell_allows_a_burst_then_one_per_interval() -> None:
    buckets = AdmissionBuckets()
    charge = (Charge(("user", "t", "", "u"), Cell.of(20, 40)),)
    for _ in range(40):
        assert buckets.check(charge, NOW) is None
        buckets.debit(charge, NOW)
    assert buckets.check(charge, NOW) == 50
    assert buckets.check(charge, NOW + 49) == 1
    assert buckets.check(charge, NOW + 50) is None
    assert buckets.evict(NOW + 2000) == 1 and len(buckets) == 0  # full again = forgotten


def test_8_2_l1b_per_user_msg_rate_burst_40_then_retry_after_50ms() -> None:
    state = writer()
    peers = [f"peer{i}" for i in range(3)]  # L2 is 20/s per conversation: spread the burst
    for i in range(40):
        decision = commit(state, direct_request("alice", peers[i % 3], f"c{i}"))
        assert isinstance(decision, Accepted), i
    assert _retry(commit(state, direct_request("alice", "peer9", "c40"))) == 50
    assert isinstance(commit(state, direct_request("alice", "peer9", "c40"), NOW + 50), Accepted)


def test_8_2_l2_per_conversation_rate_20_per_s_for_small_groups() -> None:
    groups = Groups()
    team = groups.add("g:team", [f"u{i}" for i in range(30)])
    state = writer()
    for i in range(20):
        assert isinstance(commit(state, send_request(f"u{i}", team, "c"), NOW, groups), Accepted)
    assert _retry(commit(state, send_request("u20", team, "c"), NOW, groups)) == 50


def test_8_2_l2_tier_follows_member_count_2_per_s_above_10000() -> None:
    groups = Groups()
    huge = groups.add("g:huge", [f"u{i}" for i in range(5)], count=10_001)
    state = writer()
    assert isinstance(commit(state, send_request("u0", huge, "c"), NOW, groups), Accepted)
    assert isinstance(commit(state, send_request("u1", huge, "c"), NOW, groups), Accepted)
    assert _retry(commit(state, send_request("u2", huge, "c"), NOW, groups)) == 500


def test_8_2_l2_tier_flips_on_the_next_message_after_the_count_crosses() -> None:
    groups = Groups()
    team = groups.add("g:team", [f"u{i}" for i in range(10)], count=10_000)
    state = writer()
    for i in range(5):  # 5 msg/s tier, capacity 5
        assert isinstance(commit(state, send_request(f"u{i}", team, "c"), NOW, groups), Accepted)
    assert _retry(commit(state, send_request("u5", team, "c"), NOW, groups)) == 200
    groups.counts[("acme", team)] = 10_001  # crosses into the 2 msg/s tier
    later = NOW + 1000
    assert isinstance(commit(state, send_request("u5", team, "c"), later, groups), Accepted)
    assert isinstance(commit(state, send_request("u6", team, "c"), later, groups), Accepted)
    assert _retry(commit(state, send_request("u7", team, "c"), later, groups)) == 500


def test_8_2_l1a_per_sender_in_conversation_only_above_large_group_threshold() -> None:
    groups = Groups()
    big = groups.add("g:big", ["alice", "bob"], count=1001)
    small = groups.add("g:small", ["alice", "bob"], count=1000)
    state = writer()
    assert isinstance(commit(state, send_request("alice", big, "c1"), NOW, groups), Accepted)
    assert _retry(commit(state, send_request("alice", big, "c2"), NOW, groups)) == 3000
    assert isinstance(commit(state, send_request("bob", big, "c3"), NOW, groups), Accepted)
    for i in range(3):  # 1000 members is not "above": no L1a
        decision = commit(state, send_request("alice", small, f"s{i}"), NOW, groups)
        assert isinstance(decision, Accepted)
    assert isinstance(commit(state, send_request("alice", big, "c2"), NOW + 3000, groups), Accepted)


def test_8_2_t3_literal_l1a_everywhere_when_configured() -> None:
    state = writer(config(sender_in_conversation_min_members=0))
    groups = Groups()
    team = groups.add("g:team", ["alice", "bob"])
    assert isinstance(commit(state, send_request("alice", team, "c1"), NOW, groups), Accepted)
    assert _retry(commit(state, send_request("alice", team, "c2"), NOW + 1000, groups)) == 2000
    assert isinstance(commit(state, direct_request("alice", "bob", "d1")), Accepted)
    assert _retry(commit(state, direct_request("alice", "bob", "d2"))) == 3000
    assert isinstance(commit(writer(), direct_request("alice", "bob", "d2")), Accepted)


def test_8_2_rejected_request_consumes_no_token_of_any_layer() -> None:
    groups = Groups()
    team = groups.add("g:team", ["alice"] + [f"u{i}" for i in range(20)])
    state = writer()
    for i in range(20):  # exhaust L2 of g:team with other senders
        commit(state, send_request(f"u{i}", team, "c"), NOW, groups)
    before = state.snapshot()
    for i in range(50):  # alice's L1b would run dry if L2 rejections took her tokens
        # each refusal is promised the next unpromised token of L2 (a hint, not a token)
        retry = _retry(state.handle_send(send_request("alice", team, f"x{i}"), NOW, groups))
        assert retry == 50 * (i + 1)
    assert state.snapshot() == before
    for i in range(40):
        peer = f"p{i % 3}"
        assert isinstance(commit(state, direct_request("alice", peer, f"d{i}")), Accepted), i


def test_8_2_first_rejecting_layer_answers_in_order() -> None:
    groups = Groups()
    big = groups.add("g:big", ["alice", "bob"] + [f"u{i}" for i in range(4)], count=5000)
    state = writer()
    commit(state, send_request("alice", big, "a1"), NOW, groups)  # L1a: next in 3 s
    for i in range(4):  # 5 msg/s tier, capacity 5: L2 now exhausted for 200 ms
        commit(state, send_request(f"u{i}", big, "c"), NOW, groups)
    # both L1a (3000 ms) and L2 (200 ms) would refuse alice: L1a is evaluated first
    assert _retry(state.handle_send(send_request("alice", big, "a2"), NOW, groups)) == 3000
    # bob has no L1a debt, so L2 answers
    assert _retry(state.handle_send(send_request("bob", big, "b1"), NOW, groups)) == 200


def test_8_2_duplicate_is_admission_checked_but_consumes_nothing() -> None:
    state = writer()
    first = commit(state, direct_request("alice", "bob", "same"))
    assert isinstance(first, Accepted)
    before = state.snapshot()
    for _ in range(100):
        decision = state.handle_send(direct_request("alice", "bob", "same"), NOW, Groups())
        assert decision.reply.send_ack == first.reply.send_ack
    assert state.snapshot() == before


def test_8_2_direct_conversation_counts_two_members_for_l2() -> None:
    state = writer()
    conv = direct_conversation_id("acme", "alice", "bob")
    for i in range(20):
        sender, peer = ("alice", "bob") if i % 2 else ("bob", "alice")
        assert isinstance(commit(state, direct_request(sender, peer, f"c{i}")), Accepted)
    decision = commit(state, direct_request("alice", "bob", "c20"))
    assert _retry(decision) == 50
    head = state.head("acme", conv)
    assert head is not None and head.member_count == 2
    assert group_id_for("x") == "g:x"


def test_refusals_in_one_moment_are_promised_successive_tokens_and_each_retry_succeeds() -> None:
    """Retry hints that reflect when a retry can succeed (issue 15.3): 10 senders refused at
    once by a conversation's 20/s bucket are told 50, 100, ... 500 ms, and every one that
    comes back at its time is admitted; the promises never change a decision."""
    buckets = AdmissionBuckets()
    charge = (Charge(("conversation", "t", "g:team", ""), Cell.of(20, 20)),)
    for _ in range(20):
        assert buckets.promise(charge, NOW) is None
        buckets.debit(charge, NOW)
    hints = [buckets.promise(charge, NOW) for _ in range(10)]
    assert hints == [50 * k for k in range(1, 11)]
    assert buckets.check(charge, NOW) == 50  # check still reads the bucket only
    for hint in hints:
        assert hint is not None
        assert buckets.promise(charge, NOW + hint) is None
        buckets.debit(charge, NOW + hint)
    assert buckets.promise(charge, NOW + 500) == 50  # the promises are spent
