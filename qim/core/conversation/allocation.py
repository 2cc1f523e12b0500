"""Allocation of message_id / conversation_seq / last_activity_id in one step (spec 6.2-6.4).

Pure: the writer's persisted clock state is the highest id it has applied, the sequence position
is the committed head, and the wall clock is an argument. The function returns coordinates and
changes nothing; they take effect when the record carrying them is applied.
"""

from __future__ import annotations

from dataclasses import dataclass

from qim.schemas.ids import (
    MAX_SEQ_IN_MS,
    HlcClock,
    HlcState,
    hlc_ms_to_unix_ms,
    message_id_to_bytes,
    split_message_id,
    unix_ms_to_hlc_ms,
)

__all__ = ["Coordinates", "allocate", "clock_state"]


@dataclass(frozen=True, slots=True)
class Coordinates:
    """The allocation of one committed event; ``committed_at`` is its HLC time in Unix ms.

    ``conversation_seq`` 0 means an activity without a seq (spec 6.4: join, create).
    """

    message_id: bytes
    conversation_seq: int
    last_activity_id: bytes
    committed_at: int


def clock_state(max_id: int, region_id: int, writer_id: int) -> HlcState:
    """The HLC restored from the highest applied id (spec 6.2: before any assignment).

    The next id must sort above every applied one. If the highest is ours, the clock resumes at
    its exact ``seq_in_ms``; if it is another writer's (a former owner with another writer_id),
    that millisecond counts as exhausted and the next id takes the next ms. Keeping the id rather
    than a clock makes the writer's state independent of the incarnation that rebuilds it.
    """
    parts = split_message_id(max_id)
    own = (parts.region_id, parts.writer_id) == (region_id, writer_id)
    return HlcState(parts.hlc_ms, parts.seq_in_ms if own else MAX_SEQ_IN_MS)


def allocate(
    max_id: int,
    latest_conversation_seq: int,
    now_ms: int,
    *,
    region_id: int,
    writer_id: int,
    clock_regression_reject_ms: int,
    advance_seq: bool = True,
) -> Coordinates:
    """The next coordinates at wall time ``now_ms`` (Unix ms); raises ``ClockUnsafeError``.

    ``last_activity_id`` is the message_id: same format and ID space (spec 6.4), and for a
    message the message *is* the activity; both are strictly co-ordered with the seq.
    """
    last = clock_state(max_id, region_id, writer_id)
    clock = HlcClock.restore(
        last.last_hlc_ms,
        region_id,
        writer_id,
        seq_in_ms=last.seq_in_ms,
        clock_regression_reject_ms=clock_regression_reject_ms,
    )
    id_bytes = message_id_to_bytes(clock.assign(unix_ms_to_hlc_ms(now_ms)))
    return Coordinates(
        message_id=id_bytes,
        conversation_seq=latest_conversation_seq + 1 if advance_seq else 0,
        last_activity_id=id_bytes,
        committed_at=hlc_ms_to_unix_ms(clock.last_hlc_ms),
    )
