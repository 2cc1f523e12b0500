"""The per-decrypt-point DEK cache of spec 21.3.4: an in-process LRU keyed ``(tenant_id,
dek_id)``, TTL ``dek_cache_ttl``, evicted on key-destroyed events. Time is an argument (pure);
plaintext DEKs live only in this process's memory, never on disk or in logs."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from qim.core.keys.ids import DekId

__all__ = ["DekCache"]


@dataclass
class DekCache:
    """LRU with TTL; counters feed the DEK cache metrics (hits, misses, evictions)."""

    ttl_ms: int
    capacity: int = 4096
    _items: OrderedDict[tuple[str, DekId], tuple[bytes, int]] = field(default_factory=OrderedDict)
    hits: int = 0
    misses: int = 0
    evictions: int = 0

    def __repr__(self) -> str:  # never print keys
        return f"DekCache(size={len(self._items)})"

    def __len__(self) -> int:
        return len(self._items)

    @property
    def size_bytes(self) -> int:
        """Real bytes of the cached key material (21.3.4: capacity measured in bytes)."""
        return sum(len(v) for v, _ in self._items.values())

    def get(
        self, tenant_id: str, dek_id: DekId, now_ms: int, load: Callable[[str, DekId], bytes]
    ) -> bytes:
        """The cached DEK, or ``load(tenant_id, dek_id)`` (which may raise) cached for ``ttl``."""
        k = (tenant_id, dek_id)
        hit = self._items.get(k)
        if hit is not None and hit[1] > now_ms:
            self._items.move_to_end(k)
            self.hits += 1
            return hit[0]
        self.misses += 1
        dek = load(tenant_id, dek_id)
        self._items[k] = (dek, now_ms + self.ttl_ms)
        self._items.move_to_end(k)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)
            self.evictions += 1
        return dek

    def evict(self, tenant_id: str, dek_id: DekId) -> bool:
        """Drop a destroyed key (the key-destroyed subscription); True when it was cached."""
        if self._items.pop((tenant_id, dek_id), None) is None:
            return False
        self.evictions += 1
        return True
