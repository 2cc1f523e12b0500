"""The transaction cut of ``QIM_WRITER_LINGER_MS`` / ``QIM_WRITER_MIN_BATCH``: what is gathered
into one transaction, and what a former owner's gather never commits.

The service is not started: no consumer (pausing is a no-op), and a stand-in partition that
records what it was asked to commit. Waits are on the stand-in's own events, never on time.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition

from qim.agents.writer.conversation_writer import ConversationWriterService
from qim.agents.writer.options import LINGER_MS, WriterOptions
from qim.params import Settings

TP = TopicPartition("qim.conversation-requests", 3)


def load(env: dict[str, str]) -> WriterOptions:
    return WriterOptions.load(
        Settings.load(env={}), env, bootstrap="127.0.0.1:1", datadir=Path("/nonexistent")
    )


class StandIn:
    """What ``_process`` needs of an ``OwnedPartition``: a lock, a partition, ``process``."""

    partition = TP.partition

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.batches: list[list[int]] = []
        self.processed = asyncio.Event()

    async def process(self, records: list[Any]) -> None:
        self.batches.append(list(records))
        self.processed.set()


def service(linger_ms: int, min_batch: int = 500) -> ConversationWriterService:
    options = dataclasses.replace(load({}), linger_ms=linger_ms, min_batch=min_batch)
    return ConversationWriterService(options)


def test_the_knobs_are_read_from_the_environment_and_default_to_off() -> None:
    assert (load({}).linger_ms, load({}).min_batch) == (LINGER_MS, 500)
    options = load({"QIM_WRITER_LINGER_MS": "7", "QIM_WRITER_MIN_BATCH": "20"})
    assert (options.linger_ms, options.min_batch) == (7, 20)
    with pytest.raises(ValueError, match="QIM_WRITER_MIN_BATCH"):
        load({"QIM_WRITER_MIN_BATCH": "0"})
    with pytest.raises(ValueError, match="QIM_WRITER_LINGER_MS"):
        load({"QIM_WRITER_LINGER_MS": "-1"})


async def test_without_linger_every_fetch_is_its_own_transaction() -> None:
    svc, owned = service(0), StandIn()
    svc._owned[TP.partition] = owned  # type: ignore[assignment]
    svc._dispatch(TP, [1, 2])
    await owned.processed.wait()
    owned.processed.clear()
    svc._dispatch(TP, [3])
    await owned.processed.wait()
    assert owned.batches == [[1, 2], [3]]


async def test_fetches_within_the_linger_are_one_transaction_in_log_order() -> None:
    svc, owned = service(60_000, min_batch=4), StandIn()
    svc._owned[TP.partition] = owned  # type: ignore[assignment]
    svc._dispatch(TP, [1])
    svc._dispatch(TP, [2, 3])
    assert owned.batches == []  # still gathering: neither the linger nor min_batch reached
    svc._dispatch(TP, [4])  # min_batch: the cut does not wait for the minute-long linger
    await owned.processed.wait()
    assert owned.batches == [[1, 2, 3, 4]]
    svc._dispatch(TP, [5, 6, 7, 8])  # the next gather, full at once
    owned.processed.clear()
    await owned.processed.wait()
    assert owned.batches == [[1, 2, 3, 4], [5, 6, 7, 8]]


async def test_a_gather_of_a_former_owner_commits_nothing_and_the_new_owner_starts_afresh() -> None:
    svc, former, current = service(60_000, min_batch=2), StandIn(), StandIn()
    svc._owned[TP.partition] = former  # type: ignore[assignment]
    svc._dispatch(TP, [1])
    stale = svc._gathering[TP.partition].task
    svc._owned[TP.partition] = current  # type: ignore[assignment]  # given up and restored
    svc._dispatch(TP, [1, 2])  # the restore sought back to the committed offset
    await current.processed.wait()
    assert stale is not None
    with pytest.raises(asyncio.CancelledError):
        await stale
    assert (former.batches, current.batches) == ([], [[1, 2]])


async def test_a_gather_below_min_batch_commits_when_the_linger_ends() -> None:
    svc, owned = service(1, min_batch=500), StandIn()
    svc._owned[TP.partition] = owned  # type: ignore[assignment]
    svc._dispatch(TP, [1])
    await owned.processed.wait()
    assert owned.batches == [[1]] and TP.partition not in svc._gathering


def test_the_txn_retry_backoff_is_read_from_the_environment_and_defaults_to_aiokafkas() -> None:
    assert load({}).txn_retry_backoff_ms is None
    assert load({"QIM_WRITER_TXN_RETRY_BACKOFF_MS": "4"}).txn_retry_backoff_ms == 4
    with pytest.raises(ValueError, match="QIM_WRITER_TXN_RETRY_BACKOFF_MS"):
        load({"QIM_WRITER_TXN_RETRY_BACKOFF_MS": "-1"})


def test_concurrent_transactions_are_counted_for_the_writers_producers_only() -> None:
    svc = service(0)
    svc._concurrent_transactions("qim-conversation-writer-2", "add_partitions")
    svc._concurrent_transactions("qim-conversation-writer-2", "add_partitions")
    svc._concurrent_transactions("qim-fanout-2", "add_partitions")  # another component's
    svc._concurrent_transactions("qim-conversation-writer-0", "end_txn")
    sample = svc.registry.get_sample_value
    name = "qim_writer_concurrent_transactions_total"
    assert sample(name, {"kind": "add_partitions"}) == 2
    assert sample(name, {"kind": "end_txn"}) == 1
