"""17.2 for the MailboxNode: a shard store is bound to the dispatch log it was folded from."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from qim.agents.mailbox.takeover import IDENTITY_KEY, bind_identity
from qim.schemas.log_identity import LogIdentity, LogIdentityMismatch
from qim.tables.mailbox_store import MailboxStore

LIVE = LogIdentity("cluster", "ab" * 16, 64)


def test_an_empty_store_is_bound_and_then_accepted(tmp_path: Path) -> None:
    store = MailboxStore(tmp_path / "s")
    try:
        bind_identity(store, LIVE)
        assert msgspec.msgpack.decode(store.get(IDENTITY_KEY) or b"", type=LogIdentity) == LIVE
        store.apply([(b"E-entry", b"v")])
        bind_identity(store, LIVE)  # the same log: fine
    finally:
        store.close()


@pytest.mark.parametrize(
    "live",
    [
        msgspec.structs.replace(LIVE, topic_id="cd" * 16),  # the topic was recreated
        msgspec.structs.replace(LIVE, cluster_id="other"),
        msgspec.structs.replace(LIVE, partition_count=128),
    ],
)
def test_a_store_of_another_log_is_refused(tmp_path: Path, live: LogIdentity) -> None:
    store = MailboxStore(tmp_path / "s")
    try:
        bind_identity(store, LIVE)
        store.apply([(b"E-entry", b"v")])
        with pytest.raises(LogIdentityMismatch):
            bind_identity(store, live)
    finally:
        store.close()


def test_a_non_empty_store_without_a_binding_is_refused(tmp_path: Path) -> None:
    store = MailboxStore(tmp_path / "s")
    try:
        store.apply([(b"E-entry", b"v")])
        with pytest.raises(LogIdentityMismatch, match="no log identity"):
            bind_identity(store, LIVE)
        assert store.get(IDENTITY_KEY) is None  # nothing written on refusal
    finally:
        store.close()
