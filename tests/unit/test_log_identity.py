"""17.2: a checkpoint bound to (cluster id, topic id, partition count) fails closed elsewhere."""

from __future__ import annotations

import msgspec

from qim.schemas.log_identity import LogIdentity, identity_mismatch

LIVE = LogIdentity("cluster-a", "0f" * 16, 16)


def test_the_same_log_is_accepted() -> None:
    assert identity_mismatch(LogIdentity("cluster-a", "0f" * 16, 16), LIVE) is None


def test_every_difference_and_a_missing_identity_is_refused() -> None:
    cases = {
        "no log identity": None,
        "cluster id changed": msgspec.structs.replace(LIVE, cluster_id="cluster-b"),
        "topic recreated": msgspec.structs.replace(LIVE, topic_id="10" * 16),
        "partition count changed": msgspec.structs.replace(LIVE, partition_count=32),
    }
    for expected, stored in cases.items():
        reason = identity_mismatch(stored, LIVE)
        assert reason is not None and expected in reason


def test_a_broker_without_topic_ids_is_refused() -> None:
    zero = msgspec.structs.replace(LIVE, topic_id="0" * 32)
    reason = identity_mismatch(zero, zero)
    assert reason is not None and "KIP-516" in reason


def test_identity_round_trips_through_msgpack() -> None:
    data = msgspec.msgpack.encode(LIVE)
    assert msgspec.msgpack.decode(data, type=LogIdentity) == LIVE
