"""Canonical portable Roaring bytes for slot sets (spec 7.9, ADR-0006).

Why a helper instead of ``BitMap.serialize()`` on whatever bitmap is at hand: pyroaring writes the
RoaringFormatSpec portable format (cookie 12346 without run containers, 12347 with them), but the
container kinds inside depend on how a bitmap was built (``add_range`` makes run containers,
removals can leave a container in a kind a fresh build would not choose). Versions must be
byte-identical between the live path and a replay, and between two construction orders, so
every persisted bitmap is rebuilt from its sorted members and run-optimized: the bytes are then a
function of the set alone. Run containers are part of the portable spec, so roaring-rs and Go
roaring read them.
"""

from __future__ import annotations

from collections.abc import Iterable

from pyroaring import BitMap

__all__ = ["MAX_SLOT_ID", "bitmap_bytes", "bitmap_from_bytes", "canonical_bitmap"]

MAX_SLOT_ID = 0xFFFF_FFFF
"""Slot ids are u32 (spec Part 2 ``MemberSlotMap.slot_id``)."""


def canonical_bitmap(slots: Iterable[int]) -> BitMap:
    """A fresh bitmap of ``slots`` in the canonical container layout."""
    values = sorted(slots)
    if values and (values[0] < 0 or values[-1] > MAX_SLOT_ID):
        raise ValueError("slot ids must be u32")
    bitmap = BitMap(values)
    bitmap.run_optimize()
    bitmap.shrink_to_fit()
    return bitmap


def bitmap_bytes(slots: Iterable[int]) -> bytes:
    """Portable-format bytes of ``slots``; equal sets give equal bytes."""
    return bytes(canonical_bitmap(slots).serialize())


def bitmap_from_bytes(data: bytes) -> BitMap:
    """Parse portable-format bytes (ours, roaring-rs', Go roaring's)."""
    return BitMap.deserialize(data)
