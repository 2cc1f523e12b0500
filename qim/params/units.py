"""Units, group labels and the humanizing helpers the parameter table uses.

Unit rule (one rule, so nobody has to guess): a parameter whose name ends in ``_ms``,
``_seconds``, ``_minutes``, ``_hours``, ``_days`` or ``_years`` (or, for a bound, that suffix
plus ``_max``) holds an ``int`` in that unit, because the spec's name says so; every other
duration is an ``int`` of **milliseconds**. Sizes are ``int`` bytes, shares are ``float``
fractions (20 % is ``0.2``), and values made of several numbers are small frozen dataclasses
whose field names carry their units (``period_ms``, ``cap_bytes``).
"""

from __future__ import annotations

from typing import Final, Literal

__all__ = [
    "DAY",
    "GROUPS",
    "GROUP_ROW_COUNTS",
    "GROUP_TITLES",
    "HOUR",
    "MINUTE",
    "SECOND",
    "SUFFIX_UNITS",
    "GiB",
    "Group",
    "KiB",
    "MiB",
    "Unit",
    "fmt_bytes",
    "fmt_ms",
    "fmt_per",
    "fmt_ratio",
]

Unit = Literal[
    "count",
    "bytes",
    "ms",
    "s",
    "min",
    "h",
    "days",
    "years",
    "ratio",
    "factor",
    "per_s",
    "per_min",
    "per_day",
    "ratio_per_s",
    "ratio_per_day",
    "bool",
    "enum",
    "composite",
]

Group = Literal[
    "B.1", "B.2", "B.3", "B.4", "B.5", "B.5.1", "B.5.2", "B.5.3", "B.6", "B.6.1", "B.7", "prose"
]

GROUPS: Final[tuple[Group, ...]] = (
    "B.1",
    "B.2",
    "B.3",
    "B.4",
    "B.5",
    "B.5.1",
    "B.5.2",
    "B.5.3",
    "B.6",
    "B.6.1",
    "B.7",
    "prose",
)

GROUP_TITLES: Final[dict[Group, str]] = {
    "B.1": "Sharding and routing",
    "B.2": "Sequences and idempotency",
    "B.3": "Sync and retention",
    "B.4": "Connection and heartbeat",
    "B.5": "Flow control and limits",
    "B.5.1": "Mailbox and dispatch runtime",
    "B.5.2": "Offline push",
    "B.5.3": "Consistency and disaster recovery",
    "B.6": "Session list and unread",
    "B.6.1": "Ephemeral messages and chatroom interaction",
    "B.7": "To be measured (never used for conclusions before backfill)",
    "prose": "Named in the text outside Appendix B",
}

# Row counts as the spec's headings state them (digest part 4); a test holds us to them.
# "prose" is ours: parameters the chapters name with a default but Appendix B does not list.
GROUP_ROW_COUNTS: Final[dict[Group, int]] = {
    "B.1": 8,
    "B.2": 9,
    "B.3": 17,
    "B.4": 30,
    "B.5": 36,
    "B.5.1": 25,
    "B.5.2": 10,
    "B.5.3": 33,
    "B.6": 12,
    "B.6.1": 22,
    "B.7": 17,
    "prose": 4,
}

SUFFIX_UNITS: Final[dict[str, Unit]] = {
    "_ms": "ms",
    "_seconds": "s",
    "_minutes": "min",
    "_hours": "h",
    "_days": "days",
    "_years": "years",
}

SECOND: Final = 1000
MINUTE: Final = 60 * SECOND
HOUR: Final = 60 * MINUTE
DAY: Final = 24 * HOUR

KiB: Final = 1024
MiB: Final = 1024 * KiB
GiB: Final = 1024 * MiB

_MS_STEPS: Final[tuple[tuple[int, str], ...]] = (
    (DAY, "d"),
    (HOUR, "h"),
    (MINUTE, "min"),
    (SECOND, "s"),
)
_BYTE_STEPS: Final[tuple[tuple[int, str], ...]] = ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB"))


def fmt_ms(ms: int) -> str:
    """Milliseconds in the largest unit that divides them exactly: 604800000 -> '7 d'."""
    for size, label in _MS_STEPS:
        if ms and ms % size == 0:
            return f"{ms // size} {label}"
    return f"{ms} ms"


def fmt_per(ms: int) -> str:
    """A period as 'per ...': 1000 -> 'per s', 86400000 -> 'per day', 3000 -> 'per 3 s'."""
    single = {SECOND: "s", MINUTE: "min", HOUR: "h", DAY: "day"}
    return f"per {single[ms]}" if ms in single else f"per {fmt_ms(ms)}"


def fmt_bytes(n: int) -> str:
    """Bytes in the largest binary unit that divides them exactly: 4194304 -> '4 MiB'."""
    for size, label in _BYTE_STEPS:
        if n and n % size == 0:
            return f"{n // size} {label}"
    return f"{n} B"


def fmt_ratio(ratio: float) -> str:
    """A fraction as the percentage the spec writes: 0.0001 -> '0.01 %'."""
    return f"{ratio * 100:.6g} %"
