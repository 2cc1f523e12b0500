"""Key layout, the batch overlay and the reader seam (spec 7.0, 7.3; direction.md 4.2)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from qim.core.mailbox import MailboxReader, MemoryMailboxStore, StoreMailboxReader, diff_stores
from qim.core.mailbox.keys import (
    COUNT,
    entry_key,
    parse_entry_key,
    parse_user_key,
    trim_key,
    user_entry_prefix,
)
from qim.core.mailbox.kvstore import Overlay
from tests.unit.mailbox.support import CONFIG, T

u64s = st.integers(0, (1 << 63) - 1)


@given(a=st.tuples(u64s, st.integers(0, 3), u64s), b=st.tuples(u64s, st.integers(0, 3), u64s))
def test_7_3_entry_keys_sort_by_mailbox_seq_then_ordinal_then_event_id(
    a: tuple[int, int, int], b: tuple[int, int, int]
) -> None:
    ka, kb = entry_key(T, "u1", *a), entry_key(T, "u1", *b)
    assert (ka < kb) == (a < b)
    assert parse_entry_key(ka) == a


def test_9_1_one_users_prefix_never_covers_another_users_keys() -> None:
    assert not entry_key(T, "u10", 1, 0, 1).startswith(user_entry_prefix(T, "u1"))
    assert not entry_key("t10", "u1", 1, 0, 1).startswith(user_entry_prefix("t1", "u1"))
    assert parse_user_key(trim_key(T, "u1")) == (T, "u1")


def test_direction_4_2_the_overlay_reads_its_own_writes_and_emits_one_sorted_batch() -> None:
    base = MemoryMailboxStore([(b"Ka", b"1"), (b"Kb", b"2"), (b"Kd", b"4")])
    view = Overlay(base)
    view.put(b"Kc", b"3")
    view.delete(b"Kb")
    view.put(b"Kd", b"40")
    view.put(b"Ka", b"10")
    view.put(b"Ka", b"11")
    assert list(view.scan(b"K", b"K", False)) == [(b"Ka", b"11"), (b"Kc", b"3"), (b"Kd", b"40")]
    assert list(view.scan(b"K", b"Kc", True)) == [(b"Kc", b"3"), (b"Ka", b"11")]
    assert view.get(b"Kb") is None and base.get(b"Kb") == b"2"
    assert view.ops() == ((b"Ka", b"11"), (b"Kb", None), (b"Kc", b"3"), (b"Kd", b"40"))
    base.apply(view.ops())
    assert diff_stores(base.items(), list(view.scan(b"", b"", False))) == []


def test_diff_stores_names_missing_extra_and_different_keys() -> None:
    assert diff_stores([(b"a", b"1"), (b"b", b"2")], [(b"b", b"3"), (b"c", b"")]) == [
        "missing b'a'",
        "different b'b'",
        "extra b'c'",
    ]


def test_the_store_reader_is_a_mailbox_reader_and_reads_empty_state_as_zero() -> None:
    store = MemoryMailboxStore()
    reader: MailboxReader = StoreMailboxReader(store, CONFIG.lane_count)
    assert reader.lane_watermark(0) == 0
    assert reader.effective_trim(T, "u1") == 0
    assert reader.body(T, bytes(16)) is None
    assert list(reader.read_user_range(T, "u1", 0, 1 << 62)) == []
    assert [k for k, _ in store.items() if k.startswith(COUNT)] == []
