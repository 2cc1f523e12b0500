"""TYPING rules (spec 13.2, AT-51): members only, others only, merged, none above the threshold."""

from __future__ import annotations

from qim.core.transient import (
    TypingForward,
    TypingGate,
    TypingRules,
    TypingVerdict,
    by_connection_shard,
    decide_typing,
)

RULES = TypingRules(merge_window_ms=2000, ttl_ms=5000, large_group_member_threshold=1000)
KEY = ("t", "g:team", "alice")


def decide(
    members: list[str] | None, now_ms: int, gate: TypingGate, count: int | None = None
) -> TypingForward:
    listed = None if members is None else (lambda: members)
    n = len(members or ()) if count is None else count
    return decide_typing(KEY, members=listed, member_count=n, gate=gate, rules=RULES, now_ms=now_ms)


def test_a_member_types_to_the_other_members_only_with_the_ttl() -> None:
    got = decide(["bob", "alice", "carol"], 0, TypingGate(2000))
    assert got.verdict is TypingVerdict.FORWARD
    assert got.recipients == ("bob", "carol")  # never the typist
    assert got.expires_in_ms == 5000


def test_a_non_member_is_refused() -> None:
    assert decide(None, 0, TypingGate(2000)).verdict is TypingVerdict.NOT_A_MEMBER


def test_one_indicator_per_merge_window_per_conversation_and_user() -> None:
    gate = TypingGate(2000)
    members = ["alice", "bob"]
    assert decide(members, 0, gate).verdict is TypingVerdict.FORWARD
    assert decide(members, 1999, gate).verdict is TypingVerdict.MERGED
    assert decide(members, 2000, gate).verdict is TypingVerdict.FORWARD
    other = decide_typing(
        ("t", "g:team", "bob"), members=lambda: members, member_count=2, gate=gate,
        rules=RULES, now_ms=2001,
    )  # fmt: skip
    assert other.verdict is TypingVerdict.FORWARD  # another user's window is its own


def test_above_the_large_group_threshold_nothing_is_forwarded() -> None:
    gate = TypingGate(2000)
    assert decide(["alice", "bob"], 0, gate, count=1001).verdict is TypingVerdict.TOO_LARGE
    assert decide(["alice", "bob"], 1, gate, count=1000).verdict is TypingVerdict.FORWARD


def test_alone_in_a_conversation_forwards_nothing() -> None:
    assert decide(["alice"], 0, TypingGate(2000)).verdict is TypingVerdict.ALONE


def test_the_gate_forgets_keys_past_the_window_and_past_its_cap() -> None:
    gate = TypingGate(2000, max_keys=3)
    for i in range(3):
        assert gate.admit(("t", "c", f"u{i}"), i)
    assert len(gate) == 3
    assert gate.admit(("t", "c", "u3"), 3)  # the oldest goes first at the cap
    assert len(gate) == 3
    assert gate.admit(("t", "c", "u4"), 10_000)  # everything older than the window is gone
    assert len(gate) == 1


def test_recipients_are_grouped_by_connection_shard_in_order() -> None:
    grouped = by_connection_shard(["d", "a", "c", "b", "a"], lambda u: 1 if u in "ac" else 0)
    assert list(grouped.items()) == [(0, ("b", "d")), (1, ("a", "c"))]
