"""Golden vectors in tests/golden/identifiers.json (spec §5.2, §6.2-§6.7, §7.8, §26 #8-12).

Every vector is recomputed from its inputs with qim.schemas; the spec's published worked
examples are additionally asserted literally, so a regenerated file cannot drift silently.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from qim.schemas import (
    ClockUnsafeError,
    EventType,
    HlcClock,
    blake3_digest,
    compose_mailbox_seq,
    compose_message_id,
    compose_room_seq,
    connection_shard_id,
    dispatch_id,
    dispatch_id_input,
    event_id,
    event_id_input,
    hash_input,
    lane_id,
    mailbox_seq_from_bytes,
    mailbox_seq_to_bytes,
    mailbox_shard_id,
    message_id_from_bytes,
    message_id_to_bytes,
    room_seq_from_bytes,
    room_seq_to_bytes,
    seq_bucket,
    split_mailbox_seq,
    split_message_id,
    split_room_seq,
    unix_ms_to_hlc_ms,
    user_bucket,
    user_routing_input,
)

GOLDEN_PATH = Path(__file__).resolve().parents[1] / "golden" / "identifiers.json"
GOLDEN: dict[str, Any] = json.loads(GOLDEN_PATH.read_text(encoding="utf-8"))


def vectors(section: str) -> list[dict[str, Any]]:
    rows = GOLDEN[section]
    assert isinstance(rows, list)
    assert rows, f"golden section {section} is empty"
    return rows


def test_header_documents_the_encodings() -> None:
    assert "description" in GOLDEN
    for key in ("hash_input", "user_bucket", "lane_id", "message_id", "mailbox_seq", "event_id"):
        assert key in GOLDEN["encoding"]


@pytest.mark.parametrize("row", vectors("hash_input"))
def test_hash_input_vectors(row: dict[str, Any]) -> None:
    fields = [
        f["value"] if f["kind"] == "text" else bytes.fromhex(f["value"]) for f in row["fields"]
    ]
    assert hash_input(*fields).hex() == row["input_hex"]


@pytest.mark.parametrize("row", vectors("user_routing"))
def test_user_routing_vectors_spec_5_2(row: dict[str, Any]) -> None:
    tenant, user = row["tenant_id"], row["user_id"]
    data = user_routing_input(tenant, user)
    assert data.hex() == row["input_hex"]
    assert blake3_digest(data).hex() == row["blake3_hex"]
    bucket = user_bucket(tenant, user, row["virtual_bucket_count"])
    assert bucket == row["user_bucket"]
    assert mailbox_shard_id(bucket, row["mailbox_shard_count"]) == row["mailbox_shard_id"]
    assert connection_shard_id(bucket, row["connection_shard_count"]) == row["connection_shard_id"]
    assert lane_id(tenant, user, row["lane_count"]) == row["lane_id"]


@pytest.mark.parametrize("row", vectors("hlc_epoch"))
def test_hlc_epoch_vectors_spec_6_2(row: dict[str, Any]) -> None:
    assert unix_ms_to_hlc_ms(row["unix_ms"]) == row["hlc_ms"]


@pytest.mark.parametrize("row", vectors("message_id"))
def test_message_id_vectors_spec_6_2(row: dict[str, Any]) -> None:
    fields = (row["hlc_ms"], row["region_id"], row["writer_id"], row["seq_in_ms"])
    mid = compose_message_id(*fields)
    assert str(mid) == row["message_id_dec"]
    assert message_id_to_bytes(mid).hex() == row["message_id_hex"]
    assert message_id_from_bytes(bytes.fromhex(row["message_id_hex"])) == mid
    assert split_message_id(mid) == (*fields, 0)


@pytest.mark.parametrize("row", vectors("hlc_clock"), ids=lambda r: r["name"])
def test_hlc_clock_scenarios_spec_6_2(row: dict[str, Any]) -> None:
    restore = row["restore"]
    clock = (
        HlcClock(row["region_id"], row["writer_id"])
        if restore is None
        else HlcClock.restore(
            restore["last_hlc_ms"],
            row["region_id"],
            row["writer_id"],
            seq_in_ms=restore["seq_in_ms"],
        )
    )
    assert clock.clock_regression_reject_ms == row["reject_ms"]
    got: list[str] = []
    for now in row["readings"]:
        try:
            got.append(message_id_to_bytes(clock.assign(now)).hex())
        except ClockUnsafeError as exc:
            got.append(exc.code)
    assert got == row["expected"]


@pytest.mark.parametrize("row", vectors("mailbox_seq"))
def test_mailbox_seq_vectors_spec_6_5(row: dict[str, Any]) -> None:
    seq = compose_mailbox_seq(row["shard_epoch"], row["log_offset"])
    assert str(seq) == row["mailbox_seq_dec"]
    assert mailbox_seq_to_bytes(seq).hex() == row["bytes_hex"]
    assert mailbox_seq_from_bytes(bytes.fromhex(row["bytes_hex"])) == seq
    assert split_mailbox_seq(seq) == (row["shard_epoch"], row["log_offset"])


@pytest.mark.parametrize("row", vectors("room_seq"))
def test_room_seq_vectors_spec_6_6(row: dict[str, Any]) -> None:
    seq = compose_room_seq(row["room_epoch"], row["counter"])
    assert str(seq) == row["room_seq_dec"]
    assert room_seq_to_bytes(seq).hex() == row["bytes_hex"]
    assert room_seq_from_bytes(bytes.fromhex(row["bytes_hex"])) == seq
    assert split_room_seq(seq) == (row["room_epoch"], row["counter"])


@pytest.mark.parametrize("row", vectors("seq_bucket"))
def test_seq_bucket_vectors_app_b2(row: dict[str, Any]) -> None:
    got = seq_bucket(int(row["conversation_seq_dec"]), row["width"])
    assert str(got) == row["seq_bucket_dec"]


@pytest.mark.parametrize("row", vectors("dispatch_id"))
def test_dispatch_id_vectors_spec_7_8(row: dict[str, Any]) -> None:
    mid = message_id_from_bytes(bytes.fromhex(row["message_id_hex"]))
    shard = row["target_mailbox_shard"]
    assert dispatch_id_input(mid, shard).hex() == row["input_hex"]
    assert dispatch_id(mid, shard).hex() == row["dispatch_id_hex"]


@pytest.mark.parametrize("row", vectors("event_id"))
def test_event_id_vectors_spec_6_7(row: dict[str, Any]) -> None:
    etype = EventType[row["event_type"]]
    assert int(etype) == row["event_ordinal"]
    did = bytes.fromhex(row["dispatch_id_hex"])
    data = event_id_input(row["tenant_id"], did, row["user_id"], etype)
    assert data.hex() == row["input_hex"]
    assert blake3_digest(data).hex() == row["blake3_hex"]
    value = event_id(row["tenant_id"], did, row["user_id"], etype)
    assert value.to_bytes(8, "big").hex() == row["event_id_hex"]


INVALID: dict[str, Callable[..., object]] = {
    "compose_mailbox_seq": compose_mailbox_seq,
    "compose_room_seq": compose_room_seq,
    "compose_message_id": compose_message_id,
    "user_bucket": user_bucket,
    "mailbox_seq_from_bytes_hex": lambda h: mailbox_seq_from_bytes(bytes.fromhex(h)),
}


@pytest.mark.parametrize("row", vectors("invalid"))
def test_invalid_vectors_are_rejected(row: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        INVALID[row["function"]](*row["args"])


# --- the spec's published worked examples, asserted literally ------------------------------


def _find(section: str, **match: Any) -> dict[str, Any]:
    hits = [r for r in vectors(section) if all(r.get(k) == v for k, v in match.items())]
    assert hits, f"spec example {match} missing from golden section {section}"
    return hits[0]


def test_golden_file_contains_spec_5_2_routing_example() -> None:
    row = _find(
        "user_routing", tenant_id="t1", user_id="u42", mailbox_shard_count=256, lane_count=64
    )
    assert row["input_hex"] == "743100753432"
    assert row["blake3_hex"][:16] == "4f16cde9893485f2"
    assert row["virtual_bucket_count"] == 65536
    assert row["user_bucket"] == 34290
    assert row["mailbox_shard_id"] == 242
    assert (row["connection_shard_count"], row["connection_shard_id"]) == (1024, 498)
    assert row["lane_id"] == 15


def test_golden_file_contains_spec_6_2_message_id_example() -> None:
    row = _find("message_id", hlc_ms=212544000123, region_id=1, writer_id=5, seq_in_ms=3)
    assert row["message_id_hex"] == "00317c9c107b00100005000003000000"
    assert row["message_id_dec"] == "256949929552869914270661414519570432"
    epoch = _find("hlc_epoch", iso8601="2026-09-26T00:00:00.123Z")
    assert epoch["hlc_ms"] == 212544000123


def test_golden_file_contains_spec_6_5_and_6_6_sequence_examples() -> None:
    mailbox = _find("mailbox_seq", shard_epoch=3, log_offset=10008)
    assert (mailbox["mailbox_seq_dec"], mailbox["bytes_hex"]) == (
        "844424930141976",
        "0003000000002718",
    )
    room = _find("room_seq", room_epoch=2, counter=77)
    assert (room["room_seq_dec"], room["bytes_hex"]) == ("562949953421389", "000200000000004d")


def test_golden_file_contains_spec_7_8_dispatch_and_6_7_event_examples() -> None:
    row = _find(
        "dispatch_id", message_id_hex="00317c9c107b00100005000003000000", target_mailbox_shard=242
    )
    assert row["input_hex"] == (
        "71696d2e67726f75702d64697370617463682e76310000317c9c107b00100005000003000000000000f2"
    )
    assert row["dispatch_id_hex"] == "1ed4a42fc1cb38a08a02e7b8324ba354"
    spec = {"MESSAGE": "561f5eb99bbea73b", "MENTION": "683d6087a1dd6b72"}
    for name, expected in spec.items():
        ev = _find(
            "event_id",
            tenant_id="t1",
            user_id="u42",
            dispatch_id_hex="1ed4a42fc1cb38a08a02e7b8324ba354",
            event_type=name,
        )
        assert ev["event_id_hex"] == expected
    message = _find("event_id", tenant_id="t1", user_id="u42", event_type="MESSAGE")
    assert message["input_hex"] == "7431001ed4a42fc1cb38a08a02e7b8324ba3547534320000"
