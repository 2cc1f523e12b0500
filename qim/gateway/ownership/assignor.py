"""Pure parts of ConnectionShard ownership: the assignment algorithm, the wire encodings that
ride the consumer-group protocol, and the lease arithmetic (direction.md 4.1, spec 5.2-5.3).

Why this is separate from `qim.gateway.ownership.shards`: it does no I/O and imports no Kafka
client, so the decisions that matter (who gets which shard, what every gateway learns about the
others,
when a gateway must stop serving) are unit-testable and deterministic.

Two payloads travel inside the group protocol, both small JSON documents with ranges:

* member metadata `user_data` (JoinGroup, one per member): the member's endpoints and the shards
  it held under the last assignment it received, tagged with that assignment's `seq`;
* assignment `user_data` (SyncGroup, identical for every member): the full owner map
  shard -> endpoints, as one entry per owner with its shard ranges, tagged with a new `seq`.

`seq` is our own ownership generation: the leader sets it to one more than the highest `seq` any
member reports, so a member that was evicted and comes back (a zombie) loses every contested
shard to the member that received it later.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeGuard

FORMAT_VERSION = 1
# Upper bound on any partition number a peer may mention: the virtual bucket count caps the shard
# count (spec 5.2), and it keeps a hostile range like [0, 10**12] from being expanded.
MAX_PARTITIONS = 65536

Range = tuple[int, int]  # inclusive [first, last]


@dataclass(frozen=True, order=True)
class Endpoints:
    """Where clients reach one ConnectionNode: its primary endpoint (used as REDIRECT
    endpoint_hint) and, optionally, its TLS endpoint."""

    endpoint: str
    tls_endpoint: str | None = None


@dataclass(frozen=True)
class MemberClaim:
    """What one member advertises when it (re)joins the group."""

    endpoints: Endpoints | None
    seq: int = 0
    owned: tuple[int, ...] = ()


EMPTY_CLAIM = MemberClaim(endpoints=None)


# --- ranges -------------------------------------------------------------------------------


def to_ranges(partitions: Iterable[int]) -> list[Range]:
    """Collapse partition numbers into sorted inclusive ranges: [0,1,2,5] -> [(0,2),(5,5)]."""
    out: list[Range] = []
    for p in sorted(set(partitions)):
        if out and out[-1][1] == p - 1:
            out[-1] = (out[-1][0], p)
        else:
            out.append((p, p))
    return out


def from_ranges(ranges: Iterable[Range]) -> list[int]:
    """Expand inclusive ranges into partition numbers, sorted and without duplicates."""
    parts: set[int] = set()
    for first, last in ranges:
        parts.update(range(first, last + 1))
    return sorted(parts)


# --- the assignment -----------------------------------------------------------------------


def assign_partitions(
    partition_count: int, members: Mapping[str, MemberClaim]
) -> dict[str, tuple[int, ...]]:
    """Balanced, sticky, deterministic assignment of partitions 0..partition_count-1.

    * Balanced: every member gets `n // m` or `n // m + 1` partitions.
    * Sticky: a claim is valid if no other member claims the same partition with a higher `seq`
      (ties: the smaller member id). The `n % m` larger quotas go to the members holding the most
      valid claims, and each member keeps its claimed partitions up to its quota, so the number
      of moved partitions is the minimum the quotas allow.
    * Deterministic: depends only on the sorted member ids and the claims, never on the
      iteration order of `members`.
    """
    ids = sorted(members)
    if not ids:
        return {}
    best: dict[int, tuple[int, str]] = {}
    for mid in ids:  # sorted, and `>` below: the smaller id wins ties
        claim = members[mid]
        for p in sorted(set(claim.owned)):
            if not 0 <= p < partition_count:
                continue
            current = best.get(p)
            if current is None or claim.seq > current[0]:
                best[p] = (claim.seq, mid)
    held: dict[str, list[int]] = {mid: [] for mid in ids}
    for p in sorted(best):
        held[best[p][1]].append(p)

    base, extra = divmod(partition_count, len(ids))
    by_holding = sorted(ids, key=lambda m: (-len(held[m]), m))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(by_holding)}

    kept = {m: held[m][: quota[m]] for m in ids}
    taken = {p for parts in kept.values() for p in parts}
    free = [p for p in range(partition_count) if p not in taken]
    result: dict[str, tuple[int, ...]] = {}
    cursor = 0
    for m in ids:  # contiguous chunks of the free pool keep the ranges short
        need = quota[m] - len(kept[m])
        result[m] = tuple(sorted(kept[m] + free[cursor : cursor + need]))
        cursor += need
    return result


def next_seq(claims: Iterable[MemberClaim]) -> int:
    """The ownership generation of a new assignment: above everything a member has seen."""
    return max((c.seq for c in claims), default=0) + 1


# --- the owner map ------------------------------------------------------------------------


class OwnerMap:
    """Who owns every shard after one rebalance: shard -> Endpoints (None if the owner
    advertised none), tagged with the assignment's `seq`. Immutable."""

    __slots__ = ("_by_partition", "_groups", "seq")

    def __init__(self, seq: int, by_partition: Iterable[Endpoints | None]) -> None:
        self.seq = seq
        self._by_partition: tuple[Endpoints | None, ...] = tuple(by_partition)
        groups: dict[Endpoints | None, list[int]] = {}
        for p, owner in enumerate(self._by_partition):
            groups.setdefault(owner, []).append(p)
        self._groups = groups

    @classmethod
    def from_assignment(
        cls,
        seq: int,
        partition_count: int,
        assignment: Mapping[str, Iterable[int]],
        endpoints: Mapping[str, Endpoints | None],
    ) -> OwnerMap:
        by_partition: list[Endpoints | None] = [None] * partition_count
        for mid in sorted(assignment):
            for p in assignment[mid]:
                by_partition[p] = endpoints.get(mid)
        return cls(seq, by_partition)

    @property
    def partition_count(self) -> int:
        return len(self._by_partition)

    def owner(self, partition: int) -> Endpoints | None:
        if 0 <= partition < len(self._by_partition):
            return self._by_partition[partition]
        return None

    def partitions_of(self, endpoints: Endpoints) -> frozenset[int]:
        return frozenset(self._groups.get(endpoints, ()))

    def owners(self) -> dict[Endpoints, tuple[int, ...]]:
        """Every advertised owner with its shards (shards of owners without endpoints omitted)."""
        return {e: tuple(ps) for e, ps in self._groups.items() if e is not None}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OwnerMap):
            return NotImplemented
        return self.seq == other.seq and self._by_partition == other._by_partition

    def __hash__(self) -> int:
        return hash((self.seq, self._by_partition))

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{e.endpoint if e else None}: {to_ranges(ps)}" for e, ps in self._groups.items()
        )
        return f"OwnerMap(seq={self.seq}, n={self.partition_count}, {parts})"


# --- encodings ----------------------------------------------------------------------------
#
# member metadata: {"v":1,"e":"ws://..","t":"wss://.."|null,"s":seq,"r":[[first,last],...]}
# owner map:       {"v":1,"s":seq,"n":partition_count,
#                   "o":[{"e":"ws://..","t":..,"r":[[first,last],...]}, ...]}
# Owners are sorted by their first shard; shards whose owner advertised no endpoint are simply
# absent from "o". Decoders never raise: a malformed payload from a peer must not break a
# rebalance, so they answer None and the caller treats the peer as having no claim / no map.


def _dumps(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def _loads(data: bytes) -> dict[str, object] | None:
    try:
        doc = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(doc, dict) or not _is_int(doc.get("v")) or doc["v"] < 1:
        return None
    return doc


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _ranges_doc(ranges: Iterable[Range]) -> list[list[int]]:
    return [[a, b] for a, b in ranges]


def _parse_ranges(value: object, partition_count: int | None) -> list[Range] | None:
    if not isinstance(value, list):
        return None
    out: list[Range] = []
    for item in value:
        if not (isinstance(item, list) and len(item) == 2 and all(_is_int(x) for x in item)):
            return None
        first, last = item
        limit = MAX_PARTITIONS if partition_count is None else partition_count
        if first < 0 or last < first or last >= limit:
            return None
        out.append((first, last))
    return out


def _parse_endpoints(doc: Mapping[str, object]) -> tuple[bool, Endpoints | None]:
    """(well-formed, endpoints); endpoints is None when the member advertised none."""
    endpoint, tls = doc.get("e"), doc.get("t")
    if endpoint is None and tls is None:
        return True, None
    if not isinstance(endpoint, str) or not (tls is None or isinstance(tls, str)):
        return False, None
    return True, Endpoints(endpoint, tls)


def _endpoints_doc(endpoints: Endpoints | None) -> dict[str, object]:
    if endpoints is None:
        return {"e": None, "t": None}
    return {"e": endpoints.endpoint, "t": endpoints.tls_endpoint}


def encode_member_metadata(claim: MemberClaim) -> bytes:
    doc: dict[str, object] = {"v": FORMAT_VERSION, "s": claim.seq}
    doc.update(_endpoints_doc(claim.endpoints))
    doc["r"] = _ranges_doc(to_ranges(claim.owned))
    return _dumps(doc)


def decode_member_metadata(data: bytes) -> MemberClaim | None:
    doc = _loads(data)
    if doc is None:
        return None
    seq, ranges = doc.get("s"), _parse_ranges(doc.get("r"), None)
    well_formed, endpoints = _parse_endpoints(doc)
    if not _is_int(seq) or seq < 0 or ranges is None or not well_formed:
        return None
    return MemberClaim(endpoints=endpoints, seq=seq, owned=tuple(from_ranges(ranges)))


def encode_owner_map(owner_map: OwnerMap) -> bytes:
    owners = sorted(owner_map.owners().items(), key=lambda item: item[1][0])
    doc = {
        "v": FORMAT_VERSION,
        "s": owner_map.seq,
        "n": owner_map.partition_count,
        "o": [{**_endpoints_doc(e), "r": _ranges_doc(to_ranges(parts))} for e, parts in owners],
    }
    return _dumps(doc)


def decode_owner_map(data: bytes) -> OwnerMap | None:
    doc = _loads(data)
    if doc is None:
        return None
    seq, n, owners = doc.get("s"), doc.get("n"), doc.get("o")
    if not (_is_int(seq) and _is_int(n) and isinstance(owners, list)):
        return None
    if seq < 0 or not 0 <= n <= MAX_PARTITIONS:
        return None
    by_partition: list[Endpoints | None] = [None] * n
    seen: set[int] = set()
    for entry in owners:
        if not isinstance(entry, dict):
            return None
        _, endpoints = _parse_endpoints(entry)
        ranges = _parse_ranges(entry.get("r"), n)
        if endpoints is None or ranges is None:
            return None
        for p in from_ranges(ranges):
            if p in seen:  # one owner per shard, or the map is not trustworthy
                return None
            seen.add(p)
            by_partition[p] = endpoints
    return OwnerMap(seq, by_partition)


# --- the lease ----------------------------------------------------------------------------


class Lease:
    """The shard lease as this member can know it: the group session.

    The broker expires a member `session_timeout` after the last heartbeat it *received*; a
    heartbeat that succeeded was received after it was *sent*, so `sent + session_timeout`
    is a lower bound of the broker's expiry and the member stops serving `margin` before it.
    A completed rebalance also renews the session (the broker resets it on SyncGroup, shortly
    before the member sees its assignment); `margin` covers that gap. Times are monotonic
    seconds supplied by the caller, so the arithmetic is testable without a clock.
    """

    __slots__ = ("_renewed_at", "margin", "ttl")

    def __init__(self, ttl: float, margin: float) -> None:
        if ttl <= 0 or margin < 0 or margin >= ttl:
            raise ValueError("need ttl > margin >= 0")
        self.ttl = ttl
        self.margin = margin
        self._renewed_at: float | None = None

    def renew(self, at: float) -> None:
        """Record evidence that the broker held our session at time `at` (never goes back)."""
        if self._renewed_at is None or at > self._renewed_at:
            self._renewed_at = at

    def clear(self) -> None:
        self._renewed_at = None

    def expires_at(self) -> float | None:
        if self._renewed_at is None:
            return None
        return self._renewed_at + self.ttl - self.margin

    def valid(self, now: float) -> bool:
        expiry = self.expires_at()
        return expiry is not None and now < expiry
