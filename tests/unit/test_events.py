"""dispatch_id (spec §7.8, §26 #9) and event_id / event_ordinal (spec §6.7, §27.2.4)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qim.schemas.events import (
    DISPATCH_ID_DOMAIN,
    EventType,
    dispatch_id,
    dispatch_id_input,
    event_id,
    event_id_input,
    event_id_to_bytes,
    event_ordinal,
)
from qim.schemas.ids import compose_message_id

SPEC_MESSAGE_ID = int("00317c9c107b00100005000003000000", 16)
SPEC_DISPATCH_ID = bytes.fromhex("1ed4a42fc1cb38a08a02e7b8324ba354")

ids = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1)


def test_spec_7_8_dispatch_id_worked_example() -> None:
    expected_input = bytes.fromhex(
        "71696d2e67726f75702d64697370617463682e7631 00 00317c9c107b00100005000003000000 000000f2"
    )
    assert len(expected_input) == 42
    assert dispatch_id_input(SPEC_MESSAGE_ID, 242) == expected_input
    assert dispatch_id(SPEC_MESSAGE_ID, 242) == SPEC_DISPATCH_ID


def test_spec_7_8_python_reference_expression_matches() -> None:
    from blake3 import blake3

    mid, shard = SPEC_MESSAGE_ID, 242
    reference = blake3(
        b"qim.group-dispatch.v1\x00" + mid.to_bytes(16, "big") + shard.to_bytes(4, "big")
    )
    assert dispatch_id(mid, shard) == reference.digest()[:16]
    assert DISPATCH_ID_DOMAIN.encode() + b"\x00" == b"qim.group-dispatch.v1\x00"


def test_dispatch_id_rejects_text_concatenation_style_inputs() -> None:
    # A decimal-string shard would be a different 42-byte input; only be4 is valid (§7.8).
    assert dispatch_id(SPEC_MESSAGE_ID, 242) != dispatch_id(SPEC_MESSAGE_ID, int("242", 16))
    with pytest.raises(ValueError):
        dispatch_id(SPEC_MESSAGE_ID, 1 << 32)
    with pytest.raises(ValueError):
        dispatch_id(SPEC_MESSAGE_ID, -1)
    with pytest.raises(ValueError):
        dispatch_id(1 << 128, 0)


def test_spec_6_7_event_id_worked_examples() -> None:
    message_input = bytes.fromhex("7431 00 1ed4a42fc1cb38a08a02e7b8324ba354 753432 00 00")
    assert event_id_input("t1", SPEC_DISPATCH_ID, "u42", EventType.MESSAGE) == message_input
    assert event_id("t1", SPEC_DISPATCH_ID, "u42", EventType.MESSAGE) == 0x561F5EB99BBEA73B
    assert event_id("t1", SPEC_DISPATCH_ID, "u42", EventType.MENTION) == 0x683D6087A1DD6B72
    assert event_id_to_bytes(0x561F5EB99BBEA73B).hex() == "561f5eb99bbea73b"


def test_event_ordinal_map_is_frozen_per_spec_6_7() -> None:
    assert [(t.name, int(t)) for t in EventType] == [
        ("MESSAGE", 0),
        ("MENTION", 1),
        ("MEMBERSHIP", 2),
        ("CONTROL", 3),
    ]
    assert [event_ordinal(t) for t in EventType] == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        event_ordinal(7)  # type: ignore[arg-type]


def test_one_event_per_type_in_a_group_gets_distinct_ids() -> None:
    got = {event_id("t1", SPEC_DISPATCH_ID, "u42", t) for t in EventType}
    assert len(got) == len(EventType)


@pytest.mark.parametrize("bad", [b"", b"\x00" * 15, b"\x00" * 17])
def test_event_id_requires_16_raw_dispatch_bytes(bad: bytes) -> None:
    with pytest.raises(ValueError):
        event_id("t1", bad, "u42", EventType.MESSAGE)


@pytest.mark.parametrize(("tenant", "user"), [("", "u42"), ("t1", ""), ("t1", "u\x0042")])
def test_event_id_rejects_invalid_ids(tenant: str, user: str) -> None:
    with pytest.raises(ValueError):
        event_id(tenant, SPEC_DISPATCH_ID, user, EventType.MESSAGE)


@given(st.integers(0, (1 << 48) - 1), st.integers(0, (1 << 32) - 1), st.integers(0, (1 << 32) - 1))
def test_dispatch_id_is_deterministic_and_shard_specific(hlc: int, s1: int, s2: int) -> None:
    mid = compose_message_id(hlc, 1, 2, 3)
    assert dispatch_id(mid, s1) == dispatch_id(mid, s1)
    assert len(dispatch_id(mid, s1)) == 16
    if s1 != s2:
        assert dispatch_id(mid, s1) != dispatch_id(mid, s2)


@given(ids, ids, st.sampled_from(list(EventType)))
def test_event_id_is_a_deterministic_u64(tenant: str, user: str, etype: EventType) -> None:
    value = event_id(tenant, SPEC_DISPATCH_ID, user, etype)
    assert 0 <= value < 1 << 64
    assert value == event_id(tenant, SPEC_DISPATCH_ID, user, etype)
