"""The MailboxNode assignor puts partition s of every subscribed topic on one member.

Direction.md 4.1: owning MailboxShard s is owning dispatch partition s, and the reads of shard s
must reach that same node; shards are dealt in balanced contiguous ranges, deterministically.
"""

from __future__ import annotations

from typing import Any

from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

from qim.agents.mailbox.assignor import ShardAssignor, deal_shards


class Cluster:
    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        count = self.counts.get(topic)
        return None if count is None else set(range(count))


def _assign(counts: dict[str, int], members: list[str]) -> dict[str, dict[str, list[int]]]:
    topics = ["qim.dispatch", "qim.user-requests"]
    meta = {m: ShardAssignor.metadata(topics) for m in members}
    out: dict[str, Any] = ShardAssignor.assign(Cluster(counts), meta)
    return {m: dict(a.assignment) for m, a in out.items()}


def test_deal_shards_is_balanced_contiguous_and_order_independent() -> None:
    dealt = deal_shards(range(64), ["c", "a", "b"])
    assert [len(dealt[m]) for m in ("a", "b", "c")] == [22, 21, 21]
    assert dealt["a"] == list(range(22)) and dealt["c"] == list(range(43, 64))
    assert deal_shards(reversed(range(64)), ["b", "c", "a"]) == dealt
    assert deal_shards(range(4), []) == {}


def test_partition_s_of_both_topics_goes_to_the_same_member() -> None:
    result = _assign({"qim.dispatch": 64, "qim.user-requests": 64}, ["m2", "m1", "m3"])
    seen: set[int] = set()
    for topics in result.values():
        assert topics["qim.dispatch"] == topics["qim.user-requests"]
        seen |= set(topics["qim.dispatch"])
    assert seen == set(range(64))


def test_a_topic_without_metadata_yet_gets_nothing_and_the_other_is_still_dealt() -> None:
    result = _assign({"qim.dispatch": 8}, ["m1", "m2"])
    assert result["m1"] == {"qim.dispatch": [0, 1, 2, 3], "qim.user-requests": []}
    assert result["m2"]["qim.dispatch"] == [4, 5, 6, 7]


def test_metadata_lists_the_subscription() -> None:
    meta = ShardAssignor.metadata({"b", "a"})
    assert isinstance(meta, ConsumerProtocolMemberMetadata)
    assert list(meta.subscription) == ["a", "b"]
