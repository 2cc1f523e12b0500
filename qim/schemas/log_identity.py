"""The identity of a log that a checkpoint of positions is bound to (spec 17.2, I19).

Why: a position (an outbox offset in a writer checkpoint, a dispatch offset behind ``W[lane]``)
means something only on the log it was read from. A topic deleted and recreated under the same
name, another cluster, or a changed partition count silently re-numbers every offset. Binding a
checkpoint to ``(cluster_id, topic_id, partition_count)`` and refusing on any difference -- or
on a checkpoint with no identity at all -- is the spec's "fail closed".
"""

from __future__ import annotations

import msgspec

__all__ = ["LogIdentity", "LogIdentityMismatch", "identity_mismatch"]


class LogIdentity(msgspec.Struct, frozen=True, array_like=True):
    """One topic's identity: KIP-516 topic id (hex), the cluster id, the partition count."""

    cluster_id: str
    topic_id: str
    partition_count: int


class LogIdentityMismatch(RuntimeError):
    """A checkpoint is bound to another log than the live one: refuse to restore from it."""


def identity_mismatch(stored: LogIdentity | None, live: LogIdentity) -> str | None:
    """Why ``stored`` may not be used on ``live`` (None: same log)."""
    if stored is None or not stored.cluster_id or not stored.topic_id:
        return "checkpoint has no log identity"
    if not live.cluster_id or not live.topic_id or live.topic_id == "0" * 32:
        return "the broker reports no cluster id or topic id (KIP-516 required)"
    if stored.cluster_id != live.cluster_id:
        return f"cluster id changed: {stored.cluster_id} -> {live.cluster_id}"
    if stored.topic_id != live.topic_id:
        return f"topic recreated: topic id {stored.topic_id} -> {live.topic_id}"
    if stored.partition_count != live.partition_count:
        return f"partition count changed: {stored.partition_count} -> {live.partition_count}"
    return None
