"""ConnectionNode against the suite's real Kafka and Redis, over WSS and TLS/TCP (ALPN qim/1).

Spec: App. A (frames, errors), §5.3.2 (REDIRECT / SHARD_MOVED), §5.4 + §7.10 (PresenceEntry on
the compacted topic at the user's mailbox shard, tombstone on disconnect), §15.1 (PONG, idle
timeout), §15.2 (replacement, device cap, unauth timeout), §20.1 (frame checks), §24.1.1 /
§24.1.7 (metrics). Tokens come from the real AuthService; every test uses its own user ids.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import crc32c
import msgspec
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, TopicPartition
from redis.asyncio import Redis

from qim.auth import AuthConfig, AuthService, KeyRing, SigningKey
from qim.auth.config import configured_shards
from qim.devstack.stack import Stack
from qim.gateway.auth_adapter import AuthServiceAdapter
from qim.gateway.node import wall_clock_ms
from qim.params import Settings
from qim.schemas import lane_id
from qim.schemas.frames import (
    Auth,
    AuthOk,
    Error,
    ErrorCode,
    Frame,
    Kicked,
    Ping,
    Pong,
    Redirect,
    SendMessage,
    encode_frame,
    frame_bytes,
)
from qim.schemas.records.presence import PresenceKey, decode_presence
from qim.streams import PRESENCE
from tests.gateway_support import (
    Closed,
    Gateway,
    RawClient,
    TcpClient,
    make_cert,
    running_gateway,
)
from tests.unit.gateway.session_support import raw_frame

pytestmark = pytest.mark.integration

TENANT = "t-gw"
SETTINGS = Settings.load(
    overrides={"per_ip_connect_rate": {"count": 100_000, "period_ms": 1000}}, env={}
)
RING = KeyRing([SigningKey("gw-it", b"\x22" * 32)])
UNAUTH_MS = 1500


def uid(prefix: str = "u") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_cert(tmp_path_factory.mktemp("gw-cert"))[0]


@dataclass
class RealAuth:
    """The real AuthService on the suite's Redis, and the gateway's adapter over it."""

    service: AuthService
    adapter: AuthServiceAdapter
    redis: Redis

    async def mint(self, tenant: str, user: str, device: str, ttl_ms: int) -> str:
        return await self.service.issue_token(tenant, user, device, ttl_s=ttl_ms / 1000)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def auth(stack: Stack) -> AsyncIterator[RealAuth]:
    redis = Redis.from_url(stack.cfg.redis.url)
    service = AuthService(redis, RING, AuthConfig(shards=configured_shards(SETTINGS)))
    try:
        yield RealAuth(service, AuthServiceAdapter(service), redis)
    finally:
        await redis.aclose()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def gw(stack: Stack, cert: Path, auth: RealAuth) -> AsyncIterator[Gateway]:
    """One node for most tests: WSS + TLS/TCP, presence to the real Kafka, /metrics."""
    async with running_gateway(
        authenticator=auth.adapter,
        mint=auth.mint,
        cert=cert,
        settings=SETTINGS,
        node_id="gw-it-1",
        tls_port=0,
        metrics_port=0,
        kafka_bootstrap=stack.cfg.kafka.bootstrap,
        unauth_connection_timeout_ms=UNAUTH_MS,
        wheel_tick_ms=100,
    ) as gateway:
        yield gateway


TRANSPORTS = ["wss", "tcp"]


async def connect(gw: Gateway, transport: str) -> RawClient:
    return await (gw.ws() if transport == "wss" else gw.tcp())


async def login(gw: Gateway, transport: str, user: str, device: str) -> tuple[RawClient, AuthOk]:
    return await gw.online(user, device, TENANT, client=await connect(gw, transport))


def error_codes(bodies: Sequence[object]) -> list[int]:
    return [b.code for b in bodies if isinstance(b, Error)]


# -- the shared AUTH / PING vectors (§5.3.5: both transports run the same suite) -------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_auth_ok_and_pong_carry_the_spec_fields(gw: Gateway, transport: str) -> None:
    user = uid()
    client = await connect(gw, transport)
    await client.send(
        Auth(access_token=await gw.token(user, "d1", TENANT), device_id="d1", client_version="1"),
        41,
    )
    frame = await client.recv()
    assert isinstance(frame, Frame) and isinstance(frame.body, AuthOk)
    assert frame.header.request_id == 41 and frame.header.version == 1
    ok = frame.body
    assert ok.session_epoch > 0 and ok.lane_id == lane_id(TENANT, user, 64)
    assert ok.next_ping_interval_ms == 240_000 and ok.sync_to_seq == 0
    before = wall_clock_ms()
    await client.send(Ping(ping_id=77, client_time=123_456), 42)
    frame = await client.recv()
    assert isinstance(frame, Frame) and frame.header.request_id == 42
    assert frame.header.stream_id == 0
    pong = frame.body
    assert isinstance(pong, Pong) and (pong.ping_id, pong.echo_client_time) == (77, 123_456)
    assert before - 1000 <= pong.server_time <= wall_clock_ms() + 1000
    assert (pong.last_pushed_user_seq, pong.mailbox_dirty) == (0, False)
    assert (pong.next_ping_interval_ms, pong.idle_timeout_ms) == (240_000, 490_000)
    await client.close()


def header_with_len(body_len: int) -> bytes:
    """An AUTH header that declares ``body_len`` octets, CRC correct (§20.1: judge body_len)."""
    covered = struct.pack(">HBBHIHI", 0x514D, 1, 0, 0x0001, 9, 0, body_len)
    return covered + struct.pack(">I", crc32c.crc32c(covered))


PD, TOO_LARGE = ErrorCode.PERMISSION_DENIED, ErrorCode.PAYLOAD_TOO_LARGE
PRE_AUTH_VECTORS: dict[str, tuple[Callable[[], bytes], list[ErrorCode]]] = {
    "bad_magic": (lambda: b"\x00\x00" + encode_frame(Ping())[2:], []),
    "bad_crc": (lambda: encode_frame(Ping())[:16] + b"\xde\xad\xbe\xef", []),
    "oversize_body_len": (lambda: header_with_len(4 * 1024 * 1024 + 1), [TOO_LARGE]),
    "truncated": (lambda: encode_frame(Auth(access_token="x" * 40, device_id="d"))[:30], []),
    "unknown_opcode": (lambda: raw_frame(0x0EEE, b"\x80", request_id=5), [PD]),
    "frame_before_auth": (lambda: encode_frame(Ping(ping_id=1), 5), [PD]),
    "wrong_direction": (lambda: encode_frame(Pong(ping_id=1)), []),
}


@pytest.mark.parametrize("vector", sorted(PRE_AUTH_VECTORS))
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_malformed_first_frames_end_the_connection(
    gw: Gateway, transport: str, vector: str
) -> None:
    """Every violation closes; an ERROR precedes it iff the codec's verdict names a code.
    (A truncated frame on TCP is just an incomplete frame: the unauth timeout closes it.)"""
    make, codes = PRE_AUTH_VECTORS[vector]
    client = await connect(gw, transport)
    await client.send_raw(make())
    bodies = await client.expect_closed(within=UNAUTH_MS / 1000 + 5)
    assert error_codes(bodies) == [int(c) for c in codes]
    assert all(isinstance(b, Error) for b in bodies)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_unknown_opcode_online_is_tolerated(gw: Gateway, transport: str) -> None:
    """§27.1.2: dropped and counted; ERROR{UPGRADE_REQUIRED} because request_id != 0."""
    client, _ok = await login(gw, transport, uid(), "d1")
    registry = gw.node.metrics.registry
    dropped = registry.get_sample_value("unknown_opcode_dropped_total") or 0
    await client.send_raw(raw_frame(0x0EEE, b"\x81\xa1x\x01", request_id=11))
    error = await client.expect(Error)
    assert (error.code, error.request_id) == (int(ErrorCode.UPGRADE_REQUIRED), 11)
    await client.send_raw(raw_frame(0x0EEF, b"\x80"))  # request_id 0: silently dropped
    assert (await client.ping(ping_id=5)).ping_id == 5
    assert registry.get_sample_value("unknown_opcode_dropped_total") == dropped + 2
    await client.close()


@pytest.mark.parametrize("version", [0, 7])
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_logged_in_session_with_an_unsupported_header_version_is_told_and_closed(
    gw: Gateway, transport: str, version: int
) -> None:
    """§20.1 / issue 15.3: a PING of a header version the session did not negotiate gets
    ERROR{UPGRADE_REQUIRED} (not PONG), then the connection is closed as a protocol error."""
    client, _ok = await login(gw, transport, uid(), "d1")
    await client.send_raw(raw_frame(0x0003, b"\x80", version=version, request_id=4))
    bodies = await client.expect_closed()
    assert error_codes(bodies) == [int(ErrorCode.UPGRADE_REQUIRED)]
    assert not any(isinstance(b, Pong) for b in bodies)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_auth_twice_is_permission_denied(gw: Gateway, transport: str) -> None:
    user = uid()
    token = await gw.token(user, "d1", TENANT)
    first = encode_frame(Auth(access_token=token, device_id="d1"), 1)
    client = await connect(gw, transport)
    if isinstance(client, TcpClient):  # both in one write: the second is read before the verdict
        await client.send_raw(first + encode_frame(Auth(access_token=token, device_id="d1"), 2))
    else:
        await client.send_raw(first)
        await client.send(Auth(access_token=token, device_id="d1"), 2)
    bodies = await client.expect_closed()
    assert error_codes(bodies) == [int(ErrorCode.PERMISSION_DENIED)]
    # online: a re-AUTH naming another device is refused the same way (§15.3.1)
    client, _ = await login(gw, transport, user, "d1")
    await client.send(Auth(access_token=await gw.token(user, "d2", TENANT), device_id="d2"), 3)
    assert error_codes(await client.expect_closed()) == [int(ErrorCode.PERMISSION_DENIED)]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_expired_and_forged_tokens_are_refused(
    gw: Gateway, auth: RealAuth, transport: str
) -> None:
    user = uid()
    two_hours_ago = wall_clock_ms() - 2 * 3_600_000  # beyond access_token_ttl and clock skew
    expired = await auth.service.issue_token(TENANT, user, "d1", now_ms=two_hours_ago)
    client = await connect(gw, transport)
    await client.login(expired, "d1")
    assert error_codes(await client.refusal()) == [int(ErrorCode.TOKEN_EXPIRED)]
    good = await gw.token(user, "d1", TENANT)
    forged = good[:-3] + ("AAA" if not good.endswith("AAA") else "BBB")
    client = await connect(gw, transport)
    await client.login(forged, "d1")
    assert error_codes(await client.refusal()) == [int(ErrorCode.PERMISSION_DENIED)]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_reauth_renews_with_the_same_session_epoch(gw: Gateway, transport: str) -> None:
    user = uid()
    client, ok = await login(gw, transport, user, "d1")
    await client.send(Auth(access_token=await gw.token(user, "d1", TENANT), device_id="d1"), 9)
    renewed = await client.expect(AuthOk)
    assert renewed.session_epoch == ok.session_epoch
    assert (await client.ping()).ping_id == 1
    await client.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_slowloris_is_closed_after_the_unauth_timeout(gw: Gateway, transport: str) -> None:
    client = await connect(gw, transport)
    started = time.monotonic()
    assert await client.expect_closed(within=UNAUTH_MS / 1000 + 5) == []
    elapsed = time.monotonic() - started
    assert UNAUTH_MS / 1000 - 0.3 <= elapsed <= UNAUTH_MS / 1000 + 2


async def test_tcp_peer_that_never_starts_tls_is_closed(gw: Gateway) -> None:
    port = gw.node.listeners.tls_port
    assert port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    assert await asyncio.wait_for(reader.read(), UNAUTH_MS / 1000 + 5) == b""
    assert time.monotonic() - started >= UNAUTH_MS / 1000 - 0.3
    writer.close()


@pytest.mark.parametrize("alpn", [[], ["http/1.1"]])
async def test_tcp_listener_requires_alpn_qim1(gw: Gateway, alpn: list[str]) -> None:
    try:
        client = await gw.tcp(alpn=alpn)
    except (ssl.SSLError, ConnectionError):
        return  # refused during the handshake: fine too
    assert client.alpn != "qim/1"
    await client.send(Ping())
    with pytest.raises((Closed, ConnectionError)):
        await client.recv(within=5)


# -- devices (§5.4.4, §15.2.2) ---------------------------------------------------------------


async def test_two_devices_of_one_user_are_both_online(gw: Gateway) -> None:
    user = uid()
    phone, _ = await login(gw, "wss", user, "phone")
    desk, _ = await login(gw, "tcp", user, "desk")
    assert (await phone.ping(1)).ping_id == 1 and (await desk.ping(2)).ping_id == 2
    assert set(gw.node.registry.devices(TENANT, user)) == {"phone", "desk"}
    await phone.close()
    await desk.close()


async def test_same_device_login_kicks_the_old_connection_with_a_larger_epoch(gw: Gateway) -> None:
    user = uid()
    old, first = await login(gw, "wss", user, "phone")
    new, second = await login(gw, "tcp", user, "phone")
    assert second.session_epoch > first.session_epoch
    bodies = await old.expect_closed()
    assert bodies == [Kicked(reason="replaced", replaced_by_device="phone")]
    assert (await new.ping()).ping_id == 1
    await new.close()


async def test_the_ninth_device_kicks_the_least_recently_active(gw: Gateway) -> None:
    user = uid()
    clients = {}
    for i in range(8):
        clients[f"d{i}"], _ = await login(gw, "wss", user, f"d{i}")
    for name, client in clients.items():
        if name != "d2":  # d2 stays quiet: least recently active
            await client.ping()
    ninth, _ = await login(gw, "wss", user, "d8")
    assert await clients["d2"].expect_closed() == [
        Kicked(reason="replaced", replaced_by_device="d8")
    ]
    for name, client in clients.items():
        if name != "d2":
            assert (await client.ping(9)).ping_id == 9
    assert set(gw.node.registry.devices(TENANT, user)) == {f"d{i}" for i in range(9)} - {"d2"}
    for client in [*clients.values(), ninth]:
        await client.close()


# -- presence (§5.4.2, §7.10) ----------------------------------------------------------------


async def read_presence(
    bootstrap: str, key: PresenceKey, partition: int, done: Callable[[list[bytes | None]], bool]
) -> list[bytes | None]:
    """Values of ``key`` in the presence partition, from the beginning, until ``done``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(PRESENCE.name, partition)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        values: list[bytes | None] = []
        deadline = time.monotonic() + 20
        while not done(values):
            assert time.monotonic() < deadline, f"presence records so far: {values}"
            batch = await consumer.getmany(tp, timeout_ms=200)
            values += [m.value for m in batch.get(tp, []) if m.key == key.encode()]
        return values
    finally:
        await consumer.stop()


async def test_presence_entry_at_the_mailbox_shard_then_tombstone(
    gw: Gateway, stack: Stack
) -> None:
    user = uid()
    client, ok = await login(gw, "wss", user, "phone")
    key = PresenceKey(TENANT, user, "phone")
    partition = key.partition(virtual_bucket_count=65536, mailbox_shard_count=64)
    values = await read_presence(stack.cfg.kafka.bootstrap, key, partition, lambda v: len(v) >= 1)
    entry = decode_presence(values[0])
    assert entry is not None and entry.session_epoch == ok.session_epoch
    assert (entry.node_id, entry.tenant_id, entry.user_id) == ("gw-it-1", TENANT, user)
    assert entry.connection_shard == gw.node.logins.shard_of(TENANT, user)
    assert entry.lease_expire_at > wall_clock_ms()
    await client.close()  # clean disconnect
    values = await read_presence(
        stack.cfg.kafka.bootstrap, key, partition, lambda v: len(v) >= 2 and v[-1] is None
    )
    assert values[-1] is None


async def test_metrics_endpoint_shows_the_connection_metrics(gw: Gateway) -> None:
    client, _ = await login(gw, "wss", uid(), "phone")
    await client.ping()
    url = f"http://127.0.0.1:{gw.node.listeners.metrics_port}/metrics"
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
    online = [line for line in text.splitlines() if line.startswith("connections_online{")]
    assert online and online[0].startswith('connections_online{node="gw-it-1"}')
    assert float(online[0].split()[-1]) >= 1
    for name in ("auth_success_rate", "auth_latency_p99", "unauth_connection_count",
                 "kicked_total", "heartbeat_pps", "ping_interval_effective_count",
                 "timewheel_tick_overrun_total", "session_epoch_reject_total"):  # fmt: skip
        assert f"\n{name}" in text, name
    await client.close()


async def test_heartbeats_never_touch_redis(gw: Gateway, auth: RealAuth) -> None:
    """direction.md §1: Redis only at login, never per message or heartbeat."""
    redis = auth.redis
    client, _ = await login(gw, "tcp", uid(), "phone")

    async def calls() -> int:
        stats = await redis.info("commandstats")
        return sum(v["calls"] for k, v in stats.items() if not k.endswith(("info", "hello")))

    before = await calls()
    for i in range(30):
        await client.ping(i)
    await client.send(SendMessage(client_message_id="c1", conversation_id="c"), 3)
    refusal = await client.expect(Error)  # this node routes nothing: "not offered" (issue 16)
    assert refusal.request_id == 3 and "SEND_MESSAGE" in refusal.detail
    assert (await client.ping(99)).ping_id == 99
    assert await calls() == before
    await client.close()


# -- separate nodes: idle timeout, redirect ---------------------------------------------------


async def test_idle_timeout_closes_a_silent_connection_but_not_a_pinging_one(
    auth: RealAuth,
) -> None:
    async with running_gateway(
        authenticator=auth.adapter, mint=auth.mint, settings=SETTINGS, next_ping_interval_ms=500,
        idle_timeout_ms=1200, wheel_tick_ms=100,
    ) as node:  # fmt: skip
        client, ok = await node.online(uid(), "phone", TENANT)
        assert ok.next_ping_interval_ms == 500
        for i in range(4):  # 4 × 0.6 s > idle_timeout: each PING keeps it alive
            with pytest.raises(TimeoutError):
                await client.recv(within=0.6)  # nothing arrives, nothing closes
            assert (await client.ping(i)).idle_timeout_ms == 1200
        last = time.monotonic()
        assert await client.expect_closed(within=5) == []
        assert 1.1 <= time.monotonic() - last <= 2.5


class NoShards:
    """Ownership of a node that owns nothing: every login is redirected to gw-b."""

    def owns(self, connection_shard_id: int) -> bool:
        return False

    def owner_endpoint(self, connection_shard_id: int) -> str | None:
        return "wss://gw-b.example:443/"


async def test_redirect_once_then_shard_moved(auth: RealAuth) -> None:
    async with running_gateway(
        authenticator=auth.adapter, mint=auth.mint, settings=SETTINGS, ownership=NoShards()
    ) as node:
        user = uid()
        token = await node.token(user, "phone", TENANT)
        client = await node.ws()
        await client.login(token, "phone")
        (redirect,) = await client.refusal()
        assert isinstance(redirect, Redirect) and redirect.route_token
        assert redirect.connection_shard == node.node.logins.shard_of(TENANT, user)
        assert redirect.endpoint_hint == "wss://gw-b.example:443/"
        assert 0 < redirect.exp - wall_clock_ms() <= 60_000
        # The redirected client presents its route token and lands on a non-owner again.
        auth_body = {
            "access_token": token,
            "device_id": "phone",
            "route_token": redirect.route_token,
        }
        with_route = frame_bytes(0x0001, msgspec.msgpack.encode(auth_body), request_id=1)
        client = await node.ws()
        await client.send_raw(with_route)
        (moved,) = await client.expect_closed()
        assert isinstance(moved, Error) and moved.code == int(ErrorCode.SHARD_MOVED)
        assert moved.retry_after_ms is not None and moved.retry_after_ms > 0
        # The route token was single use: replaying it counts as no token, so REDIRECT again.
        client = await node.ws()
        await client.send_raw(with_route)
        (again,) = await client.expect_closed()
        assert isinstance(again, Redirect)
