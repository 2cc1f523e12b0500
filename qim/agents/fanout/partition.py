"""One outbox partition of the FanoutCoordinator: the core's state plus what the shell must track.

Pure (no I/O): the service feeds fetched ``(offset, value)`` pairs in log order and produces what
:meth:`PartitionFanout.feed` returns; recovery feeds the same function with ``live=False`` and
throws the output away (style item 3: one code path, live and in replay). What this adds to
:class:`~qim.core.fanout.FanoutState`:

* **Held records.** A :class:`~qim.core.fanout.NotReady` (the pinned membership version is not
  known yet, or a membership change does not follow the group's version) changes nothing in the
  state. The record is held -- never skipped -- and the partition's commit offset stops at it,
  so a restart reads it again. Later records keep flowing (ADR-0017 allows reordering inside a
  shard; dispatch ids make duplicates harmless), and every held record is retried right after a
  membership record was applied: the state is a pure function of the records applied, so a
  membership record is the only thing that can change the answer, and retrying on a timer
  would only repeat it.
* **Stall.** A record the core refuses as not ours (undecodable, ``MembershipLogError``,
  ``FanoutLogError``, ``EventGroupOverflow``) stops the partition there: the membership replica
  must not run on with a gap (``qim.core.membership.errors``: stop, not skip). Nothing after it
  is applied and the commit offset stays at it; the service logs it and pauses the partition.
* **Offsets.** ``next_offset`` skips redelivered records (a seek back after a rebalance);
  :attr:`PartitionFanout.commit_offset` is the first record whose dispatches are not all out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from qim.core.fanout import EventGroupOverflow, FanoutLogError, FanoutState, NotReady
from qim.core.membership import MembershipLogError
from qim.schemas.records import (
    DispatchLogRecord,
    MembershipCommitted,
    OutboxRecord,
    decode_outbox_record,
)

__all__ = ["Fed", "Held", "PartitionFanout", "Stall"]

_REFUSED = (msgspec.DecodeError, MembershipLogError, FanoutLogError, EventGroupOverflow)


@dataclass(frozen=True, slots=True)
class Held:
    """A record waiting for its membership version; ``blocks_commit`` is False for one held
    during a replay, which the group's committed offset already passed."""

    offset: int
    record: OutboxRecord
    reason: NotReady
    blocks_commit: bool


@dataclass(frozen=True, slots=True)
class Stall:
    """The record the partition stopped at, and why."""

    offset: int
    reason: str


@dataclass(slots=True)
class Fed:
    """What one :meth:`PartitionFanout.feed` did (dispatches only when live)."""

    dispatches: list[DispatchLogRecord] = field(default_factory=list)
    sent: list[tuple[OutboxRecord, int]] = field(default_factory=list)
    """Each record that went out (fresh or released from hold) with its dispatch count."""
    held: list[NotReady] = field(default_factory=list)
    """Records newly held by this feed (a retry that is still not ready is not repeated)."""
    released: int = 0
    stalled: Stall | None = None
    """Set when this feed stalled the partition."""


class PartitionFanout:
    """The FanoutCoordinator state of one outbox partition (module docstring)."""

    def __init__(self, partition: int, state: FanoutState, next_offset: int) -> None:
        self.partition = partition
        self.state = state
        self.next_offset = next_offset
        """The first offset not yet applied; anything below it is a redelivery."""
        self.held: list[Held] = []
        self.stalled: Stall | None = None

    @property
    def commit_offset(self) -> int:
        """The offset a commit may name: every record below it has all its dispatches out."""
        firsts = [h.offset for h in self.held if h.blocks_commit]
        if self.stalled is not None:
            firsts.append(self.stalled.offset)
        return min(firsts, default=self.next_offset)

    @property
    def blocking(self) -> int:
        """Held records that keep the commit offset back."""
        return sum(1 for h in self.held if h.blocks_commit)

    def seen_up_to(self, position: int) -> None:
        """The consumer's position passed everything below ``position`` (fed records, and the
        transaction markers and aborted records read_committed skips): move ``next_offset`` up
        so a caught-up partition commits its log end, not the offset of a marker."""
        self.next_offset = max(self.next_offset, position)

    def feed(self, records: Iterable[tuple[int, bytes]], *, live: bool) -> Fed:
        """Apply ``(offset, value)`` pairs in log order; live output is to be produced in order."""
        fed = Fed()
        for offset, value in records:
            if self.stalled is not None:
                break
            if offset < self.next_offset:
                continue
            self.next_offset = offset + 1
            try:
                record = decode_outbox_record(value)
                out = self.state.apply_outbox(record)
            except _REFUSED as exc:
                if live:
                    self.stalled = fed.stalled = Stall(offset, repr(exc))
                    break
                continue  # replay: the group already committed past it
            if isinstance(out, NotReady):
                self.held.append(Held(offset, record, out, blocks_commit=live))
                fed.held.append(out)
                continue
            self._emit(fed, record, out, live)
            if isinstance(record, MembershipCommitted) and self.held:
                self._retry(fed, live)
        return fed

    def end_replay(self) -> list[Held]:
        """After a replay: drop what it left held (already committed past); returns them."""
        dropped = [h for h in self.held if not h.blocks_commit]
        self.held = [h for h in self.held if h.blocks_commit]
        return dropped

    def _emit(
        self, fed: Fed, record: OutboxRecord, out: list[DispatchLogRecord], live: bool
    ) -> None:
        if live:
            fed.dispatches.extend(out)
            fed.sent.append((record, len(out)))

    def _retry(self, fed: Fed, live: bool) -> None:
        """Retry held records in log order until a pass releases nothing."""
        progress = True
        while progress and self.held:
            progress = False
            waiting: list[Held] = []
            for held in self.held:
                try:
                    out = self.state.apply_outbox(held.record)
                except _REFUSED as exc:  # pragma: no cover - it was not refused the first time
                    if live:
                        self.stalled = fed.stalled = Stall(held.offset, repr(exc))
                    continue
                if isinstance(out, NotReady):
                    waiting.append(held)
                    continue
                progress = True
                fed.released += 1
                # a record held in replay goes out again when live: a harmless duplicate
                self._emit(fed, held.record, out, live)
            self.held = waiting
