"""The ConnectionShard assignor: balance, stickiness, determinism, and the owner map that rides
the group protocol (direction.md 4.1). No Kafka here: the aiokafka part is exercised through its
protocol structs only."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping

import pytest
from aiokafka import TopicPartition
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from qim.gateway.ownership.assignor import (
    EMPTY_CLAIM,
    Endpoints,
    Lease,
    MemberClaim,
    OwnerMap,
    assign_partitions,
    decode_member_metadata,
    decode_owner_map,
    encode_member_metadata,
    encode_owner_map,
    from_ranges,
    next_seq,
    to_ranges,
)
from qim.gateway.ownership.shards import (
    ASSIGNOR_NAME,
    AssignorBinding,
    ShardOwnership,
    bound_assignor,
)

N = 256


def ep(i: int) -> Endpoints:
    return Endpoints(f"ws://127.0.0.1:{9000 + i}", f"wss://127.0.0.1:{9400 + i}")


def fresh(*ids: str) -> dict[str, MemberClaim]:
    return {m: MemberClaim(ep(i)) for i, m in enumerate(ids)}


def claims_from(
    result: Mapping[str, tuple[int, ...]], seq: int, *new: str
) -> dict[str, MemberClaim]:
    claims = {m: MemberClaim(ep(i), seq, parts) for i, (m, parts) in enumerate(result.items())}
    claims.update({m: MemberClaim(ep(100 + i)) for i, m in enumerate(new)})
    return claims


def check_partition(result: Mapping[str, tuple[int, ...]], n: int = N) -> None:
    """Every partition exactly once, and the counts differ by at most one."""
    flat = [p for parts in result.values() for p in parts]
    assert sorted(flat) == list(range(n))
    sizes = [len(parts) for parts in result.values()]
    assert max(sizes) - min(sizes) <= 1


def moved(before: Mapping[str, tuple[int, ...]], after: Mapping[str, tuple[int, ...]]) -> int:
    owner = {p: m for m, parts in before.items() for p in parts}
    return sum(1 for m, parts in after.items() for p in parts if owner.get(p) != m)


# --- ranges -------------------------------------------------------------------------------


def test_ranges_collapse_and_expand() -> None:
    assert to_ranges([5, 0, 1, 2, 2, 7, 6]) == [(0, 2), (5, 7)]
    assert to_ranges([]) == []
    assert from_ranges([(0, 2), (5, 7), (6, 6)]) == [0, 1, 2, 5, 6, 7]


# --- the assignment -------------------------------------------------------------------------


@pytest.mark.parametrize("members", [1, 2, 3])
def test_balanced_over_members(members: int) -> None:
    ids = [f"gw-{i}" for i in range(members)]
    result = assign_partitions(N, fresh(*ids))
    check_partition(result)
    assert set(result) == set(ids)
    expected = {1: [256], 2: [128, 128], 3: [85, 85, 86]}[members]
    assert sorted(len(p) for p in result.values()) == expected


def test_fresh_assignment_is_contiguous() -> None:
    result = assign_partitions(N, fresh("a", "b"))
    assert to_ranges(result["a"]) == [(0, 127)]
    assert to_ranges(result["b"]) == [(128, 255)]


def test_no_members_and_more_members_than_partitions() -> None:
    assert assign_partitions(N, {}) == {}
    result = assign_partitions(2, fresh("a", "b", "c"))
    check_partition(result, 2)
    assert sum(1 for parts in result.values() if not parts) == 1


def test_a_joining_member_takes_only_its_share() -> None:
    one = assign_partitions(N, fresh("a"))
    two = assign_partitions(N, claims_from(one, 1, "b"))
    check_partition(two)
    assert set(two["a"]) <= set(one["a"])
    assert moved(one, two) == 128  # exactly b's share moves

    three = assign_partitions(N, claims_from(two, 2, "c"))
    check_partition(three)
    assert set(three["a"]) <= set(two["a"])
    assert set(three["b"]) <= set(two["b"])
    assert moved(two, three) == len(three["c"]) == 85


def test_a_leaving_member_moves_only_its_shards() -> None:
    three = assign_partitions(N, fresh("a", "b", "c"))
    survivors = claims_from(three, 1)
    del survivors["b"]
    two = assign_partitions(N, survivors)
    check_partition(two)
    assert set(two["a"]) >= set(three["a"])
    assert set(two["c"]) >= set(three["c"])
    assert moved(three, two) == len(three["b"])


def test_larger_quota_goes_to_the_larger_holder() -> None:
    # "z" sorts last but holds the most: it gets the +1 quota and keeps everything.
    claims = {
        "a": MemberClaim(ep(0), 4, tuple(range(100))),
        "z": MemberClaim(ep(1), 4, tuple(range(100, 229))),
        "m": MemberClaim(ep(2), 4, tuple(range(229, 256))),
    }
    result = assign_partitions(N, claims)
    check_partition(result)
    assert result["z"] == tuple(range(100, 186))
    assert len(result["z"]) == 86
    assert set(result["a"]) <= set(range(100))


def test_a_stale_claim_loses_to_a_newer_one() -> None:
    """A zombie (evicted, comes back with an old seq) loses every contested shard."""
    claims = {
        "zombie": MemberClaim(ep(0), 3, tuple(range(128))),
        "b": MemberClaim(ep(1), 4, tuple(range(256))),
    }
    result = assign_partitions(N, claims)
    check_partition(result)
    assert moved({"b": tuple(range(N))}, result) == 128
    assert set(result["b"]) <= set(range(N))
    # the zombie gets its share from b's surplus, not by priority of its stale claim
    assert result["b"] == tuple(range(128))
    assert result["zombie"] == tuple(range(128, 256))


def test_claims_out_of_range_are_ignored() -> None:
    claims = {"a": MemberClaim(ep(0), 1, (3, 300, -1)), "b": EMPTY_CLAIM}
    result = assign_partitions(8, claims)
    check_partition(result, 8)
    assert 3 in result["a"]


def test_equal_seq_conflicts_go_to_the_smaller_member_id() -> None:
    claims = {"b": MemberClaim(ep(1), 2, (0, 1)), "a": MemberClaim(ep(0), 2, (0,))}
    result = assign_partitions(2, claims)
    assert result == {"a": (0,), "b": (1,)}


def test_deterministic_whatever_the_input_order() -> None:
    rng = random.Random(7)
    base = assign_partitions(N, fresh("a", "b", "c", "d"))
    claims = claims_from(base, 5, "e", "f")
    expected = assign_partitions(N, claims)
    for _ in range(20):
        items = list(claims.items())
        rng.shuffle(items)
        assert assign_partitions(N, dict(items)) == expected


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(min_value=0, max_value=300),
    owned=st.lists(
        st.tuples(st.integers(0, 5), st.lists(st.integers(-5, 320), max_size=60)),
        min_size=1,
        max_size=7,
    ),
)
def test_property_exactly_once_balanced_sticky(n: int, owned: list[tuple[int, list[int]]]) -> None:
    claims = {f"m{i:02d}": MemberClaim(ep(i), seq, tuple(ps)) for i, (seq, ps) in enumerate(owned)}
    result = assign_partitions(n, claims)
    check_partition(result, n)
    reversed_input = dict(reversed(list(claims.items())))
    assert assign_partitions(n, reversed_input) == result
    # Sticky: a member either keeps all its valid claims, or gets nothing but valid claims.
    for m, parts in result.items():
        valid = {p for p in claims[m].owned if 0 <= p < n and valid_claim(claims, m, p)}
        assert valid <= set(parts) or set(parts) <= valid


def valid_claim(claims: Mapping[str, MemberClaim], member: str, p: int) -> bool:
    """No other member claims p with a higher seq, or the same seq and a smaller id."""
    mine = claims[member].seq
    return not any(
        p in c.owned and (c.seq > mine or (c.seq == mine and other < member))
        for other, c in claims.items()
        if other != member
    )


def test_next_seq_is_above_every_claim() -> None:
    assert next_seq([]) == 1
    assert next_seq([EMPTY_CLAIM, MemberClaim(ep(0), 9), MemberClaim(ep(1), 4)]) == 10


# --- encodings and the owner map --------------------------------------------------------------


def test_member_metadata_round_trip() -> None:
    claim = MemberClaim(ep(3), 17, (0, 1, 2, 3, 10, 11, 200))
    data = encode_member_metadata(claim)
    assert decode_member_metadata(data) == claim
    assert b'"r":[[0,3],[10,11],[200,200]]' in data
    assert decode_member_metadata(encode_member_metadata(EMPTY_CLAIM)) == EMPTY_CLAIM
    no_tls = MemberClaim(Endpoints("ws://h:1"), 0, ())
    assert decode_member_metadata(encode_member_metadata(no_tls)) == no_tls


def test_owner_map_round_trip_and_lookup() -> None:
    result = assign_partitions(N, fresh("a", "b", "c"))
    endpoints = {"a": ep(0), "b": ep(1), "c": ep(2)}
    owner_map = OwnerMap.from_assignment(7, N, result, endpoints)
    data = encode_owner_map(owner_map)
    decoded = decode_owner_map(data)
    assert decoded == owner_map
    assert decoded is not None
    assert decoded.seq == 7
    assert decoded.partition_count == N
    for m, parts in result.items():
        assert decoded.partitions_of(endpoints[m]) == frozenset(parts)
        for p in parts:
            assert decoded.owner(p) == endpoints[m]
    assert decoded.owner(N) is None
    assert decoded.owner(-1) is None
    assert len(data) < 400, "ranges keep the map compact"


def test_owner_map_after_churn_stays_small() -> None:
    one = assign_partitions(N, fresh("a"))
    two = assign_partitions(N, claims_from(one, 1, "b"))
    three = assign_partitions(N, claims_from(two, 2, "c"))
    endpoints = {"a": ep(0), "b": ep(1), "c": ep(100)}
    owner_map = OwnerMap.from_assignment(3, N, three, endpoints)
    assert decode_owner_map(encode_owner_map(owner_map)) == owner_map
    assert len(encode_owner_map(owner_map)) < 400


def test_owner_without_endpoints_is_absent_from_the_map() -> None:
    owner_map = OwnerMap.from_assignment(1, 4, {"a": (0, 1), "b": (2, 3)}, {"a": ep(0), "b": None})
    decoded = decode_owner_map(encode_owner_map(owner_map))
    assert decoded == owner_map
    assert decoded is not None
    assert decoded.owner(2) is None
    assert decoded.owners() == {ep(0): (0, 1)}


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff\xfe",
        b"[]",
        b'{"v":0}',
        b'{"v":1,"s":"x","n":4,"o":[]}',
        b'{"v":1,"s":1,"n":-1,"o":[]}',
        b'{"v":1,"s":1,"n":4,"o":[{"e":"ws://a","t":null,"r":[[0,4]]}]}',
        b'{"v":1,"s":1,"n":4,"o":[{"e":"ws://a","t":null,"r":[[2,1]]}]}',
        b'{"v":1,"s":1,"n":4,"o":[{"e":null,"t":null,"r":[[0,1]]}]}',
        b'{"v":1,"s":1,"n":4,"o":[{"e":"ws://a","t":null,"r":[[0,1]]},'
        b'{"e":"ws://b","t":null,"r":[[1,2]]}]}',
        b'{"v":1,"s":true,"n":4,"o":[]}',
    ],
)
def test_malformed_owner_maps_decode_to_none(data: bytes) -> None:
    assert decode_owner_map(data) is None


@pytest.mark.parametrize(
    "data",
    [
        b"nope",
        b'{"v":1,"e":"ws://a","t":null,"s":-1,"r":[]}',
        b'{"v":1,"e":5,"t":null,"s":1,"r":[]}',
        b'{"v":1,"e":"ws://a","t":null,"s":1,"r":[[0,1000000000000]]}',
        b'{"v":1,"e":"ws://a","t":null,"s":1,"r":[[0]]}',
    ],
)
def test_malformed_member_metadata_decodes_to_none(data: bytes) -> None:
    assert decode_member_metadata(data) is None


# --- the lease ------------------------------------------------------------------------------


def test_lease_arithmetic() -> None:
    lease = Lease(ttl=6.0, margin=1.0)
    assert not lease.valid(0.0)
    assert lease.expires_at() is None
    lease.renew(10.0)
    assert lease.expires_at() == 15.0
    assert lease.valid(14.9)
    assert not lease.valid(15.0)
    lease.renew(9.0)  # an older heartbeat's late answer never shortens the lease
    assert lease.expires_at() == 15.0
    lease.renew(12.0)
    assert lease.valid(16.5)
    lease.clear()
    assert not lease.valid(12.0)
    with pytest.raises(ValueError):
        Lease(ttl=1.0, margin=1.0)


# --- the aiokafka glue, through its protocol structs ------------------------------------------


class FakeCluster:
    def __init__(self, topics: Mapping[str, int]) -> None:
        self._topics = topics

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        n = self._topics.get(topic)
        return None if n is None else set(range(n))


def rebalance(
    bindings: Mapping[str, AssignorBinding], cluster: FakeCluster
) -> dict[str, list[int]]:
    """One JoinGroup/SyncGroup round trip as aiokafka would do it, bytes on the wire included."""
    joined = {
        m: ConsumerProtocolMemberMetadata.decode(b.metadata([b.topic]).encode())
        for m, b in bindings.items()
    }
    leader = bindings[sorted(bindings)[0]]
    assignments = leader.assign(cluster, joined)
    owned: dict[str, list[int]] = {}
    for m, b in bindings.items():
        wire = ConsumerProtocolMemberAssignment.decode(assignments[m].encode())
        b.on_assignment(wire)
        owned[m] = sorted(tp.partition for tp in wire.partitions())
    return owned


def test_bindings_learn_the_full_map_through_the_protocol_structs() -> None:
    topic = "qim.to-gateway"
    cluster = FakeCluster({topic: N})
    bindings = {"m-a": AssignorBinding(topic, ep(0)), "m-b": AssignorBinding(topic, ep(1))}
    owned = rebalance(bindings, cluster)
    check_partition({m: tuple(p) for m, p in owned.items()})
    maps = {m: b.received_map for m, b in bindings.items()}
    assert maps["m-a"] == maps["m-b"]
    owner_map = maps["m-a"]
    assert owner_map is not None
    assert owner_map.seq == 1
    for m, parts in owned.items():
        for p in parts:
            assert owner_map.owner(p) == bindings[m].endpoints

    # A third member joins: the first two keep what they can, the seq grows.
    bindings["m-c"] = AssignorBinding(topic, ep(2))
    before = dict(owned)
    owned = rebalance(bindings, cluster)
    check_partition({m: tuple(p) for m, p in owned.items()})
    assert set(owned["m-a"]) <= set(before["m-a"])
    assert set(owned["m-b"]) <= set(before["m-b"])
    assert bindings["m-c"].received_map is not None
    assert bindings["m-c"].received_map.seq == 2

    # The topic is unknown to the leader: nobody owns anything, nothing breaks.
    rebalance(bindings, FakeCluster({}))
    assert all(b.claim_owned == () for b in bindings.values())


def test_bound_assignors_are_distinct_classes_with_one_name() -> None:
    a = bound_assignor(AssignorBinding("t", ep(0)))
    b = bound_assignor(AssignorBinding("t", ep(1)))
    assert a is not b
    assert a.name == b.name == ASSIGNOR_NAME
    meta_a = ConsumerProtocolMemberMetadata.decode(a.metadata(["t"]).encode())
    claim = decode_member_metadata(meta_a.user_data)
    assert claim == MemberClaim(ep(0), 0, ())
    assert Counter(meta_a.subscription) == Counter(["t"])


# --- the ownership state machine, driven the way aiokafka's coordinator drives it ------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def joined_member(clock: FakeClock) -> ShardOwnership:
    """A ShardOwnership as if start() had run, with the heartbeat probe in place."""
    ownership = ShardOwnership(
        "127.0.0.1:9",
        "g",
        "ws://a:1",
        topic="t",
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        clock=clock,
    )
    ownership._running = True
    ownership._probe = True
    return ownership


def deliver(ownership: ShardOwnership, parts: list[int], others: Mapping[str, list[int]]) -> None:
    """SyncGroup's answer: the binding sees the assignment, then the listener."""
    assignment = {"me": parts, **others}
    endpoints = {"me": ownership.endpoints, **{m: ep(i) for i, m in enumerate(others)}}
    seq = (ownership.assignment_seq or 0) + 1
    owner_map = OwnerMap.from_assignment(seq, 8, assignment, endpoints)
    wire = ConsumerProtocolMemberAssignment(1, [("t", parts)], encode_owner_map(owner_map))
    ownership._binding.on_assignment(wire)
    ownership._group_assigned({TopicPartition("t", p) for p in parts})


def drain(ownership: ShardOwnership) -> list[tuple[str, frozenset[int]] | None]:
    out = []
    while not ownership._events.empty():
        out.append(ownership._events.get_nowait())
    return out


def test_ownership_flips_at_rebalance_boundaries_only() -> None:
    clock = FakeClock()
    o = joined_member(clock)
    assert not o.owns(0) and o.owner_endpoint(0) is None  # before the first assignment

    deliver(o, [0, 1, 2, 3], {"other": [4, 5, 6, 7]})
    assert o.owned == {0, 1, 2, 3}
    assert o.owner_endpoint(5) == ep(0).endpoint
    assert o.owner_endpoint(1) == "ws://a:1"
    assert drain(o) == [("assigned", frozenset({0, 1, 2, 3}))]

    o._group_revoked()  # a rebalance starts: nothing is owned until it ends
    assert o.rebalancing and o.owned == frozenset()
    assert o.owner_endpoint(1) == "ws://a:1"  # the last map still answers REDIRECT hints
    assert drain(o) == []

    deliver(o, [0, 1, 6], {"other": [2, 3, 4, 5, 7]})
    assert o.owned == {0, 1, 6}
    assert drain(o) == [("revoked", frozenset({2, 3})), ("assigned", frozenset({6}))]
    assert o._binding.claim_owned == (0, 1, 6)  # claimed at the next join (stickiness)


def test_the_lease_lapses_without_heartbeats_and_recovers_with_them() -> None:
    clock = FakeClock()
    o = joined_member(clock)
    deliver(o, [0, 1], {"other": list(range(2, 8))})
    drain(o)
    clock.now += 4.9  # session 6 s minus the 1 s margin
    o._check_lease()
    assert o.owned == {0, 1}
    clock.now += 0.2
    assert o.owned == frozenset()  # owns() needs no watchdog tick
    o._check_lease()
    assert drain(o) == [("revoked", frozenset({0, 1}))]

    o._lease.renew(clock.now)  # a heartbeat got through after all: still a member
    o._check_lease()
    assert o.owned == {0, 1}
    assert drain(o) == [("assigned", frozenset({0, 1}))]

    clock.now += 10
    o._check_lease()
    assert drain(o) == [("revoked", frozenset({0, 1}))]
    deliver(o, [1, 2], {"other": [0, *range(3, 8)]})  # rejoined: announced from scratch
    assert drain(o) == [("assigned", frozenset({1, 2}))]


def test_no_lease_fencing_while_a_rebalance_runs() -> None:
    """The broker keeps a member alive while its JoinGroup is pending, so no KICK then."""
    clock = FakeClock()
    o = joined_member(clock)
    deliver(o, [0, 1], {"other": list(range(2, 8))})
    drain(o)
    o._group_revoked()
    clock.now += 30
    o._check_lease()
    assert drain(o) == []
    deliver(o, [0, 1], {"other": list(range(2, 8))})
    assert o.owned == {0, 1}
    assert drain(o) == []
