"""Ephemeral custom messages on the transient path (spec 13.3 -> 13.2, INV-33).

The relays (one per ConnectionShard, the sender's shard included for its other devices), their
wire form, and the gateway's delivery: PUSH_EVENTS to every live, synced, NORMAL connection of
the recipients, never back to the sending device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import msgspec
import pytest

from qim.core.push import FlowState
from qim.core.transient import ephemeral_entry, ephemeral_relays
from qim.gateway.actions import Send
from qim.gateway.devices import DeviceRegistry
from qim.gateway.push.transient import deliver_ephemeral
from qim.gateway.transport.connection import Connection
from qim.schemas.frames.messaging import PushEvents, SendMessage
from qim.schemas.message_types import MessageType
from qim.schemas.records.requests import SendRequest
from qim.schemas.records.transient import (
    EphemeralRelay,
    decode_ephemeral_relay,
    decode_typing_relay,
    encode_transient,
)

MID = (1234).to_bytes(16, "big")


def request(device: str = "phone") -> SendRequest:
    return SendRequest(
        tenant_id="t",
        sender_id="alice",
        sender_device_id=device,
        session_epoch=1,
        connection_shard=3,
        request_id=9,
        message=SendMessage(
            request_id=9,
            client_message_id="cm-1",
            conversation_id="g:team",
            message_type=MessageType.CUSTOM,
            custom_type="live.cursor",
            payload=b"\x00\x01",
        ),
    )


def relay_for(*recipients: str) -> EphemeralRelay:
    entry = ephemeral_entry(request(), MID, 1_700_000_000_000, 2)
    (relay,) = ephemeral_relays(request(), entry, recipients, lambda _user: 5)
    return relay


def test_one_relay_per_shard_with_the_sender_among_the_recipients() -> None:
    shards = {"alice": 1, "bob": 2, "carol": 1, "dave": 7}
    entry = ephemeral_entry(request(), MID, 1_700_000_000_000, 2)
    relays = ephemeral_relays(
        request(), entry, ["dave", "bob", "alice", "carol"], shards.__getitem__
    )
    assert [(r.connection_shard, r.recipients) for r in relays] == [
        (1, ("alice", "carol")),  # alice: her other devices
        (2, ("bob",)),
        (7, ("dave",)),
    ]
    assert all(r.partition == r.connection_shard and r.entry is entry for r in relays)
    assert {(r.sender_id, r.origin_device_id) for r in relays} == {("alice", "phone")}


def test_the_relay_round_trips_and_is_no_other_kind() -> None:
    relay = relay_for("bob")
    wire = encode_transient(relay)
    assert decode_ephemeral_relay(wire) == relay
    entry = decode_ephemeral_relay(wire).entry
    assert (entry.mailbox_seq, entry.conversation_seq, entry.flags, entry.schema_version) == (
        0,
        0,
        0,
        2,
    )
    assert entry.payload_or_ciphertext == b"\x00\x01" and entry.custom_type == "live.cursor"
    with pytest.raises(msgspec.ValidationError):
        decode_typing_relay(wire)


@dataclass
class FakeBarrier:
    released: bool = True


@dataclass
class FakeSession:
    flow_state: FlowState | None = FlowState.NORMAL
    sync: FakeBarrier | None = None
    grant: object | None = "granted"
    closed: bool = False
    version: int = 1


@dataclass
class FakeConn:
    session: FakeSession = field(default_factory=FakeSession)
    closing: bool = False
    sent: list[Any] = field(default_factory=list)

    def apply(self, actions: list[Any]) -> None:
        self.sent.extend(actions)


def registry(conns: dict[tuple[str, str], FakeConn]) -> DeviceRegistry[Connection]:
    reg: DeviceRegistry[Any] = DeviceRegistry()
    for (user, device), conn in conns.items():
        assert reg.admit("t", user, device, 1, conn, 0).admitted
    return cast(DeviceRegistry[Connection], reg)


def test_delivery_reaches_the_other_devices_never_the_sending_one() -> None:
    conns = {
        ("alice", "phone"): FakeConn(),  # the sending device
        ("alice", "laptop"): FakeConn(),
        ("bob", "phone"): FakeConn(),
        ("bob", "tablet"): FakeConn(FakeSession(flow_state=FlowState.DEGRADED)),
        ("bob", "pc"): FakeConn(FakeSession(sync=FakeBarrier(released=False))),
        ("bob", "old"): FakeConn(closing=True),
    }
    written = deliver_ephemeral(relay_for("alice", "bob"), registry(conns))
    assert written == 2
    got = {key for key, conn in conns.items() if conn.sent}
    assert got == {("alice", "laptop"), ("bob", "phone")}
    (send,) = conns[("bob", "phone")].sent
    assert isinstance(send, Send) and send.request_id == 0
    assert isinstance(send.body, PushEvents) and send.body.last_pushed_user_seq == 0
    (entry,) = send.body.events
    assert entry.message_id == MID and entry.mailbox_seq == 0


def test_a_released_login_barrier_lets_it_through() -> None:
    conns = {("bob", "phone"): FakeConn(FakeSession(sync=FakeBarrier(released=True)))}
    assert deliver_ephemeral(relay_for("bob"), registry(conns)) == 1
