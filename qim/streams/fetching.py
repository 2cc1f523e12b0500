"""How the hot-path consumers fetch: one place, so every hop batches the same way.

Why (issue 13): with Kafka's default ``fetch_min_bytes`` = 1 the broker answers a fetch as soon
as any record arrives, so under steady traffic every consumer re-fetches as fast as it can parse
a response: the cost is per fetch round (hundreds of partition entries encoded, walked by the
broker and parsed in pure Python), not per record, and it saturates the machine at any rate.
A minimum of a few KiB with a short ``fetch_max_wait_ms`` bounds the rounds per consumer to
about ``1000 / fetch_max_wait_ms`` per second and lets each round carry many records, at the
price of at most ``fetch_max_wait_ms`` per hop while traffic is light.

``QIM_FETCH_MIN_BYTES`` and ``QIM_FETCH_MAX_WAIT_MS`` override the defaults (measured in
``bench/README.md``); both are read once per consumer created.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

from aiokafka import AIOKafkaConsumer, TopicPartition

FETCH_MIN_BYTES: Final = 1
FETCH_MAX_WAIT_MS: Final = 100


def hot_fetch(env: Mapping[str, str] | None = None) -> dict[str, int]:
    """The ``fetch_min_bytes`` / ``fetch_max_wait_ms`` keyword arguments of a hot consumer."""
    environ = os.environ if env is None else env
    min_bytes = int(environ.get("QIM_FETCH_MIN_BYTES", FETCH_MIN_BYTES))
    max_wait = int(environ.get("QIM_FETCH_MAX_WAIT_MS", FETCH_MAX_WAIT_MS))
    if min_bytes < 1 or max_wait < 0:
        raise ValueError("QIM_FETCH_MIN_BYTES must be >= 1 and QIM_FETCH_MAX_WAIT_MS >= 0")
    return {"fetch_min_bytes": min_bytes, "fetch_max_wait_ms": max_wait}


async def start_follower(
    bootstrap: str, client_id: str, tps: list[TopicPartition], *, fetch_max_wait_ms: int
) -> AIOKafkaConsumer:
    """A started consumer outside any group, assigned ``tps`` and at their beginning: how a
    process folds a small compacted topic (keys, quotas, room definitions) whole, then
    follows it."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        metadata_max_age_ms=5000,
        fetch_max_wait_ms=fetch_max_wait_ms,
    )
    await consumer.start()
    consumer.assign(tps)
    await consumer.seek_to_beginning(*tps)
    return consumer
