"""``message_id`` / ``last_activity_id``: u128 hybrid-logical-clock ids (spec §6.2, §6.4).

Layout (MSB first): ``hlc_ms(48) | region_id(12) | writer_id(20) | seq_in_ms(24) | reserved(24)``
with ``hlc_ms`` counted from 2020-01-01T00:00:00Z and ``reserved`` = 0. Encoded as 16 bytes
big-endian so stores may sort raw bytes (§6.1). The layout and epoch are immutable (§27.2.4).

The clock takes the wall time as an argument: this module performs no I/O, so the caller
(ConversationWriter) reads the clock and persists :attr:`HlcClock.last_hlc_ms`.
"""

from __future__ import annotations

from typing import Final, NamedTuple

__all__ = [
    "DEFAULT_CLOCK_REGRESSION_REJECT_MS",
    "HLC_EPOCH_UNIX_MS",
    "MAX_HLC_MS",
    "MAX_REGION_ID",
    "MAX_SEQ_IN_MS",
    "MAX_WRITER_ID",
    "MESSAGE_ID_SIZE",
    "ClockUnsafeError",
    "HlcClock",
    "HlcState",
    "MessageIdParts",
    "compose_last_activity_id",
    "compose_message_id",
    "hlc_ms_to_unix_ms",
    "message_id_from_bytes",
    "message_id_to_bytes",
    "split_last_activity_id",
    "split_message_id",
    "unix_ms_to_hlc_ms",
]

HLC_EPOCH_UNIX_MS: Final = 1_577_836_800_000  # 2020-01-01T00:00:00Z
MAX_HLC_MS: Final = (1 << 48) - 1
MAX_REGION_ID: Final = (1 << 12) - 1
MAX_WRITER_ID: Final = (1 << 20) - 1
MAX_SEQ_IN_MS: Final = (1 << 24) - 1
MESSAGE_ID_SIZE: Final = 16
DEFAULT_CLOCK_REGRESSION_REJECT_MS: Final = 5000  # App. B.2

_HLC_SHIFT: Final = 80
_REGION_SHIFT: Final = 68
_WRITER_SHIFT: Final = 48
_SEQ_SHIFT: Final = 24
_RESERVED_MASK: Final = (1 << 24) - 1
_U128_LIMIT: Final = 1 << 128


def _check_field(value: int, maximum: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int")
    if not 0 <= value <= maximum:
        raise ValueError(f"{name} must be in [0, {maximum}], got {value}")
    return value


class MessageIdParts(NamedTuple):
    """Decoded fields; ``reserved`` is surfaced, not rejected, so future shard bits stay legible."""

    hlc_ms: int
    region_id: int
    writer_id: int
    seq_in_ms: int
    reserved: int = 0


def compose_message_id(hlc_ms: int, region_id: int, writer_id: int, seq_in_ms: int) -> int:
    """Pack the §6.2 fields; reserved bits are always written as zero."""
    _check_field(hlc_ms, MAX_HLC_MS, "hlc_ms")
    _check_field(region_id, MAX_REGION_ID, "region_id")
    _check_field(writer_id, MAX_WRITER_ID, "writer_id")
    _check_field(seq_in_ms, MAX_SEQ_IN_MS, "seq_in_ms")
    return (
        (hlc_ms << _HLC_SHIFT)
        | (region_id << _REGION_SHIFT)
        | (writer_id << _WRITER_SHIFT)
        | (seq_in_ms << _SEQ_SHIFT)
    )


def split_message_id(message_id: int) -> MessageIdParts:
    """Unpack a u128 id into its §6.2 fields."""
    _check_field(message_id, _U128_LIMIT - 1, "message_id")
    return MessageIdParts(
        hlc_ms=message_id >> _HLC_SHIFT,
        region_id=(message_id >> _REGION_SHIFT) & MAX_REGION_ID,
        writer_id=(message_id >> _WRITER_SHIFT) & MAX_WRITER_ID,
        seq_in_ms=(message_id >> _SEQ_SHIFT) & MAX_SEQ_IN_MS,
        reserved=message_id & _RESERVED_MASK,
    )


def message_id_to_bytes(message_id: int) -> bytes:
    """16 bytes big-endian: raw byte order equals numeric order (§6.1)."""
    _check_field(message_id, _U128_LIMIT - 1, "message_id")
    return message_id.to_bytes(MESSAGE_ID_SIZE, "big")


def message_id_from_bytes(data: bytes) -> int:
    """Inverse of :func:`message_id_to_bytes`; any other length is a framing error."""
    if len(data) != MESSAGE_ID_SIZE:
        raise ValueError(f"message_id must be {MESSAGE_ID_SIZE} bytes, got {len(data)}")
    return int.from_bytes(data, "big")


# last_activity_id shares the message_id format and ID space (§6.4): the same functions apply,
# exported under their own names so call sites say which id they mean.
compose_last_activity_id = compose_message_id
split_last_activity_id = split_message_id


def unix_ms_to_hlc_ms(unix_ms: int) -> int:
    """Wall clock (ms since 1970) to the HLC epoch (ms since 2020-01-01T00:00:00Z)."""
    return _check_field(unix_ms - HLC_EPOCH_UNIX_MS, MAX_HLC_MS, "hlc_ms")


def hlc_ms_to_unix_ms(hlc_ms: int) -> int:
    """Inverse of :func:`unix_ms_to_hlc_ms`, for logs and tracing."""
    return _check_field(hlc_ms, MAX_HLC_MS, "hlc_ms") + HLC_EPOCH_UNIX_MS


class ClockUnsafeError(RuntimeError):
    """The wall clock stepped back beyond tolerance: fail fast rather than risk duplicate ids."""

    code: Final = "CLOCK_UNSAFE"

    def __init__(self, now_ms: int, last_hlc_ms: int, reject_ms: int) -> None:
        self.now_ms = now_ms
        self.last_hlc_ms = last_hlc_ms
        self.regression_ms = last_hlc_ms - now_ms
        super().__init__(
            f"CLOCK_UNSAFE: wall clock {now_ms} is {self.regression_ms} ms behind "
            f"last_hlc_ms {last_hlc_ms} (tolerance {reject_ms} ms)"
        )


class HlcState(NamedTuple):
    """Exportable clock state; persist ``last_hlc_ms`` with each commit."""

    last_hlc_ms: int
    seq_in_ms: int


class HlcClock:
    """Per-ConversationWriter HLC implementing the §6.2 ``assign()`` pseudo-code verbatim.

    Regression tolerance is inclusive: ``now == last_hlc_ms - reject_ms`` is absorbed and only
    ``now < last_hlc_ms - reject_ms`` raises, exactly as the spec's strict ``<`` comparison.
    """

    __slots__ = ("_last_hlc_ms", "_reject_ms", "_seq_in_ms", "region_id", "writer_id")

    def __init__(
        self,
        region_id: int,
        writer_id: int,
        *,
        clock_regression_reject_ms: int = DEFAULT_CLOCK_REGRESSION_REJECT_MS,
    ) -> None:
        self.region_id = _check_field(region_id, MAX_REGION_ID, "region_id")
        self.writer_id = _check_field(writer_id, MAX_WRITER_ID, "writer_id")
        if isinstance(clock_regression_reject_ms, bool) or clock_regression_reject_ms < 0:
            raise ValueError("clock_regression_reject_ms must be a non-negative int")
        self._reject_ms = clock_regression_reject_ms
        self._last_hlc_ms = 0
        self._seq_in_ms = 0

    @classmethod
    def restore(
        cls,
        last_hlc_ms: int,
        region_id: int,
        writer_id: int,
        *,
        seq_in_ms: int | None = None,
        clock_regression_reject_ms: int = DEFAULT_CLOCK_REGRESSION_REJECT_MS,
    ) -> HlcClock:
        """Rebuild a restarted writer's clock BEFORE its first assignment (§6.2).

        ``last_hlc_ms`` must be >= the hlc_ms of every id this writer ever issued. Without an
        exact ``seq_in_ms`` that millisecond is treated as exhausted, so the next same-ms
        assignment borrows ``last_hlc_ms + 1`` and is strictly greater than any earlier id.
        """
        clock = cls(region_id, writer_id, clock_regression_reject_ms=clock_regression_reject_ms)
        clock._last_hlc_ms = _check_field(last_hlc_ms, MAX_HLC_MS, "last_hlc_ms")
        clock._seq_in_ms = (
            MAX_SEQ_IN_MS if seq_in_ms is None else _check_field(seq_in_ms, MAX_SEQ_IN_MS, "seq")
        )
        return clock

    @property
    def last_hlc_ms(self) -> int:
        """Never decreases; the value a writer must persist and restore."""
        return self._last_hlc_ms

    @property
    def clock_regression_reject_ms(self) -> int:
        return self._reject_ms

    def state(self) -> HlcState:
        return HlcState(self._last_hlc_ms, self._seq_in_ms)

    def assign(self, now_ms: int) -> int:
        """Allocate the next id given the wall clock in HLC ms (see :func:`unix_ms_to_hlc_ms`)."""
        _check_field(now_ms, MAX_HLC_MS, "now_ms")
        last, seq = self._last_hlc_ms, self._seq_in_ms
        if now_ms < last - self._reject_ms:
            raise ClockUnsafeError(now_ms, last, self._reject_ms)
        if now_ms > last:
            last, seq = now_ms, 0
        else:
            seq += 1
            if seq > MAX_SEQ_IN_MS:  # borrow future time, never go back
                last, seq = last + 1, 0
        message_id = compose_message_id(last, self.region_id, self.writer_id, seq)
        self._last_hlc_ms, self._seq_in_ms = last, seq
        return message_id
