"""A mailbox checkpoint reopens as a store with exactly the checkpointed rows."""

from __future__ import annotations

from pathlib import Path

from qim.tables.mailbox_checkpoint import create_checkpoint
from qim.tables.mailbox_store import MailboxStore


def test_checkpoint_reopens_with_the_rows_written_before_it_and_none_after(tmp_path: Path) -> None:
    store = MailboxStore(tmp_path / "live")
    store.apply([(b"a", b"1"), (b"b", b"2")])
    create_checkpoint(store, tmp_path / "ckpt")
    store.apply([(b"c", b"3")])
    store.close()
    restored = MailboxStore(tmp_path / "ckpt")
    try:
        assert list(restored.items()) == [(b"a", b"1"), (b"b", b"2")]
    finally:
        restored.close()
