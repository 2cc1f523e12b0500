"""The group assignor of the MailboxNodes: partition p of every topic goes to the same member.

Why a custom assignor: the node subscribes to the dispatch log *and* to user-requests, and
owning MailboxShard s means owning dispatch partition s; the reads of shard s must reach the
same node (direction.md 4.1: "reads go to the owner through the same assignment"). Kafka's
range assignor lines partitions up per topic, but only while every topic's metadata is present
and partition counts match; here the shard number is the unit: shard numbers are dealt out in
contiguous ranges over the members (sorted, so every member computes the same answer), and a
member receives partition s of *each* topic it subscribes to that has one. That includes
``qim.presence``: owning shard s gives its presence partition s too (the push cache, 5.4.2).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

__all__ = ["ShardAssignor", "deal_shards"]


def deal_shards(shards: Iterable[int], members: Iterable[str]) -> dict[str, list[int]]:
    """Contiguous ranges of the sorted shard numbers over the sorted members."""
    numbers = sorted(set(shards))
    names = sorted(set(members))
    out: dict[str, list[int]] = {name: [] for name in names}
    if not names:
        return out
    per, extra = divmod(len(numbers), len(names))
    start = 0
    for i, name in enumerate(names):
        length = per + (1 if i < extra else 0)
        out[name] = numbers[start : start + length]
        start += length
    return out


class ShardAssignor(AbstractPartitionAssignor):  # type: ignore[misc]  # aiokafka is untyped
    """``partition_assignment_strategy`` of the MailboxNode consumer (see the module doc)."""

    name = "qim-shard"
    version = 0

    @classmethod
    def assign(
        cls, cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        partitions: dict[str, set[int]] = {}
        for metadata in members.values():
            for topic in metadata.subscription:
                if topic not in partitions:
                    partitions[topic] = set(cluster.partitions_for_topic(topic) or ())
        shards = set().union(*partitions.values()) if partitions else set()
        dealt = deal_shards(shards, members)
        out = {}
        for member, metadata in members.items():
            mine = set(dealt.get(member, ()))
            topics = [
                (topic, sorted(mine & partitions[topic])) for topic in sorted(metadata.subscription)
            ]
            out[member] = ConsumerProtocolMemberAssignment(cls.version, topics, b"")
        return out

    @classmethod
    def metadata(cls, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        return ConsumerProtocolMemberMetadata(cls.version, sorted(topics), b"")

    @classmethod
    def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
        pass
