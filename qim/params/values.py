"""Structured defaults: Appendix B values that are more than one number.

"20 msg/s", "1 MiB / 2000 items" or "1 s start, x1.8, cap 120 s, +-30 % jitter" are kept as
small frozen dataclasses rather than strings, so code reads ``rate.per_second`` instead of
parsing prose, and a bad override fails at load time. Field names carry their units. Each
``__str__`` gives back the spec's own wording for the generated table.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from qim.params.units import fmt_bytes, fmt_ms, fmt_per, fmt_ratio

__all__ = [
    "EventWindow",
    "ExponentialBackoff",
    "FloatRange",
    "IdleTimeout",
    "LatencyTarget",
    "MemoryShare",
    "MsRange",
    "PageLimit",
    "PingBackoff",
    "PpsBudget",
    "PriorityOrder",
    "QuietHours",
    "Rate",
    "RateTier",
    "SustainedShare",
    "TcpKeepalive",
    "TieredRate",
    "UploadQuota",
    "Watermark",
]


def _positive(**fields: float) -> None:
    for name, value in fields.items():
        if value <= 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")


def _fraction(name: str, value: float, *, allow_one: bool = True) -> None:
    upper_ok = value <= 1 if allow_one else value < 1
    if not (value > 0 and upper_ok):
        raise ValueError(f"{name} must be a fraction in (0, 1], got {value!r}")


@dataclass(frozen=True, slots=True)
class Rate:
    """``count`` events per ``period_ms``: "20 msg/s" is ``Rate(20, 1000)``."""

    count: int
    period_ms: int

    def __post_init__(self) -> None:
        _positive(count=self.count, period_ms=self.period_ms)

    @property
    def per_second(self) -> float:
        """The steady token-bucket refill rate."""
        return self.count * 1000 / self.period_ms

    def __str__(self) -> str:
        if self.period_ms == 1000:
            return f"{self.count}/s"
        return f"{self.count} {fmt_per(self.period_ms)}"


@dataclass(frozen=True, slots=True)
class RateTier:
    """One tier: conversations with ``member_count <= max_members`` (None: no bound)."""

    max_members: int | None
    msgs_per_s: float

    def __post_init__(self) -> None:
        _positive(msgs_per_s=self.msgs_per_s)
        if self.max_members is not None:
            _positive(max_members=self.max_members)


@dataclass(frozen=True, slots=True)
class TieredRate:
    """A rate chosen by member count (L2 admission, §8.2): bigger groups, lower rate."""

    tiers: tuple[RateTier, ...]

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ValueError("tiers must not be empty")
        if self.tiers[-1].max_members is not None:
            raise ValueError("the last tier must be unbounded (max_members = None)")
        bounds = [t.max_members for t in self.tiers[:-1] if t.max_members is not None]
        if len(bounds) != len(self.tiers) - 1:
            raise ValueError("only the last tier may be unbounded")
        if any(a >= b for a, b in pairwise(bounds)):
            raise ValueError("tier bounds must strictly increase")
        if any(a.msgs_per_s < b.msgs_per_s for a, b in pairwise(self.tiers)):
            raise ValueError("a bigger tier must not allow a higher rate")

    def for_members(self, member_count: int) -> float:
        """Messages per second allowed for a conversation of ``member_count`` members."""
        for tier in self.tiers:
            if tier.max_members is None or member_count <= tier.max_members:
                return tier.msgs_per_s
        raise AssertionError("unreachable: the last tier is unbounded")

    def __str__(self) -> str:
        parts: list[str] = []
        previous: int | None = None
        for tier in self.tiers:
            if tier.max_members is None:
                parts.append(f"N > {previous} → {tier.msgs_per_s:g} msg/s")
            elif previous is None:
                parts.append(f"N ≤ {tier.max_members} → {tier.msgs_per_s:g} msg/s")
            else:
                parts.append(f"{previous} < N ≤ {tier.max_members} → {tier.msgs_per_s:g} msg/s")
            previous = tier.max_members
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class Watermark:
    """A send-buffer level reached by whichever comes first, bytes or queued items."""

    bytes: int
    items: int

    def __post_init__(self) -> None:
        _positive(bytes=self.bytes, items=self.items)

    def __str__(self) -> str:
        return f"{fmt_bytes(self.bytes)} or {self.items} items"


@dataclass(frozen=True, slots=True)
class PingBackoff:
    """Shrink the heartbeat interval by ``factor`` after a missing PONG and hold it."""

    factor: float
    lock_ms: int

    def __post_init__(self) -> None:
        _fraction("factor", self.factor, allow_one=False)
        _positive(lock_ms=self.lock_ms)

    def __str__(self) -> str:
        return f"×{self.factor:g}, locked for {fmt_ms(self.lock_ms)}"


@dataclass(frozen=True, slots=True)
class IdleTimeout:
    """Server idle cut as a function of the negotiated interval: ``interval × m + margin``."""

    ping_multiplier: int
    margin_ms: int

    def __post_init__(self) -> None:
        _positive(ping_multiplier=self.ping_multiplier)
        if self.margin_ms < 0:
            raise ValueError(f"margin_ms must be >= 0, got {self.margin_ms!r}")

    def for_ping_interval(self, next_ping_interval_ms: int) -> int:
        """The idle cut for a connection whose next ping interval is given."""
        return next_ping_interval_ms * self.ping_multiplier + self.margin_ms

    def __str__(self) -> str:
        return f"next_ping_interval × {self.ping_multiplier} + {fmt_ms(self.margin_ms)}"


@dataclass(frozen=True, slots=True)
class TcpKeepalive:
    """Kernel keepalive socket options, in the kernel's own unit (seconds)."""

    idle_s: int
    interval_s: int
    count: int

    def __post_init__(self) -> None:
        _positive(idle_s=self.idle_s, interval_s=self.interval_s, count=self.count)

    def __str__(self) -> str:
        return f"idle {self.idle_s} / intvl {self.interval_s} / cnt {self.count}"


@dataclass(frozen=True, slots=True)
class MsRange:
    """A closed interval of milliseconds (a random draw or an allowed window)."""

    low_ms: int
    high_ms: int

    def __post_init__(self) -> None:
        if not 0 <= self.low_ms <= self.high_ms:
            raise ValueError(f"need 0 <= low_ms <= high_ms, got {self.low_ms}..{self.high_ms}")

    def __str__(self) -> str:
        return f"{self.low_ms}–{self.high_ms} ms"


@dataclass(frozen=True, slots=True)
class FloatRange:
    """A closed interval of a dimensionless factor (a planning estimate)."""

    low: float
    high: float

    def __post_init__(self) -> None:
        if not 0 < self.low <= self.high:
            raise ValueError(f"need 0 < low <= high, got {self.low}..{self.high}")

    def __str__(self) -> str:
        return f"{self.low:g}–{self.high:g}"


@dataclass(frozen=True, slots=True)
class ExponentialBackoff:
    """Retry delays: ``initial_ms × factor^n`` capped at ``cap_ms``, ± ``jitter`` fraction."""

    initial_ms: int
    factor: float
    cap_ms: int
    jitter: float

    def __post_init__(self) -> None:
        _positive(initial_ms=self.initial_ms, cap_ms=self.cap_ms)
        if self.factor < 1:
            raise ValueError(f"factor must be >= 1, got {self.factor!r}")
        if self.cap_ms < self.initial_ms:
            raise ValueError("cap_ms must be >= initial_ms")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter!r}")

    def delay_ms(self, attempt: int) -> int:
        """Un-jittered delay before retry ``attempt`` (0-based); callers add the jitter."""
        return min(self.cap_ms, round(self.initial_ms * self.factor**attempt))

    def __str__(self) -> str:
        return (
            f"{fmt_ms(self.initial_ms)} start, ×{self.factor:g}, cap {fmt_ms(self.cap_ms)}, "
            f"±{fmt_ratio(self.jitter)} jitter"
        )


@dataclass(frozen=True, slots=True)
class LatencyTarget:
    """An SLO: the ``percentile`` of a latency stays at or under ``max_ms``."""

    percentile: float
    max_ms: int

    def __post_init__(self) -> None:
        if not 0 < self.percentile < 100:
            raise ValueError(f"percentile must be in (0, 100), got {self.percentile!r}")
        _positive(max_ms=self.max_ms)

    def __str__(self) -> str:
        return f"P{self.percentile:g} ≤ {fmt_ms(self.max_ms)}"


@dataclass(frozen=True, slots=True)
class MemoryShare:
    """A budget of ``min(available memory × fraction, cap_bytes)``."""

    fraction: float
    cap_bytes: int

    def __post_init__(self) -> None:
        _fraction("fraction", self.fraction)
        _positive(cap_bytes=self.cap_bytes)

    def resolve(self, available_bytes: int) -> int:
        """The budget on a node with ``available_bytes`` of memory."""
        return min(int(available_bytes * self.fraction), self.cap_bytes)

    def __str__(self) -> str:
        return f"min(available memory × {fmt_ratio(self.fraction)}, {fmt_bytes(self.cap_bytes)})"


@dataclass(frozen=True, slots=True)
class UploadQuota:
    """At most ``uploads`` uploads and ``bytes`` bytes per ``period_ms``."""

    uploads: int
    bytes: int
    period_ms: int

    def __post_init__(self) -> None:
        _positive(uploads=self.uploads, bytes=self.bytes, period_ms=self.period_ms)

    def __str__(self) -> str:
        return f"{self.uploads} uploads / {fmt_bytes(self.bytes)} {fmt_per(self.period_ms)}"


@dataclass(frozen=True, slots=True)
class QuietHours:
    """A daily no-push window in minutes of the day; it may wrap past midnight."""

    start_minute: int
    end_minute: int

    def __post_init__(self) -> None:
        for name, value in (("start_minute", self.start_minute), ("end_minute", self.end_minute)):
            if not 0 <= value < 1440:
                raise ValueError(f"{name} must be in 0..1439, got {value!r}")

    def __str__(self) -> str:
        start, end = divmod(self.start_minute, 60), divmod(self.end_minute, 60)
        return f"{start[0]:02d}:{start[1]:02d}–{end[0]:02d}:{end[1]:02d}"


@dataclass(frozen=True, slots=True)
class SustainedShare:
    """A share that must hold continuously for ``window_ms`` before it triggers."""

    ratio: float
    window_ms: int

    def __post_init__(self) -> None:
        _fraction("ratio", self.ratio)
        _positive(window_ms=self.window_ms)

    def __str__(self) -> str:
        return f"{fmt_ratio(self.ratio)} for {fmt_ms(self.window_ms)}"


@dataclass(frozen=True, slots=True)
class EventWindow:
    """Flush after ``max_ms`` or ``max_events`` events, whichever comes first."""

    max_ms: int
    max_events: int

    def __post_init__(self) -> None:
        _positive(max_ms=self.max_ms, max_events=self.max_events)

    def __str__(self) -> str:
        return f"{fmt_ms(self.max_ms)} or {self.max_events} events, whichever first"


@dataclass(frozen=True, slots=True)
class PageLimit:
    """A page size used when the client gives none, and the server's hard cap."""

    default: int
    cap: int

    def __post_init__(self) -> None:
        _positive(default=self.default, cap=self.cap)
        if self.default > self.cap:
            raise ValueError(f"default {self.default} exceeds cap {self.cap}")

    def clamp(self, requested: int | None) -> int:
        """The page size to serve for a request asking for ``requested`` items."""
        if requested is None or requested <= 0:
            return self.default
        return min(requested, self.cap)

    def __str__(self) -> str:
        return f"{self.default} (server cap {self.cap})"


@dataclass(frozen=True, slots=True)
class PpsBudget:
    """A NIC budget: packets per second and a share of line rate."""

    pps: int
    line_rate_ratio: float

    def __post_init__(self) -> None:
        _positive(pps=self.pps)
        _fraction("line_rate_ratio", self.line_rate_ratio)

    def __str__(self) -> str:
        return f"≤ {self.pps} pps, bandwidth ≤ {fmt_ratio(self.line_rate_ratio)} of line rate"


@dataclass(frozen=True, slots=True)
class PriorityOrder:
    """Traffic classes from highest to lowest priority; the last is dropped first."""

    classes: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.classes or len(set(self.classes)) != len(self.classes):
            raise ValueError("classes must be non-empty and distinct")

    def rank(self, traffic_class: str) -> int:
        """0 for the highest priority; raises ValueError for an unknown class."""
        return self.classes.index(traffic_class)

    def __str__(self) -> str:
        return " > ".join(self.classes)
