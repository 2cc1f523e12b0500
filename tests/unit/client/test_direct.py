"""One-to-one sends in the SDK: the derived conversation id and peer_user_id on the wire.

The id must equal the server's derivation (``qim.core.conversation.ids``: order-independent,
tenant-scoped); the client's identity comes from the app or the access token's claims, never
guessed (qim.client.identity).
"""

from __future__ import annotations

import base64
import json

import pytest

from qim.client import (
    HeartbeatConfig,
    Identity,
    MemoryNetwork,
    QimClient,
    direct_conversation_id,
    identity_from_token,
)
from qim.core.conversation import ids
from qim.schemas.frames import Frame, SendAck, SendMessage

from .fake_server import FakeServer, FakeSession


def qim_token(claims: object) -> str:
    payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"qat1.k1.{payload}.c2ln"


async def ack(session: FakeSession, frame: Frame) -> None:
    body = frame.body
    assert isinstance(body, SendMessage)
    await session.send(
        SendAck(request_id=frame.header.request_id, client_message_id=body.client_message_id),
        frame.header.request_id,
    )


def make_client(network: MemoryNetwork) -> QimClient:
    return QimClient(
        dial=network.dial, heartbeat=HeartbeatConfig(enabled=False), request_timeout=2.0
    )


def test_the_sdk_derives_the_servers_direct_id() -> None:
    assert direct_conversation_id is ids.direct_conversation_id
    me = Identity("t1", "alice")
    assert me.direct_conversation_id("bob") == Identity("t1", "bob").direct_conversation_id("alice")
    assert me.direct_conversation_id("bob") != Identity("t2", "alice").direct_conversation_id("bob")


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        (qim_token({"tenant_id": "t1", "user_id": "alice", "exp": 1}), Identity("t1", "alice")),
        (qim_token({"tenant_id": "t1"}), None),
        (qim_token(["t1", "alice"]), None),
        (qim_token({"tenant_id": 1, "user_id": "alice"}), None),
        ("qrt1.k1.e30.c2ln", None),  # a route token is not an access token
        ("qat1.k1.!!!.c2ln", None),
        ("opaque-oauth-token", None),
        ("", None),
    ],
)
def test_identity_is_read_from_qim_access_tokens_only(
    token: str, expected: Identity | None
) -> None:
    assert identity_from_token(token) == expected


async def test_send_direct_uses_the_tokens_identity(network: MemoryNetwork) -> None:
    server = FakeServer(on_request=ack)
    url = network.listen("gw", server.handle)
    token = qim_token({"tenant_id": "t1", "user_id": "alice"})
    async with make_client(network) as client:
        await client.connect(url, token, "phone")
        assert client.identity == Identity("t1", "alice")
        reply = await client.send_direct("bob", b"hi", client_message_id="c1")
    assert reply.client_message_id == "c1"
    (frame,) = server.sessions[0].received
    assert frame.body == SendMessage(
        request_id=frame.header.request_id,
        client_message_id="c1",
        conversation_id=ids.direct_conversation_id("t1", "bob", "alice"),
        payload=b"hi",
        peer_user_id="bob",
    )


async def test_send_direct_without_a_known_identity_asks_for_it(network: MemoryNetwork) -> None:
    server = FakeServer(on_request=ack)
    url = network.listen("gw", server.handle)
    async with make_client(network) as client:
        await client.connect(url, "opaque-oauth-token", "phone")
        assert client.identity is None
        with pytest.raises(ValueError, match="tenant_id/user_id are unknown"):
            await client.send_direct("bob", b"hi")
        assert server.sessions[0].received == []  # nothing was sent
        await client.send_direct("bob", b"hi", tenant_id="t9", user_id="carol")
        client.identity = Identity("t9", "carol")
        await client.send_direct("bob", b"again")
    first, second = (f.body for f in server.sessions[0].received)
    assert isinstance(first, SendMessage) and isinstance(second, SendMessage)
    expected = ids.direct_conversation_id("t9", "carol", "bob")
    assert first.conversation_id == second.conversation_id == expected


async def test_an_identity_set_by_the_app_wins_over_the_token(network: MemoryNetwork) -> None:
    server = FakeServer(on_request=ack)
    url = network.listen("gw", server.handle)
    async with make_client(network) as client:
        client.identity = Identity("t1", "alice-by-app")
        await client.connect(url, qim_token({"tenant_id": "t1", "user_id": "x"}), "phone")
        assert client.identity == Identity("t1", "alice-by-app")
