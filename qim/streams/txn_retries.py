"""CONCURRENT_TRANSACTIONS answers of the transaction coordinator, counted (issue 13).

After EndTxn the coordinator writes the transaction's markers asynchronously; a producer that
begins its next transaction before they are written gets CONCURRENT_TRANSACTIONS for its first
AddPartitionsToTxn (or AddOffsetsToTxn) and aiokafka retries after ``BACKOFF_OVERRIDE`` (20 ms)
-- or after ``retry_backoff_ms`` (100 ms) once the transaction already holds a partition. Each
retry is a wasted round trip and a wait that lands on SEND_ACK, so it is measured, not guessed.

aiokafka has no hook for it: :func:`install` wraps the ``handle_response`` of its coordinator
request handlers once per process and reports every CONCURRENT_TRANSACTIONS answer to the
registered listeners with the producer's ``transactional_id`` and the request kind
(``add_partitions``, ``add_offsets``, ``end_txn``). The wrapped methods behave exactly as before.

:func:`set_retry_backoff_ms` sets aiokafka's ``BACKOFF_OVERRIDE`` (the wait before retrying the
first AddPartitionsToTxn of a transaction refused with CONCURRENT_TRANSACTIONS), process-wide.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Final

from aiokafka.errors import ConcurrentTransactions
from aiokafka.producer import sender as _sender

__all__ = ["Listener", "add_listener", "install", "remove_listener", "set_retry_backoff_ms"]

Listener = Callable[[str, str], None]
"""Called with ``(transactional_id, kind)`` for every CONCURRENT_TRANSACTIONS answer."""

_CODE: Final = ConcurrentTransactions.errno
_KINDS: Final = {
    "AddPartitionsToTxnHandler": "add_partitions",
    "AddOffsetsToTxnHandler": "add_offsets",
    "EndTxnHandler": "end_txn",
}
_listeners: list[Listener] = []
_installed = False


def _refused(resp: Any) -> bool:
    """Whether a coordinator response carries CONCURRENT_TRANSACTIONS."""
    code = getattr(resp, "error_code", None)
    if code is not None:
        return bool(code == _CODE)
    for _topic, partitions in getattr(resp, "errors", ()):  # AddPartitionsToTxn: per partition
        for _partition, error_code in partitions:
            if error_code == _CODE:
                return True
    return False


def _wrap(cls: Any, kind: str) -> None:
    original = cls.handle_response

    @functools.wraps(original)
    def handle_response(self: Any, resp: Any) -> Any:
        if _listeners and _refused(resp):
            txn_id = self._sender._txn_manager.transactional_id or ""
            for listener in list(_listeners):
                listener(txn_id, kind)
        return original(self, resp)

    cls.handle_response = handle_response


def install() -> None:
    """Wrap aiokafka's coordinator handlers (idempotent, once per process)."""
    global _installed
    if _installed:
        return
    for name, kind in _KINDS.items():
        _wrap(getattr(_sender, name), kind)
    _installed = True


def add_listener(listener: Listener) -> None:
    install()
    _listeners.append(listener)


def remove_listener(listener: Listener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def set_retry_backoff_ms(ms: int) -> None:
    """aiokafka's wait before retrying a transaction's first AddPartitionsToTxn after
    CONCURRENT_TRANSACTIONS (its default: 20 ms)."""
    if ms < 0:
        raise ValueError("the CONCURRENT_TRANSACTIONS retry backoff must be >= 0 ms")
    _sender.BACKOFF_OVERRIDE = ms / 1000
