"""Connection admission per client IP (§15.2.3, §20.4.1), pure, time as an argument.

* ``per_ip_connect_rate`` (20 conn/s, B.5): a token bucket per IP, capacity = one period's
  count, refilled continuously. Over it the connection is refused *outright, with no app-layer
  frame* (§20.4.1, "avoids amplification"): the driver aborts the socket before TLS when it can.
* ``per_ip_max_connections`` (200, B.5): concurrent connections per IP.

Frame size is checked by the decoder on ``body_len`` before any body is buffered (§20.1), so
it is not repeated here. Memory stays bounded: a bucket that has refilled and holds no
connection carries no information and is dropped by ``prune``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["ConnectAdmission", "Refusal", "TokenBucket"]


class Refusal(Enum):
    RATE = "per_ip_connect_rate"
    CONNECTIONS = "per_ip_max_connections"


@dataclass(slots=True)
class TokenBucket:
    """``capacity`` tokens, refilled at ``capacity / period_ms`` per ms."""

    capacity: float
    period_ms: int
    tokens: float
    updated_ms: int

    @classmethod
    def full(cls, capacity: int, period_ms: int, now_ms: int) -> TokenBucket:
        return cls(float(capacity), period_ms, float(capacity), now_ms)

    def refill(self, now_ms: int) -> None:
        elapsed = max(0, now_ms - self.updated_ms)
        self.tokens = min(self.capacity, self.tokens + elapsed * self.capacity / self.period_ms)
        self.updated_ms = max(self.updated_ms, now_ms)

    def take(self, now_ms: int) -> bool:
        self.refill(now_ms)
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True

    def is_full(self, now_ms: int) -> bool:
        self.refill(now_ms)
        return self.tokens >= self.capacity


@dataclass(slots=True)
class _Peer:
    bucket: TokenBucket
    connections: int = 0


class ConnectAdmission:
    """Admit or refuse new connections by IP; ``release`` when one closes."""

    def __init__(
        self,
        *,
        rate_count: int = 20,
        rate_period_ms: int = 1000,
        max_connections: int = 200,
        max_tracked: int = 100_000,
    ) -> None:
        if rate_count < 1 or rate_period_ms < 1 or max_connections < 1:
            raise ValueError("admission limits must be positive")
        self.rate_count = rate_count
        self.rate_period_ms = rate_period_ms
        self.max_connections = max_connections
        self.max_tracked = max_tracked
        self._peers: dict[str, _Peer] = {}

    def admit(self, ip: str, now_ms: int) -> Refusal | None:
        """``check`` then ``acquire``: None = admitted and counted; else why refused."""
        refusal = self.check(ip, now_ms)
        if refusal is None:
            self.acquire(ip)
        return refusal

    def check(self, ip: str, now_ms: int) -> Refusal | None:
        """Spend a rate token unless the IP is at its connection cap; counts nothing.

        Split from ``acquire`` for WebSocket, where the refusal happens at the HTTP upgrade
        and the connection is only counted once its handler runs (and always released).
        """
        peer = self._peers.get(ip)
        if peer is None:
            if len(self._peers) >= self.max_tracked:
                self.prune(now_ms)
            bucket = TokenBucket.full(self.rate_count, self.rate_period_ms, now_ms)
            peer = self._peers[ip] = _Peer(bucket)
        if peer.connections >= self.max_connections:
            return Refusal.CONNECTIONS
        if not peer.bucket.take(now_ms):
            return Refusal.RATE
        return None

    def acquire(self, ip: str) -> None:
        """Count one open connection of ``ip`` (pair with ``release``)."""
        peer = self._peers.get(ip)
        if peer is None:
            peer = self._peers[ip] = _Peer(
                TokenBucket.full(self.rate_count, self.rate_period_ms, 0)
            )
        peer.connections += 1

    def release(self, ip: str) -> None:
        peer = self._peers.get(ip)
        if peer is not None and peer.connections > 0:
            peer.connections -= 1

    def connections(self, ip: str) -> int:
        peer = self._peers.get(ip)
        return 0 if peer is None else peer.connections

    def prune(self, now_ms: int) -> int:
        """Drop peers with no connection and a full bucket; return how many."""
        idle = [
            ip
            for ip, peer in self._peers.items()
            if peer.connections == 0 and peer.bucket.is_full(now_ms)
        ]
        for ip in idle:
            del self._peers[ip]
        return len(idle)

    def __len__(self) -> int:
        return len(self._peers)
