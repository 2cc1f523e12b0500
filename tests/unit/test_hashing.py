"""Canonical multi-field hash input (spec §5.2, §6.5.1, §6.7, §7.8; frozen by §27.2.4)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qim.schemas.hashing import (
    FieldSpec,
    HashField,
    blake3_digest,
    digest_u64,
    fixed_uint,
    hash_input,
    parse_hash_input,
    validate_identifier,
)

# Text without NUL and without lone surrogates: exactly the values the encoding accepts.
texts = st.text(st.characters(codec="utf-8", exclude_characters="\x00"))


@st.composite
def schema_and_fields(draw: st.DrawFn) -> tuple[tuple[FieldSpec, ...], tuple[HashField, ...]]:
    specs: list[FieldSpec] = draw(
        st.lists(st.one_of(st.just(str), st.integers(0, 20)), min_size=1, max_size=6)
    )
    fields: list[HashField] = []
    for spec in specs:
        if isinstance(spec, int):
            fields.append(draw(st.binary(min_size=spec, max_size=spec)))
        else:
            fields.append(draw(texts))
    return tuple(specs), tuple(fields)


def test_user_routing_input_is_tenant_nul_user_per_spec_5_2() -> None:
    assert hash_input("t1", "u42") == bytes.fromhex("74 31 00 75 34 32")


def test_event_id_input_terminates_non_last_text_fields_per_spec_6_7() -> None:
    dispatch = bytes.fromhex("1ed4a42fc1cb38a08a02e7b8324ba354")
    expected = bytes.fromhex("7431 00 1ed4a42fc1cb38a08a02e7b8324ba354 753432 00 00")
    assert hash_input("t1", dispatch, "u42", b"\x00") == expected


def test_dispatch_domain_as_text_field_equals_spec_7_8_domain_bytes() -> None:
    domain = b"qim.group-dispatch.v1\x00"
    assert len(domain) == 22
    assert hash_input("qim.group-dispatch.v1", b"\x01" * 16) == domain + b"\x01" * 16


def test_last_text_field_has_no_terminator() -> None:
    assert hash_input("a") == b"a"
    assert hash_input("a", "b") == b"a\x00b"
    assert hash_input(b"\x07", "z") == b"\x07z"


def test_fixed_width_fields_are_raw_with_no_separator() -> None:
    assert hash_input(b"\x00\x01", b"\xff") == b"\x00\x01\xff"


def test_text_field_with_nul_is_rejected_because_it_would_break_injectivity() -> None:
    with pytest.raises(ValueError, match="NUL"):
        hash_input("t\x001", "u")
    with pytest.raises(ValueError, match="NUL"):
        hash_input("t", "u\x00")


def test_lone_surrogate_text_is_rejected_as_value_error() -> None:
    with pytest.raises(ValueError):
        hash_input("\ud800", "u")


def test_empty_tuple_and_wrong_field_types_are_rejected() -> None:
    with pytest.raises(ValueError):
        hash_input()
    with pytest.raises(TypeError):
        hash_input(5)  # type: ignore[arg-type]


def test_text_is_utf8_without_normalization() -> None:
    # NFC "é" and NFD "e\u0301" are different ids: no normalization is applied (§5.2: UTF-8 of
    # the canonical string id, which is the caller's responsibility).
    assert hash_input("é") == b"\xc3\xa9"
    assert hash_input("e\u0301") == b"e\xcc\x81"


@pytest.mark.parametrize("bad", ["", "a\x00b"])
def test_validate_identifier_rejects_empty_and_nul_ids(bad: str) -> None:
    with pytest.raises(ValueError):
        validate_identifier(bad, "user_id")


def test_validate_identifier_rejects_non_str() -> None:
    with pytest.raises(TypeError):
        validate_identifier(b"u42", "user_id")  # type: ignore[arg-type]


def test_fixed_uint_is_big_endian_and_range_checked() -> None:
    assert fixed_uint(242, 4) == bytes.fromhex("000000f2")
    assert fixed_uint(255, 1) == b"\xff"
    with pytest.raises(ValueError):
        fixed_uint(256, 1)
    with pytest.raises(ValueError):
        fixed_uint(-1, 4)
    with pytest.raises(TypeError):
        fixed_uint(True, 1)


def test_digest_helpers_take_first_8_bytes_big_endian_per_app_b1() -> None:
    data = hash_input("t1", "u42")
    assert len(blake3_digest(data)) == 32
    assert blake3_digest(data)[:8].hex() == "4f16cde9893485f2"
    assert digest_u64(data) == 0x4F16CDE9893485F2 == 5698968781396936178


def test_parse_rejects_malformed_inputs() -> None:
    with pytest.raises(ValueError, match="terminator"):
        parse_hash_input(b"abc", (str, str))
    with pytest.raises(ValueError, match="too short"):
        parse_hash_input(b"ab", (4,))
    with pytest.raises(ValueError, match="trailing"):
        parse_hash_input(b"abc", (2,))


@given(schema_and_fields())
def test_hash_input_round_trips_so_it_is_injective_for_a_fixed_schema(
    case: tuple[tuple[FieldSpec, ...], tuple[HashField, ...]],
) -> None:
    schema, fields = case
    assert parse_hash_input(hash_input(*fields), schema) == fields


@given(schema_and_fields(), st.data())
def test_different_field_tuples_give_different_bytes(
    case: tuple[tuple[FieldSpec, ...], tuple[HashField, ...]], data: st.DataObject
) -> None:
    schema, fields = case
    other: list[HashField] = []
    for spec in schema:
        if isinstance(spec, int):
            other.append(data.draw(st.binary(min_size=spec, max_size=spec)))
        else:
            other.append(data.draw(texts))
    if tuple(other) != fields:
        assert hash_input(*other) != hash_input(*fields)


@given(texts.filter(bool), texts.filter(bool), texts.filter(bool), texts.filter(bool))
def test_tenant_user_boundary_cannot_shift(t1: str, u1: str, t2: str, u2: str) -> None:
    # ("ab","c") and ("a","bc") must never collide: the 0x00 separator is length-safe.
    if (t1, u1) != (t2, u2):
        assert hash_input(t1, u1) != hash_input(t2, u2)


def test_schemas_package_imports_no_io_or_runtime_modules() -> None:
    # Contract code must stay pure so client SDK ports and replay tools can trust it.
    banned = ["asyncio", "faust", "aiokafka", "websockets", "redis", "rocksdict"]
    probe = (
        "import sys, qim.schemas.hashing, qim.schemas.routing, qim.schemas.ids, "
        "qim.schemas.seqs, qim.schemas.events; "
        f"print([m for m in {banned!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
