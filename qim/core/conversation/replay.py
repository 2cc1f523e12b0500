"""Rebuild a writer partition's state from the outbox: the recovery path and the audit tool.

Recovery is ``restore(latest snapshot)`` (or an empty state) followed by ``apply`` of every outbox
record after it, the same ``apply`` the live path calls, so the rebuilt state is the live one
(style.md item 8: the replay audit is this function, compared byte for byte via ``snapshot()``).
Records are given as decoded structs or as the raw outbox values.
"""

from __future__ import annotations

from collections.abc import Iterable

from qim.core.conversation.config import WriterConfig
from qim.core.conversation.writer import ConversationWriterState
from qim.schemas.records.outbox import OutboxRecord, decode_outbox_record

__all__ = ["replay"]


def replay(
    records: Iterable[OutboxRecord | bytes],
    config: WriterConfig,
    *,
    region_id: int,
    writer_id: int,
    fencing_epoch: int = 0,
    snapshot: bytes | None = None,
) -> ConversationWriterState:
    """The state after ``records`` (in log order) on top of ``snapshot`` (or empty)."""
    if snapshot is None:
        state = ConversationWriterState(
            config, region_id=region_id, writer_id=writer_id, fencing_epoch=fencing_epoch
        )
    else:
        state = ConversationWriterState.restore(
            snapshot, config, region_id=region_id, writer_id=writer_id, fencing_epoch=fencing_epoch
        )
    for record in records:
        state.apply(decode_outbox_record(record) if isinstance(record, bytes) else record)
    return state
