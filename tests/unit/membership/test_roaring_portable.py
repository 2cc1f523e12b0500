"""Slot bitmaps are RoaringFormatSpec portable bytes, canonical per set (spec 7.9, ADR-0006).

The expected bytes are assembled here field by field from the format spec
(https://github.com/RoaringBitmap/RoaringFormatSpec), independently of pyroaring, so a passing
test means roaring-rs and Go roaring read what we write:

    cookie      u32 LE  12346 (no run containers), or u16 LE 12347 + u16 LE (n - 1)
    [runs]      ceil(n/8) bytes, bit i = container i is a run container   (12347 only)
    [n]         u32 LE container count                                  (12346 only)
    headers     per container: u16 LE key (high 16 bits), u16 LE cardinality - 1
    [offsets]   u32 LE byte offset of each container   (12346 always; 12347 when n >= 4)
    containers  array: u16 LE values | bitset: 1024 x u64 LE | run: u16 n_runs, (start, len-1)
"""

from __future__ import annotations

import random
import struct

from hypothesis import given
from hypothesis import strategies as st
from pyroaring import BitMap

from qim.core.membership import bitmap_bytes, bitmap_from_bytes, canonical_bitmap

NO_RUN_COOKIE = 12346
RUN_COOKIE = 12347


def _array_only(containers: list[tuple[int, list[int]]]) -> bytes:
    """Portable bytes of array containers only (cookie 12346, offsets present)."""
    head = struct.pack("<II", NO_RUN_COOKIE, len(containers))
    head += b"".join(struct.pack("<HH", key, len(vals) - 1) for key, vals in containers)
    offset = len(head) + 4 * len(containers)
    offsets = b""
    for _, vals in containers:
        offsets += struct.pack("<I", offset)
        offset += 2 * len(vals)
    body = b"".join(struct.pack(f"<{len(vals)}H", *vals) for _, vals in containers)
    return head + offsets + body


def test_7_9_array_containers_match_the_portable_spec() -> None:
    expected = _array_only([(0, [1, 2, 3])])
    assert expected.hex() == "3a300000010000000000020010000000010002000300"
    assert bitmap_bytes([3, 1, 2]) == expected
    two = _array_only([(0, [1, 2, 3]), (1, [70000 & 0xFFFF])])
    assert bitmap_bytes([70000, 1, 2, 3]) == two


def test_7_9_run_containers_match_the_portable_spec() -> None:
    # one container, key 0, 10 values, one run [0, 9]; n < 4 so no offset table
    expected = (
        struct.pack("<HH", RUN_COOKIE, 0)  # cookie + (n - 1)
        + bytes([0b1])  # container 0 is a run container
        + struct.pack("<HH", 0, 9)  # key 0, cardinality - 1
        + struct.pack("<HHH", 1, 0, 9)  # 1 run: start 0, length - 1 = 9
    )
    assert bitmap_bytes(range(10)) == expected
    assert list(bitmap_from_bytes(expected)) == list(range(10))


def test_7_9_bitset_containers_match_the_portable_spec() -> None:
    evens = list(range(0, 10000, 2))  # 5000 values: above the 4096 array limit, no runs
    words = [0] * 1024
    for value in evens:
        words[value >> 6] |= 1 << (value & 63)
    expected = struct.pack("<IIHHI", NO_RUN_COOKIE, 1, 0, len(evens) - 1, 16)
    expected += struct.pack("<1024Q", *words)
    assert bitmap_bytes(evens) == expected


@given(st.sets(st.integers(min_value=0, max_value=300_000), max_size=400), st.randoms())
def test_7_9_bytes_depend_on_the_set_not_on_how_it_was_built(
    slots: set[int], rnd: random.Random
) -> None:
    canonical = bitmap_bytes(slots)
    shuffled = list(slots)
    rnd.shuffle(shuffled)
    built = BitMap()
    for value in [*shuffled, 300_001, 300_002]:
        built.add(value)
    built.add_range(400_000, 400_100)  # run container, then removed again
    built.remove_range(400_000, 400_100)
    built.discard(300_001)
    built.discard(300_002)
    assert bitmap_bytes(built) == canonical
    assert bitmap_bytes(shuffled) == canonical
    assert bitmap_from_bytes(canonical) == canonical_bitmap(slots)
    assert set(bitmap_from_bytes(canonical)) == slots
