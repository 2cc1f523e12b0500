"""qim.streams.txn_retries: CONCURRENT_TRANSACTIONS answers reach the listeners, the backoff
knob is the one aiokafka's handler returns, and other answers are not counted."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from aiokafka.errors import ConcurrentTransactions
from aiokafka.producer import sender as aiokafka_sender
from aiokafka.structs import TopicPartition

from qim.streams import txn_retries

CODE = ConcurrentTransactions.errno


class _TxnManager:
    def __init__(self, transactional_id: str) -> None:
        self.transactional_id = transactional_id
        self.txn_partitions: set[TopicPartition] = set()
        self.added: list[TopicPartition] = []

    def partition_added(self, tp: TopicPartition) -> None:
        self.added.append(tp)


def _handler(transactional_id: str) -> aiokafka_sender.AddPartitionsToTxnHandler:
    sender = SimpleNamespace(_retry_backoff=0.1, _txn_manager=_TxnManager(transactional_id))
    return aiokafka_sender.AddPartitionsToTxnHandler(sender, [TopicPartition("t", 0)])


@pytest.fixture
def seen() -> Iterator[list[tuple[str, str]]]:
    calls: list[tuple[str, str]] = []

    def listener(txn_id: str, kind: str) -> None:
        calls.append((txn_id, kind))

    before = aiokafka_sender.BACKOFF_OVERRIDE
    txn_retries.add_listener(listener)
    try:
        yield calls
    finally:
        txn_retries.remove_listener(listener)
        aiokafka_sender.BACKOFF_OVERRIDE = before


def test_a_refused_add_partitions_is_reported_and_retried_after_the_set_backoff(
    seen: list[tuple[str, str]],
) -> None:
    txn_retries.set_retry_backoff_ms(5)
    backoff = _handler("qim-conversation-writer-3").handle_response(
        SimpleNamespace(errors=[("t", [(0, CODE)])])
    )
    assert backoff == pytest.approx(0.005)
    assert seen == [("qim-conversation-writer-3", "add_partitions")]


def test_an_accepted_add_partitions_is_not_counted(seen: list[tuple[str, str]]) -> None:
    handler = _handler("qim-conversation-writer-0")
    assert handler.handle_response(SimpleNamespace(errors=[("t", [(0, 0)])])) is None
    assert seen == []
    assert handler._sender._txn_manager.added == [TopicPartition("t", 0)]


def test_install_is_idempotent(seen: list[tuple[str, str]]) -> None:
    txn_retries.install()
    txn_retries.install()
    _handler("x").handle_response(SimpleNamespace(errors=[("t", [(0, CODE)])]))
    assert seen == [("x", "add_partitions")]  # one wrapper, one report


def test_end_txn_answers_are_read_by_their_error_code() -> None:
    assert txn_retries._refused(SimpleNamespace(error_code=CODE))
    assert not txn_retries._refused(SimpleNamespace(error_code=0))


def test_a_negative_backoff_is_refused() -> None:
    with pytest.raises(ValueError):
        txn_retries.set_retry_backoff_ms(-1)
