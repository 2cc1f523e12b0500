"""message_id / last_activity_id layout and the HLC clock (spec §6.2, §6.4, B.2, §26 #10-11)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qim.schemas.ids import (
    HLC_EPOCH_UNIX_MS,
    MAX_HLC_MS,
    MAX_REGION_ID,
    MAX_SEQ_IN_MS,
    MAX_WRITER_ID,
    ClockUnsafeError,
    HlcClock,
    HlcState,
    MessageIdParts,
    compose_last_activity_id,
    compose_message_id,
    hlc_ms_to_unix_ms,
    message_id_from_bytes,
    message_id_to_bytes,
    split_last_activity_id,
    split_message_id,
    unix_ms_to_hlc_ms,
)

u128 = st.integers(0, (1 << 128) - 1)
parts = st.tuples(
    st.integers(0, MAX_HLC_MS),
    st.integers(0, MAX_REGION_ID),
    st.integers(0, MAX_WRITER_ID),
    st.integers(0, MAX_SEQ_IN_MS),
)


def test_spec_6_2_worked_example() -> None:
    mid = compose_message_id(212544000123, 1, 5, 3)
    assert message_id_to_bytes(mid).hex() == "00317c9c107b00100005000003000000"
    assert mid == 256949929552869914270661414519570432
    assert split_message_id(mid) == MessageIdParts(212544000123, 1, 5, 3, 0)


def test_spec_6_2_epoch_is_2020_01_01_utc() -> None:
    assert HLC_EPOCH_UNIX_MS == 1577836800000
    # 2026-09-26T00:00:00.123Z
    assert unix_ms_to_hlc_ms(1790380800123) == 212544000123 == 0x317C9C107B
    assert hlc_ms_to_unix_ms(212544000123) == 1790380800123
    with pytest.raises(ValueError):
        unix_ms_to_hlc_ms(HLC_EPOCH_UNIX_MS - 1)


def test_field_maxima_fit_and_reserved_bits_stay_zero() -> None:
    mid = compose_message_id(MAX_HLC_MS, MAX_REGION_ID, MAX_WRITER_ID, MAX_SEQ_IN_MS)
    assert message_id_to_bytes(mid).hex() == "ff" * 13 + "000000"
    assert split_message_id(mid).reserved == 0


@pytest.mark.parametrize(
    "fields",
    [
        (MAX_HLC_MS + 1, 0, 0, 0),
        (0, MAX_REGION_ID + 1, 0, 0),
        (0, 0, MAX_WRITER_ID + 1, 0),
        (0, 0, 0, MAX_SEQ_IN_MS + 1),
        (-1, 0, 0, 0),
    ],
)
def test_out_of_range_fields_are_rejected(fields: tuple[int, int, int, int]) -> None:
    with pytest.raises(ValueError):
        compose_message_id(*fields)


def test_byte_codec_rejects_wrong_length_and_range() -> None:
    with pytest.raises(ValueError):
        message_id_from_bytes(b"\x00" * 15)
    with pytest.raises(ValueError):
        message_id_to_bytes(1 << 128)


def test_split_surfaces_nonzero_reserved_bits_for_forward_compatibility() -> None:
    assert split_message_id(0xABC).reserved == 0xABC


def test_last_activity_id_shares_message_id_format_per_spec_6_4() -> None:
    assert compose_last_activity_id is compose_message_id
    assert split_last_activity_id is split_message_id


@given(parts)
def test_compose_split_round_trip(fields: tuple[int, int, int, int]) -> None:
    mid = compose_message_id(*fields)
    assert split_message_id(mid)[:4] == fields
    assert message_id_from_bytes(message_id_to_bytes(mid)) == mid


@given(u128, u128)
def test_encoded_byte_order_equals_numeric_order_per_spec_6_1(a: int, b: int) -> None:
    assert (message_id_to_bytes(a) < message_id_to_bytes(b)) == (a < b)


# --- HLC clock (§6.2 pseudo-code; App. B.2 clock_regression_reject_ms = 5000) -------------


def test_hlc_new_ms_resets_seq_and_same_ms_increments() -> None:
    clock = HlcClock(1, 5)
    a, b, c = clock.assign(1000), clock.assign(1000), clock.assign(1001)
    assert [split_message_id(x)[:4] for x in (a, b, c)] == [
        (1000, 1, 5, 0),
        (1000, 1, 5, 1),
        (1001, 1, 5, 0),
    ]


@pytest.mark.parametrize("behind", [1, 3000, 4999, 5000])
def test_hlc_regression_up_to_and_including_5000_ms_is_absorbed(behind: int) -> None:
    # Spec: reject only if now < last_hlc_ms - 5000, so exactly 5000 behind is absorbed.
    clock = HlcClock(1, 5)
    first = clock.assign(10_000)
    second = clock.assign(10_000 - behind)
    assert second > first
    assert clock.last_hlc_ms == 10_000
    assert split_message_id(second).hlc_ms == 10_000


@pytest.mark.parametrize("behind", [5001, 6000, 30_000])
def test_hlc_regression_beyond_5000_ms_raises_clock_unsafe(behind: int) -> None:
    clock = HlcClock(1, 5)
    clock.assign(100_000)
    before = clock.state()
    with pytest.raises(ClockUnsafeError) as info:
        clock.assign(100_000 - behind)
    assert info.value.code == "CLOCK_UNSAFE"
    assert info.value.regression_ms == behind
    assert clock.state() == before  # a rejected assignment does not touch state


def test_hlc_regression_threshold_is_configurable() -> None:
    clock = HlcClock(1, 5, clock_regression_reject_ms=0)
    clock.assign(100)
    clock.assign(100)
    with pytest.raises(ClockUnsafeError):
        clock.assign(99)


def test_hlc_seq_in_ms_overflow_borrows_next_ms() -> None:
    clock = HlcClock.restore(1000, 1, 5, seq_in_ms=MAX_SEQ_IN_MS - 1)
    last_in_ms = clock.assign(1000)
    borrowed = clock.assign(1000)
    assert split_message_id(last_in_ms)[:4] == (1000, 1, 5, MAX_SEQ_IN_MS)
    assert split_message_id(borrowed)[:4] == (1001, 1, 5, 0)
    assert clock.last_hlc_ms == 1001
    # the real clock catching up with the borrowed ms continues the sequence, never rewinds
    assert split_message_id(clock.assign(1001))[:4] == (1001, 1, 5, 1)


def test_hlc_restore_then_assign_is_strictly_greater_than_every_earlier_id() -> None:
    before = HlcClock(1, 5)
    issued = [before.assign(1000) for _ in range(50)]
    restored = HlcClock.restore(before.last_hlc_ms, 1, 5)
    for now in (990, 1000):  # clock behind or equal after restart
        fresh = HlcClock.restore(before.last_hlc_ms, 1, 5)
        assert fresh.assign(now) > max(issued)
    assert restored.assign(1001) > max(issued)


def test_hlc_restore_with_far_behind_clock_raises_clock_unsafe() -> None:
    clock = HlcClock.restore(100_000, 1, 5)
    with pytest.raises(ClockUnsafeError):
        clock.assign(100_000 - 5001)


def test_hlc_state_is_exportable() -> None:
    clock = HlcClock(3, 9)
    clock.assign(77)
    clock.assign(77)
    assert clock.state() == HlcState(last_hlc_ms=77, seq_in_ms=1)
    assert clock.last_hlc_ms == 77
    state = clock.state()
    resumed = HlcClock.restore(state.last_hlc_ms, 3, 9, seq_in_ms=state.seq_in_ms)
    assert resumed.assign(77) == compose_message_id(77, 3, 9, 2)


def test_hlc_rejects_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        HlcClock(MAX_REGION_ID + 1, 0)
    with pytest.raises(ValueError):
        HlcClock(0, MAX_WRITER_ID + 1)
    with pytest.raises(ValueError):
        HlcClock(0, 0, clock_regression_reject_ms=-1)
    with pytest.raises(ValueError):
        HlcClock(0, 0).assign(-1)
    with pytest.raises(ValueError):
        HlcClock.restore(MAX_HLC_MS + 1, 0, 0)


@given(
    st.integers(0, 1 << 40),
    st.lists(st.integers(-4999, 3), min_size=1, max_size=300),
)
def test_hlc_ids_strictly_increase_under_regressions_below_5000_ms(
    start: int, steps: list[int]
) -> None:
    # Each reading moves the wall clock by `step`; relative to the running max it never falls
    # 5000 ms or more behind, so no reading is rejected and ids must strictly increase.
    clock = HlcClock(7, 11)
    wall, peak = start, start
    previous = -1
    for step in steps:
        wall = max(wall + step, peak - 4999, 0)
        peak = max(peak, wall)
        mid = clock.assign(wall)
        assert mid > previous
        assert split_message_id(mid)[1:3] == (7, 11)
        previous = mid


@given(st.lists(st.integers(0, 40_000), min_size=1, max_size=200))
def test_hlc_rejects_exactly_when_spec_condition_holds_and_accepted_ids_increase(
    readings: list[int],
) -> None:
    clock = HlcClock(0, 1)
    previous = -1
    for now in readings:
        last = clock.last_hlc_ms
        if now < last - 5000:
            with pytest.raises(ClockUnsafeError):
                clock.assign(now)
            assert clock.last_hlc_ms == last
        else:
            mid = clock.assign(now)
            assert mid > previous
            assert clock.last_hlc_ms == max(last, now)
            previous = mid
