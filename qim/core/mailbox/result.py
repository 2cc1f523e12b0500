"""What one ``materialize`` call hands the shell: the WriteBatch and what it publishes.

Kept apart from the fold so the agent, the push path and the tests can name the result types
without importing the fold's internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from qim.core.mailbox.ports import Op
from qim.core.mailbox.sessions import SessionChange
from qim.schemas.records.dispatch import GroupDispatch

__all__ = ["FIRST_SHARD_EPOCH", "METRICS", "MaterializeResult", "PendingDispatch", "WrittenGroup"]

FIRST_SHARD_EPOCH: Final = 1
"""Epochs start at 1 so every mailbox_seq is > 0: 0 means "nothing" to a cursor (``after_seq
= 0``, 9.6.1) and to W, so an entry at seq 0 could never be pulled."""

METRICS: Final = (
    "dispatch_duplicate_suppressed_total",
    "dispatch_invalid_total",
    "dispatch_misrouted_total",
    "dispatch_pending_slice_total",
    "dispatch_record_replayed_total",
    "dispatch_slice_resolved_total",
    "lane_watermark_regression_total",
    "mailbox_entries_expired_total",
    "mailbox_entries_written_total",
    "mailbox_entry_cap_evicted_total",
    "member_slice_chunks_total",
    "member_slice_invalid_total",
    "reaction_summary_applied_total",
    "stale_epoch_dispatch_dropped_total",
    "unknown_record_total",
)
"""Counters of a result; spec names where the spec has one (7.8, 18.3.3, 24)."""


@dataclass(frozen=True, slots=True)
class PendingDispatch:
    """A group dispatch waiting for its member slice, held at its mailbox_seq."""

    mailbox_seq: int
    dispatch: GroupDispatch

    @property
    def slice_key(self) -> tuple[str, str, int]:
        d = self.dispatch
        return d.tenant_id, d.conversation_id, d.membership_version


@dataclass(frozen=True, slots=True)
class WrittenGroup:
    """One user's event group written by this batch (the push path's input)."""

    tenant_id: str
    user_id: str
    lane: int
    mailbox_seq: int
    entries: int


@dataclass(frozen=True, slots=True)
class MaterializeResult:
    """The WriteBatch and, once it is committed, the watermarks to publish.

    ``pending`` non-empty means a dispatch waits for its slice: alert if it stays so (the
    lanes it may touch are held below it). ``metrics`` has every name of :data:`METRICS`.
    """

    ops: tuple[Op, ...]
    watermarks: tuple[int, ...]
    watermark_floor: tuple[int, ...]
    applied_seq: int
    pending: tuple[PendingDispatch, ...]
    written: tuple[WrittenGroup, ...]
    metrics: dict[str, int] = field(default_factory=dict)
    cap_evicted: dict[str, int] = field(default_factory=dict)
    """``mailbox_entry_cap_evicted_total`` by tenant (26.1.6 asks for ``{tenant}``)."""
    sessions: tuple[SessionChange, ...] = ()
    """Per user: the session rows, badge and read watermarks the batch changed (deltas)."""
