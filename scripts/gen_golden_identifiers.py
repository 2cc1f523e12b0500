"""Regenerate ``tests/golden/identifiers.json`` from qim.schemas.

Usage: ``.venv/bin/python scripts/gen_golden_identifiers.py [--check]``. With ``--check`` the
file is compared instead of written (exit 1 on drift). The tests never trust this script: they
recompute every vector and separately assert the spec's published worked examples literally.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from qim.schemas import (
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
    mailbox_seq_to_bytes,
    mailbox_shard_id,
    message_id_to_bytes,
    room_seq_to_bytes,
    seq_bucket,
    unix_ms_to_hlc_ms,
    user_bucket,
    user_routing_input,
)
from qim.schemas.ids import ClockUnsafeError

OUT = Path(__file__).resolve().parent.parent / "tests" / "golden" / "identifiers.json"
SPEC_MID = compose_message_id(212544000123, 1, 5, 3)

HEADER: dict[str, Any] = {
    "description": (
        "Golden vectors for qim identifiers, hash inputs and byte encodings (spec seed002 "
        "§5.2, §6.2-§6.7, §7.8, App. B.1/B.2). Client SDKs in any language must reproduce "
        "every value byte for byte. These encodings are immutable contract (§27.2.4)."
    ),
    "encoding": {
        "hex": "lowercase hex, no separators, most significant byte first",
        "integers": "JSON numbers when < 2**53; u64/u128 values as decimal strings (*_dec)",
        "byte_order": "every integer is big-endian, so byte order equals numeric order (§6.1)",
        "hash": "BLAKE3-256 (32-byte digest); 'first 8 bytes big-endian' = be_u64(digest[0:8])",
        "hash_input": (
            "text fields: UTF-8, must not contain NUL, followed by one 0x00 terminator unless "
            "the field is the last one; fixed-width fields (bytes, big-endian integers) are "
            "written raw with no separator. Injective for a fixed field schema."
        ),
        "user_routing_input": "text(tenant_id) || 0x00 || text(user_id)",
        "user_bucket": "be_u64(blake3(input)[0:8]) & (virtual_bucket_count - 1)",
        "mailbox_shard_id": "user_bucket & (mailbox_shard_count - 1)",
        "connection_shard_id": "user_bucket & (connection_shard_count - 1)",
        "lane_id": "blake3(input)[0] & (lane_count - 1)",
        "message_id": (
            "u128 = hlc_ms(48) | region_id(12) | writer_id(20) | seq_in_ms(24) | reserved(24)=0; "
            "hlc_ms = unix_ms - 1577836800000 (epoch 2020-01-01T00:00:00Z); 16 bytes"
        ),
        "mailbox_seq": "u64 = 0(1) | shard_epoch(15) | log_offset(48); 8 bytes",
        "room_seq": "u64 = 0(1) | room_epoch(15) | counter(48); 8 bytes",
        "seq_bucket": "conversation_seq // width (default 4096)",
        "dispatch_id": (
            "blake3('qim.group-dispatch.v1' || 0x00 || message_id_be16 || shard_be4)[0:16]"
        ),
        "event_id": (
            "be_u64(blake3(tenant || 0x00 || dispatch_id(16) || user || 0x00 || "
            "u8(event_ordinal))[0:8]); ordinals MESSAGE=0 MENTION=1 MEMBERSHIP=2 CONTROL=3"
        ),
    },
}

ROUTING_CASES: list[tuple[str, str, int, int, int, int]] = [
    ("t1", "u42", 65536, 256, 1024, 64),
    ("t1", "u42", 65536, 64, 1024, 256),
    ("t1", "u43", 65536, 256, 1024, 64),
    ("ab", "c", 65536, 256, 1024, 64),
    ("a", "bc", 65536, 256, 1024, 64),
    ("租户-α", "用户😀", 65536, 256, 1024, 64),
    ("Ωmega", "e\u0301", 65536, 256, 1024, 64),
    ("tenant-" + "x" * 250, "user-" + "9" * 1000, 65536, 256, 1024, 64),
    ("t", "u", 1, 1, 1, 1),
]

MID_CASES: list[tuple[int, int, int, int]] = [
    (212544000123, 1, 5, 3),
    (0, 0, 0, 0),
    (0, 0, 0, (1 << 24) - 1),
    (0, (1 << 12) - 1, 0, 0),
    (0, 0, (1 << 20) - 1, 0),
    ((1 << 48) - 1, 0, 0, 0),
    ((1 << 48) - 1, (1 << 12) - 1, (1 << 20) - 1, (1 << 24) - 1),
]

SEQ_CASES: list[tuple[int, int]] = [
    (3, 10008),
    (2, 77),
    (0, 0),
    (1, 0),
    (0, (1 << 48) - 1),
    (0x7FFF, 0),
    (0x7FFF, (1 << 48) - 1),
]

HLC_SCENARIOS: list[dict[str, Any]] = [
    {"name": "forward then same ms", "restore": None, "readings": [1000, 1000, 1001]},
    {"name": "3 s step back absorbed", "restore": None, "readings": [10000, 7000, 7001]},
    {"name": "exactly 5000 ms back absorbed", "restore": None, "readings": [10000, 5000]},
    {"name": "5001 ms back rejected", "restore": None, "readings": [10000, 4999, 10000]},
    {
        "name": "seq_in_ms overflow borrows next ms",
        "restore": {"last_hlc_ms": 1000, "seq_in_ms": (1 << 24) - 2},
        "readings": [1000, 1000, 1000],
    },
    {
        "name": "restore without seq treats the ms as exhausted",
        "restore": {"last_hlc_ms": 1000, "seq_in_ms": None},
        "readings": [1000, 999, 1002],
    },
    {
        "name": "restore then far-behind clock rejected",
        "restore": {"last_hlc_ms": 100000, "seq_in_ms": None},
        "readings": [94999],
    },
]


def _routing(case: tuple[str, str, int, int, int, int]) -> dict[str, Any]:
    tenant, user, vbc, msc, csc, lanes = case
    data = user_routing_input(tenant, user)
    bucket = user_bucket(tenant, user, vbc)
    return {
        "tenant_id": tenant,
        "user_id": user,
        "input_hex": data.hex(),
        "blake3_hex": blake3_digest(data).hex(),
        "virtual_bucket_count": vbc,
        "user_bucket": bucket,
        "mailbox_shard_count": msc,
        "mailbox_shard_id": mailbox_shard_id(bucket, msc),
        "connection_shard_count": csc,
        "connection_shard_id": connection_shard_id(bucket, csc),
        "lane_count": lanes,
        "lane_id": lane_id(tenant, user, lanes),
    }


def _mid(case: tuple[int, int, int, int]) -> dict[str, Any]:
    mid = compose_message_id(*case)
    hlc, region, writer, seq = case
    return {
        "hlc_ms": hlc,
        "region_id": region,
        "writer_id": writer,
        "seq_in_ms": seq,
        "message_id_hex": message_id_to_bytes(mid).hex(),
        "message_id_dec": str(mid),
    }


def _seq(case: tuple[int, int], room: bool) -> dict[str, Any]:
    epoch, counter = case
    if room:
        value = compose_room_seq(epoch, counter)
        return {
            "room_epoch": epoch,
            "counter": counter,
            "room_seq_dec": str(value),
            "bytes_hex": room_seq_to_bytes(value).hex(),
        }
    value = compose_mailbox_seq(epoch, counter)
    return {
        "shard_epoch": epoch,
        "log_offset": counter,
        "mailbox_seq_dec": str(value),
        "bytes_hex": mailbox_seq_to_bytes(value).hex(),
    }


def _hlc(scenario: dict[str, Any]) -> dict[str, Any]:
    restore = scenario["restore"]
    clock = (
        HlcClock(1, 5)
        if restore is None
        else HlcClock.restore(restore["last_hlc_ms"], 1, 5, seq_in_ms=restore["seq_in_ms"])
    )
    results: list[str] = []
    for now in scenario["readings"]:
        try:
            results.append(message_id_to_bytes(clock.assign(now)).hex())
        except ClockUnsafeError as exc:
            results.append(exc.code)
    return {**scenario, "region_id": 1, "writer_id": 5, "reject_ms": 5000, "expected": results}


def _events() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cases = [
        (SPEC_MID, 242, "t1", "u42"),
        (SPEC_MID, 242, "租户", "用户😀"),
        (compose_message_id(1, 0, 0, 0), 0, "t1", "u" * 300),
    ]
    for mid, shard, tenant, user in cases:
        did = dispatch_id(mid, shard)
        for etype in EventType:
            data = event_id_input(tenant, did, user, etype)
            out.append(
                {
                    "tenant_id": tenant,
                    "user_id": user,
                    "dispatch_id_hex": did.hex(),
                    "event_type": etype.name,
                    "event_ordinal": int(etype),
                    "input_hex": data.hex(),
                    "blake3_hex": blake3_digest(data).hex(),
                    "event_id_hex": event_id(tenant, did, user, etype).to_bytes(8, "big").hex(),
                }
            )
    return out


def build() -> dict[str, Any]:
    dispatch_cases = [
        (SPEC_MID, 242),
        (SPEC_MID, 0),
        (SPEC_MID, (1 << 32) - 1),
        (0, 0),
        ((1 << 128) - 1 - ((1 << 24) - 1), 1023),
    ]
    hash_cases: list[list[tuple[str, str]]] = [
        [("text", "t1"), ("text", "u42")],
        [("text", "t1"), ("bytes", "00" * 16), ("text", "u42"), ("bytes", "00")],
        [("text", ""), ("text", "")],
        [("text", "é"), ("bytes", "ffff"), ("text", "末")],
        [("bytes", "0102"), ("text", "x")],
    ]
    return {
        **HEADER,
        "hash_input": [
            {
                "fields": [{"kind": k, "value": v} for k, v in fields],
                "input_hex": hash_input(
                    *(v if k == "text" else bytes.fromhex(v) for k, v in fields)
                ).hex(),
            }
            for fields in hash_cases
        ],
        "user_routing": [_routing(c) for c in ROUTING_CASES],
        "hlc_epoch": [
            {"unix_ms": ms, "iso8601": iso, "hlc_ms": unix_ms_to_hlc_ms(ms)}
            for ms, iso in [
                (1577836800000, "2020-01-01T00:00:00.000Z"),
                (1790380800123, "2026-09-26T00:00:00.123Z"),
            ]
        ],
        "message_id": [_mid(c) for c in MID_CASES],
        "hlc_clock": [_hlc(s) for s in HLC_SCENARIOS],
        "mailbox_seq": [_seq(c, room=False) for c in SEQ_CASES],
        "room_seq": [_seq(c, room=True) for c in SEQ_CASES],
        "seq_bucket": [
            {"conversation_seq_dec": str(s), "width": w, "seq_bucket_dec": str(seq_bucket(s, w))}
            for s, w in [
                (0, 4096),
                (4095, 4096),
                (4096, 4096),
                (10008, 4096),
                ((1 << 64) - 1, 4096),
            ]
        ],
        "dispatch_id": [
            {
                "message_id_hex": message_id_to_bytes(m).hex(),
                "target_mailbox_shard": s,
                "input_hex": dispatch_id_input(m, s).hex(),
                "dispatch_id_hex": dispatch_id(m, s).hex(),
            }
            for m, s in dispatch_cases
        ],
        "event_id": _events(),
        "invalid": [
            {"function": "compose_mailbox_seq", "args": [0x8000, 0]},
            {"function": "compose_mailbox_seq", "args": [0, 1 << 48]},
            {"function": "compose_room_seq", "args": [0x8000, 0]},
            {"function": "compose_message_id", "args": [1 << 48, 0, 0, 0]},
            {"function": "compose_message_id", "args": [0, 1 << 12, 0, 0]},
            {"function": "compose_message_id", "args": [0, 0, 1 << 20, 0]},
            {"function": "compose_message_id", "args": [0, 0, 0, 1 << 24]},
            {"function": "user_bucket", "args": ["", "u42"]},
            {"function": "user_bucket", "args": ["t1", ""]},
            {"function": "user_bucket", "args": ["t\u00001", "u42"]},
            {"function": "mailbox_seq_from_bytes_hex", "args": ["8000000000000000"]},
        ],
    }


def render() -> str:
    return json.dumps(build(), ensure_ascii=False, indent=2) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the file is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        if OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} is stale; rerun without --check", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
