"""The one canonical encoding of multi-field hash inputs (spec §5.2, §6.5.1, §6.7, §7.8).

Every derived identifier (``user_bucket``, ``lane_id``, ``event_id``, ``dispatch_id``) hashes
a tuple of fields. The spec leaves the tuple serialization to an ADR and then freezes it as an
immutable contract item (§27.2.4), so every derivation in qim MUST go through
:func:`hash_input` instead of concatenating bytes ad hoc.

Rule (matches every worked example in the spec):

* ``str`` fields are variable-length: UTF-8, must not contain U+0000, and are followed by a
  single ``0x00`` terminator -- except when the string is the LAST field of the tuple, where
  the end of the input already delimits it.
* ``bytes`` fields are fixed-width (the width is part of the derivation's schema, e.g. a
  16-byte ``dispatch_id`` or a ``u8`` ordinal) and are written raw, big-endian, with no
  separator.

Given the schema (the ordered list of field kinds and widths) the encoding is injective:
:func:`parse_hash_input` recovers the fields, which is the constructive proof used by tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from blake3 import blake3

__all__ = [
    "DIGEST_SIZE",
    "FieldSpec",
    "HashField",
    "blake3_digest",
    "digest_u64",
    "fixed_uint",
    "hash_input",
    "parse_hash_input",
    "validate_identifier",
]

HashField = str | bytes
"""A hash-input field: ``str`` = variable-length UTF-8 text, ``bytes`` = fixed-width raw."""

FieldSpec = type[str] | int
"""A schema entry for :func:`parse_hash_input`: ``str`` or the byte width of a fixed field."""

DIGEST_SIZE: Final = 32
_TERMINATOR: Final = b"\x00"


def _encode_text(value: str) -> bytes:
    if "\x00" in value:
        raise ValueError("hash-input text field must not contain NUL (U+0000)")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates have no UTF-8 form
        raise ValueError(f"hash-input text field is not valid Unicode: {exc}") from exc


def hash_input(*fields: HashField) -> bytes:
    """Serialize fields with the canonical rule so every derivation hashes identical bytes."""
    if not fields:
        raise ValueError("hash input needs at least one field")
    out = bytearray()
    last = len(fields) - 1
    for index, field in enumerate(fields):
        if isinstance(field, str):
            out += _encode_text(field)
            if index != last:
                out += _TERMINATOR
        elif isinstance(field, bytes | bytearray):
            out += field
        else:
            raise TypeError(f"hash-input field must be str or bytes, got {type(field).__name__}")
    return bytes(out)


def parse_hash_input(data: bytes, schema: Sequence[FieldSpec]) -> tuple[HashField, ...]:
    """Invert :func:`hash_input` for a known schema; exists to prove the encoding injective."""
    fields: list[HashField] = []
    pos = 0
    last = len(schema) - 1
    for index, spec in enumerate(schema):
        if isinstance(spec, int):
            if spec < 0 or pos + spec > len(data):
                raise ValueError("hash input too short for its fixed-width field")
            fields.append(data[pos : pos + spec])
            pos += spec
        elif index == last:
            fields.append(data[pos:].decode("utf-8"))
            pos = len(data)
        else:
            end = data.find(_TERMINATOR, pos)
            if end < 0:
                raise ValueError("hash input text field has no NUL terminator")
            fields.append(data[pos:end].decode("utf-8"))
            pos = end + 1
    if pos != len(data):
        raise ValueError("hash input has trailing bytes beyond its schema")
    return tuple(fields)


def fixed_uint(value: int, width: int) -> bytes:
    """Big-endian fixed-width field: byte order must equal numeric order (spec §6.1)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("fixed-width integer field must be an int")
    if not 0 <= value < 1 << (8 * width):
        raise ValueError(f"{value} does not fit an unsigned {width}-byte field")
    return value.to_bytes(width, "big")


def validate_identifier(value: str, name: str) -> str:
    """Reject ids that would make the hash input ambiguous or meaningless (empty, NUL)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be str, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must be non-empty")
    if "\x00" in value:
        raise ValueError(f"{name} must not contain NUL (U+0000)")
    return value


def blake3_digest(data: bytes) -> bytes:
    """BLAKE3-256 -- the only hash family of the routing and idempotency contract (§27.2.4)."""
    return blake3(data).digest()


def digest_u64(data: bytes) -> int:
    """``be_u64(blake3(data)[0:8])``: the "first 8 bytes, big-endian" rule of App. B.1."""
    return int.from_bytes(blake3_digest(data)[:8], "big")
