"""The golden frame vectors in tests/golden/frames.json, and how they were made.

Regenerate only for an intended wire change: ``python -m tests.unit.frames.golden``. The test
(test_golden.py) reads the file and never this module's bytes, so a codec change that alters
the wire shows up as a failing diff, not a silently updated vector.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from qim.schemas.frames import (
    HEADER_SIZE,
    Auth,
    Body,
    ErrorCode,
    EventType,
    LeaveGroup,
    MailboxBatch,
    MailboxCursor,
    MediaMetadata,
    MentionType,
    OnlineReady,
    Ping,
    PushEvents,
    Role,
    SendAck,
    SendMessage,
    SyncEntry,
    TypingDown,
    encode_frame,
    spec_for_model,
    u128_to_bytes,
)
from qim.schemas.frames import Error as ErrorFrame

GOLDEN_PATH = Path(__file__).resolve().parents[2] / "golden" / "frames.json"

# (body, request_id, stream_id or None, flags, version)
_ENTRY = SyncEntry(
    mailbox_seq=(3 << 48) | 1001,
    event_ordinal=EventType.MESSAGE,
    event_id=0x1122334455667788,
    event_type=EventType.MESSAGE,
    message_id=u128_to_bytes(0x0001_0203_0405_0607_0809_0A0B_0C0D_0E0F),
    conversation_id="g:team",
    conversation_seq=42,
    last_activity_id=u128_to_bytes(0x0001_0203_0405_0607_0809_0A0B_0C0D_0E10),
    sender_id="u:alice",
    flags=0x07,
    mention_type=MentionType.AT_ME,
    created_at=1_767_225_600_000,
    body_included=True,
    message_type=1,
    payload_or_ciphertext=b"hello",
    media_metadata=MediaMetadata(object_id="obj-1", mime="image/png", byte_size=2048),
)
CASES: list[tuple[Body, int, int | None, int, int]] = [
    (
        Auth(
            access_token="tok",
            device_id="d1",
            client_version="1.4.0",
            capabilities=0x05,
            mailbox_cursor=MailboxCursor(token=b"\x01\x02", last_applied_mailbox_seq=77),
        ),
        1,
        None,
        0,
        1,
    ),
    (
        Ping(ping_id=9, client_time=1_767_225_600_000, network_type="wifi", probe=True),
        2,
        None,
        0,
        1,
    ),
    (
        SendMessage(
            request_id=7,
            client_message_id="cm-7",
            conversation_id="g:team",
            message_type=8,
            custom_type="card.order",
            payload=b"\x00\x01",
            mention_targets=("u:bob", "@all"),
            reply_to_conversation_seq=41,
        ),
        7,
        None,
        0,
        1,
    ),
    (
        SendAck(
            request_id=7,
            client_message_id="cm-7",
            message_id=u128_to_bytes(2**127 + 1),
            conversation_seq=43,
            last_activity_id=u128_to_bytes(2**127 + 2),
        ),
        7,
        None,
        0,
        1,
    ),
    (
        MailboxBatch(
            entries=(_ENTRY,),
            covered_through_seq=(3 << 48) | 1001,
            lane_watermark=(3 << 48) | 2000,
            has_more=True,
        ),
        12,
        None,
        0,
        1,
    ),
    (PushEvents(events=(_ENTRY,), last_pushed_user_seq=5), 0, None, 0x08, 1),
    (
        ErrorFrame(
            code=ErrorCode.CURSOR_EXPIRED,
            detail="cursor behind trim watermark",
            request_id=3,
            trim_watermark=(3 << 48) | 500,
            rebuild_required=True,
        ),
        3,
        None,
        0,
        1,
    ),
    (LeaveGroup(group_id="g:team"), 21, None, 0, 1),
    (OnlineReady(), 0, None, 0, 1),
    (TypingDown(conversation_id="g:team", user_id="u:bob", expires_in_ms=5000), 0, None, 0, 1),
]


def _hex(data: bytes, start: int, end: int) -> str:
    return data[start:end].hex()


def vector(body: Body, request_id: int, stream_id: int | None, flags: int, version: int) -> Any:
    spec = spec_for_model(type(body))
    sender = Role.CLIENT if body.__class__ is spec.uplink else Role.SERVER
    frame = encode_frame(body, request_id, stream_id, flags, version)
    return {
        "name": spec.name,
        "model": type(body).__name__,
        "receiver": (Role.SERVER if sender is Role.CLIENT else Role.CLIENT).value,
        "request_id": request_id,
        "stream_id": spec.stream if stream_id is None else stream_id,
        "flags": flags,
        "version": version,
        "fields": msgspec.to_builtins(body),
        "header": {
            "magic": _hex(frame, 0, 2),
            "version": _hex(frame, 2, 3),
            "flags": _hex(frame, 3, 4),
            "opcode": _hex(frame, 4, 6),
            "request_id": _hex(frame, 6, 10),
            "stream_id": _hex(frame, 10, 12),
            "body_len": _hex(frame, 12, 16),
            "header_crc": _hex(frame, 16, 20),
        },
        "body": frame[HEADER_SIZE:].hex(),
        "frame": frame.hex(),
    }


def build() -> dict[str, Any]:
    return {
        "about": (
            "Golden frames of App. A (qim.schemas.frames). header groups are big-endian hex; "
            "header_crc = CRC32C of the 16 octets before it; body = msgpack map, defaults "
            "omitted, u128 as 16-octet bin; fields = the body as JSON (bytes base64)."
        ),
        "vectors": [vector(*case) for case in CASES],
    }


if __name__ == "__main__":
    GOLDEN_PATH.write_text(json.dumps(build(), indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {GOLDEN_PATH}")
