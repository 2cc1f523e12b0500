"""A revocation reaches live connections on every gateway (issue 21, spec 15.3.2 / 20.3.2).

Two gateways follow ``qim.revocations`` on the suite's Kafka; the AuthService on the suite's
Redis publishes through ``KafkaRevocationSink``. Revoking alice's laptop kicks it on gateway B
(KICKED{token_revoked}, then the close: nothing is served after it) while her phone on gateway A
keeps working; a revoked token id kicks exactly the session bound to that token; a revoked user
kicks every device on both gateways. A later kick on the same gateway is the barrier that shows a
record was read before the "still served" checks.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest
import pytest_asyncio
from redis.asyncio import Redis

from qim.auth import AuthConfig, AuthService, KeyRing, SigningKey
from qim.auth.config import configured_shards
from qim.auth.revocation_sink import KafkaRevocationSink
from qim.devstack.stack import Stack
from qim.gateway.auth_adapter import AuthServiceAdapter
from qim.params import Settings
from qim.schemas.frames import AuthOk, ErrorCode, Frame, Kicked
from tests.gateway_support import Gateway, RawClient, make_cert, running_gateway

pytestmark = pytest.mark.integration

TENANT = "t-revoke"
RING = KeyRing([SigningKey("rv-it", b"\x44" * 32)])
SETTINGS = Settings.load(
    overrides={"per_ip_connect_rate": {"count": 100_000, "period_ms": 1000}}, env={}
)


class Pair:
    def __init__(self, service: AuthService, a: Gateway, b: Gateway) -> None:
        self.service, self.a, self.b = service, a, b


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def pair(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Pair]:
    redis = Redis.from_url(stack.cfg.redis.url)
    sink = KafkaRevocationSink(stack.cfg.kafka.bootstrap)
    await sink.start()
    service = AuthService(
        redis, RING, AuthConfig(shards=configured_shards(SETTINGS)), revocation_sink=sink
    )

    async def mint(tenant: str, user: str, device: str, ttl_ms: int) -> str:
        return await service.issue_token(tenant, user, device, ttl_s=ttl_ms / 1000)

    cert = make_cert(tmp_path_factory.mktemp("rv-cert"))[0]
    try:
        async with AsyncExitStack() as gateways:
            a, b = [
                await gateways.enter_async_context(
                    running_gateway(
                        authenticator=AuthServiceAdapter(service),
                        mint=mint,
                        cert=cert,
                        settings=SETTINGS,
                        node_id=f"gw-rv-{name}",
                        metrics_port=0,
                        kafka_bootstrap=stack.cfg.kafka.bootstrap,
                        follow_revocations=True,
                    )
                )
                for name in ("a", "b")
            ]
            yield Pair(service, a, b)
    finally:
        await sink.stop()
        await redis.aclose()


async def kicked(client: RawClient) -> Kicked:
    """The KICKED frame, and nothing served after it: the connection closes."""
    kick = await client.expect(Kicked, within=15)
    assert await client.expect_closed() == []
    return kick


def user() -> str:
    return f"u-{uuid.uuid4().hex[:8]}"


async def test_a_revoked_device_is_kicked_on_its_gateway_and_the_other_device_keeps_working(
    pair: Pair,
) -> None:
    alice = user()
    phone, _ = await pair.a.online(alice, "phone", TENANT)
    tablet, _ = await pair.a.online(alice, "tablet", TENANT)
    laptop, _ = await pair.b.online(alice, "laptop", TENANT)
    await pair.service.revoke_device(TENANT, alice, "laptop")
    assert (await kicked(laptop)).reason == "token_revoked"
    await pair.service.revoke_device(TENANT, alice, "tablet")  # the barrier on gateway A
    assert (await kicked(tablet)).reason == "token_revoked"
    assert (await phone.ping()).ping_id == 1  # A read both records and kept the phone
    # the laptop logs in again with a new token: a watermark only ends older tokens
    again, ok = await pair.b.online(alice, "laptop", TENANT)
    assert isinstance(ok, AuthOk)
    await again.close()
    await phone.close()


async def test_a_revoked_token_kicks_its_session_and_refuses_that_token(pair: Pair) -> None:
    bob = user()
    issued = await pair.service.issue(TENANT, bob, "phone")
    client = await pair.a.ws()
    first = await client.login(issued.token, "phone")
    assert isinstance(first, Frame) and isinstance(first.body, AuthOk)
    other, _ = await pair.a.online(bob, "desk", TENANT)  # another token: not hit
    await pair.service.revoke_token(issued.claims.token_id, issued.claims.expires_at_ms)
    assert (await kicked(client)).reason == "token_revoked"
    await pair.service.revoke_device(TENANT, bob, "desk")  # barrier: A read past the token record
    await kicked(other)
    retry = await pair.a.ws()
    await retry.login(issued.token, "phone")
    codes = [getattr(b, "code", None) for b in await retry.refusal()]
    assert int(ErrorCode.TOKEN_REVOKED) in codes


async def test_a_revoked_user_is_kicked_everywhere(pair: Pair) -> None:
    carol = user()
    sessions = [
        (await pair.a.online(carol, "phone", TENANT))[0],
        (await pair.b.online(carol, "laptop", TENANT))[0],
        (await pair.b.online(carol, "tablet", TENANT))[0],
    ]
    await pair.service.revoke_user(TENANT, carol, reason="banned")
    for client in sessions:
        assert (await kicked(client)).reason == "banned"


async def test_qim_token_revoke_kicks_the_live_device(pair: Pair, stack: Stack) -> None:
    dave = user()
    phone, _ = await pair.b.online(dave, "phone", TENANT)
    argv = [sys.executable, "-m", "qim.cli", "token", "revoke", "--tenant", TENANT,
            "--user", dave, "--device", "phone", "--redis-url", stack.cfg.redis.url,
            "--bootstrap", stack.cfg.kafka.bootstrap]  # fmt: skip
    done = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "QIM_KAFKA_BOOTSTRAP": stack.cfg.kafka.bootstrap},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["scope"] == "device"
    assert (await kicked(phone)).reason == "token_revoked"
