"""to-gateway records -> the connection they are for (qim.gateway.routing.replies), pure.

Invariants: a reply reaches only the live connection of (tenant, user, device) whose
session_epoch equals the reply's (§15.2.2); any other record - another kind on the topic
(PushBatch, §27.2.1), garbage, a null value - is classified, never raised.
"""

from __future__ import annotations

import msgspec
import pytest

from qim.gateway.actions import Send
from qim.gateway.devices import DeviceRegistry
from qim.gateway.routing.replies import ReplyVerdict, record_kind, reply_send, resolve_reply
from qim.schemas.frames import Error, ErrorCode, MemberListBatch, SendAck
from qim.schemas.records.requests import WriterReply, encode_record


def reply(**overrides: object) -> WriterReply:
    fields: dict[str, object] = {
        "tenant_id": "t1",
        "user_id": "alice",
        "device_id": "phone",
        "session_epoch": 7,
        "connection_shard": 3,
        "request_id": 21,
        "send_ack": SendAck(request_id=21, client_message_id="m1", conversation_seq=5),
    }
    fields.update(overrides)
    return WriterReply(**fields)  # type: ignore[arg-type]


@pytest.fixture
def registry() -> DeviceRegistry[str]:
    devices: DeviceRegistry[str] = DeviceRegistry()
    devices.admit("t1", "alice", "phone", 7, "conn-phone", 0)
    devices.admit("t1", "alice", "laptop", 3, "conn-laptop", 0)
    devices.admit("t1", "bob", "phone", 7, "conn-bob", 0)
    devices.admit("t2", "alice", "phone", 7, "conn-other-tenant", 0)
    return devices


def test_a_reply_goes_to_the_device_with_the_same_session_epoch(
    registry: DeviceRegistry[str],
) -> None:
    sent = reply()
    resolved = resolve_reply(encode_record(sent), registry)
    assert resolved.verdict is ReplyVerdict.DELIVER
    assert resolved.conn == "conn-phone" and resolved.reply == sent


def test_a_reply_to_a_replaced_session_is_dropped(registry: DeviceRegistry[str]) -> None:
    """The phone reconnected (epoch 8 holds the slot): the answer to epoch 7 has no reader."""
    registry.admit("t1", "alice", "phone", 8, "conn-phone-2", 1)
    resolved = resolve_reply(encode_record(reply()), registry)
    assert resolved.verdict is ReplyVerdict.STALE_EPOCH and resolved.conn is None
    newer = resolve_reply(encode_record(reply(session_epoch=9)), registry)
    assert newer.verdict is ReplyVerdict.STALE_EPOCH  # only equality delivers


def test_a_reply_for_a_device_not_connected_here_is_dropped(
    registry: DeviceRegistry[str],
) -> None:
    resolved = resolve_reply(encode_record(reply(device_id="tablet")), registry)
    assert resolved.verdict is ReplyVerdict.NO_SESSION and resolved.conn is None


@pytest.mark.parametrize(
    ("value", "verdict", "kind"),
    [
        (
            msgspec.msgpack.encode({"kind": "push_batch", "user_id": "alice"}),
            "unknown",
            "push_batch",
        ),
        (msgspec.msgpack.encode({"kind": "Weird Kind!"}), "unknown", "other"),
        (msgspec.msgpack.encode({"kind": "reply", "tenant_id": "t1"}), "malformed", "reply"),
        (msgspec.msgpack.encode([1, 2, 3]), "malformed", "other"),
        (b"\xc1 not msgpack", "malformed", "other"),
        (b"", "malformed", "null"),
        (None, "malformed", "null"),
    ],
)
def test_other_records_are_classified_never_raised(
    registry: DeviceRegistry[str], value: bytes | None, verdict: str, kind: str
) -> None:
    expected = ReplyVerdict.UNKNOWN_KIND if verdict == "unknown" else ReplyVerdict.MALFORMED
    resolved = resolve_reply(value, registry)
    assert resolved.verdict is expected and resolved.kind == kind and resolved.conn is None


def test_a_reply_with_two_bodies_is_malformed(registry: DeviceRegistry[str]) -> None:
    both = msgspec.msgpack.encode(
        {
            "kind": "reply",
            "tenant_id": "t1",
            "user_id": "alice",
            "device_id": "phone",
            "session_epoch": 7,
            "connection_shard": 3,
            "request_id": 1,
            "send_ack": {},
            "error": {"code": 15},
        }
    )
    assert resolve_reply(both, registry).verdict is ReplyVerdict.MALFORMED


def test_record_kind_reads_only_the_tag() -> None:
    assert record_kind(encode_record(reply())) == "reply"
    assert record_kind(msgspec.msgpack.encode({"a": 1})) is None
    assert record_kind(b"\xff") is None


def test_the_frame_carries_the_requests_id_and_the_body_echoes_it() -> None:
    ack = reply(send_ack=SendAck(client_message_id="m1"))
    assert reply_send(ack, 1) == Send(
        SendAck(request_id=21, client_message_id="m1"), request_id=21, version=1
    )
    error = reply(send_ack=None, error=Error(code=int(ErrorCode.RATE_LIMITED), retry_after_ms=50))
    send = reply_send(error, 1)
    assert isinstance(send.body, Error) and send.body.request_id == 21 and send.request_id == 21
    members = reply(send_ack=None, members=MemberListBatch(total_hint=2))
    assert reply_send(members, 1) == Send(MemberListBatch(total_hint=2), request_id=21, version=1)
