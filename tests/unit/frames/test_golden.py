"""Golden vectors (tests/golden/frames.json): encode == golden and decode(golden) == model."""

from __future__ import annotations

import json
from typing import Any

import crc32c
import msgspec
import pytest

import qim.schemas.frames as frames
from qim.schemas.frames import FRAMES_BY_NAME, Frame, Role, decode_message, encode_frame
from tests.unit.frames.golden import GOLDEN_PATH

VECTORS: list[dict[str, Any]] = json.loads(GOLDEN_PATH.read_text())["vectors"]
HEADER_GROUPS = ("magic", "version", "flags", "opcode", "request_id", "stream_id", "body_len")


def _model(vector: dict[str, Any]) -> frames.Body:
    cls = getattr(frames, vector["model"])
    body = msgspec.json.decode(json.dumps(vector["fields"]), type=cls)
    assert isinstance(body, frames.Body)
    return body


def test_golden_file_covers_a_useful_spread() -> None:
    names = {v["name"] for v in VECTORS}
    assert {"AUTH", "SEND_MESSAGE", "MAILBOX_BATCH", "ERROR", "LEAVE_GROUP", "TYPING"} <= names


@pytest.mark.parametrize("vector", VECTORS, ids=[v["model"] for v in VECTORS])
def test_encode_matches_golden(vector: dict[str, Any]) -> None:
    body = _model(vector)
    encoded = encode_frame(
        body, vector["request_id"], vector["stream_id"], vector["flags"], vector["version"]
    )
    assert encoded.hex() == vector["frame"]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["model"] for v in VECTORS])
def test_labelled_header_groups_match_a1(vector: dict[str, Any]) -> None:
    raw = bytes.fromhex(vector["frame"])
    header = vector["header"]
    covered = bytes.fromhex("".join(header[g] for g in HEADER_GROUPS))
    assert raw[:16] == covered and raw[20:].hex() == vector["body"]
    assert header["magic"] == "514d"
    assert int(header["opcode"], 16) == FRAMES_BY_NAME[vector["name"]].opcode
    assert int(header["request_id"], 16) == vector["request_id"]
    assert int(header["stream_id"], 16) == vector["stream_id"]
    assert int(header["body_len"], 16) == len(raw) - 20
    assert int(header["header_crc"], 16) == crc32c.crc32c(covered)


@pytest.mark.parametrize("vector", VECTORS, ids=[v["model"] for v in VECTORS])
def test_decode_golden_gives_the_model(vector: dict[str, Any]) -> None:
    decoded = decode_message(bytes.fromhex(vector["frame"]), Role(vector["receiver"]))
    assert isinstance(decoded, Frame)
    assert decoded.body == _model(vector)
    assert decoded.name == vector["name"]
