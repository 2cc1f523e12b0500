"""Refresh tokens on the suite's Redis (issue 21, spec 15.3): rotate on use, a reused one
revokes its family and its device, concurrent refreshes have one winner, the HTTP auth API
serves them without the admin secret, and the SDK renews a session silently on TOKEN_EXPIRED.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from redis.asyncio import Redis

from qim.auth import AuthConfig, AuthService, KeyRing, SigningKey
from qim.auth.admin import ADMIN_SECRET_HEADER, start_admin_server
from qim.auth.config import configured_shards
from qim.auth.errors import PERMISSION_DENIED, TOKEN_REVOKED, AuthError
from qim.auth.refresh import RefreshTokens
from qim.client import QimClient
from qim.client.errors import QimError
from qim.client.refresh import RefreshRefused, TokenRefresher
from qim.devstack.procs import free_port
from qim.devstack.stack import Stack
from qim.gateway.auth_adapter import AuthServiceAdapter
from qim.params import Settings
from qim.schemas.frames import ErrorCode, SendMessage
from tests.gateway_support import Gateway, running_gateway

pytestmark = pytest.mark.integration

RING = KeyRing([SigningKey("rt-it", b"\x55" * 32)])
SECRET = "rt-admin-secret-0123456789"
SETTINGS = Settings.load(
    overrides={"per_ip_connect_rate": {"count": 100_000, "period_ms": 1000}}, env={}
)


def now() -> int:
    return time.time_ns() // 1_000_000


@pytest_asyncio.fixture(loop_scope="session")
async def service(stack: Stack) -> AsyncIterator[AuthService]:
    redis = Redis.from_url(stack.cfg.redis.url)
    try:
        yield AuthService(redis, RING, AuthConfig(shards=configured_shards(SETTINGS)))
    finally:
        await redis.aclose()


def tenant() -> str:
    return f"t-rt-{uuid.uuid4().hex[:8]}"


async def denied(coro: object, code: str) -> AuthError:
    with pytest.raises(AuthError) as caught:
        await coro  # type: ignore[misc]
    assert caught.value.code == code, caught.value
    return caught.value


async def test_a_refresh_rotates_and_a_reused_token_revokes_the_family_and_the_device(
    service: AuthService,
) -> None:
    t = tenant()
    tokens = RefreshTokens(service, service.redis)
    login = await tokens.issue(t, "alice", "phone", now_ms=now())
    first = await tokens.refresh(login.refresh_token, now_ms=now())
    assert first.refresh_token != login.refresh_token
    grant = await service.authenticate(first.access_token, "phone", "1.0")
    assert (grant.tenant_id, grant.user_id, grant.device_id) == (t, "alice", "phone")
    second = await tokens.refresh(first.refresh_token, now_ms=now())
    # the rotated-away token shows up again: someone else holds the family
    error = await denied(tokens.refresh(login.refresh_token, now_ms=now()), TOKEN_REVOKED)
    assert error.detail == "refresh_token_reused"
    await denied(tokens.refresh(second.refresh_token, now_ms=now()), TOKEN_REVOKED)  # family
    await denied(service.authenticate(second.access_token, "phone", "1.0"), TOKEN_REVOKED)
    # a new login of that device starts a new family and works
    again = await tokens.issue(t, "alice", "phone", now_ms=now() + 1)
    assert (await tokens.refresh(again.refresh_token, now_ms=now() + 1)).access_token
    await denied(tokens.refresh("x" * 43, now_ms=now()), PERMISSION_DENIED)


async def test_concurrent_refreshes_of_one_token_have_exactly_one_winner(
    service: AuthService,
) -> None:
    tokens = RefreshTokens(service, service.redis)
    login = await tokens.issue(tenant(), "bob", "phone", now_ms=now())
    results = await asyncio.gather(
        *(tokens.refresh(login.refresh_token, now_ms=now()) for _ in range(6)),
        return_exceptions=True,
    )
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1, results
    assert all(
        isinstance(r, AuthError) and r.code == TOKEN_REVOKED for r in results if r not in winners
    )


async def test_the_http_auth_api_refreshes_without_the_admin_secret(service: AuthService) -> None:
    server = await start_admin_server(service, SECRET, port=free_port())
    t = tenant()
    try:
        async with aiohttp.ClientSession(server.url) as http:
            async with http.post(
                "/v1/tokens",
                json={"tenant_id": t, "user_id": "carol", "device_id": "web", "refresh": True},
                headers={ADMIN_SECRET_HEADER: SECRET},
            ) as response:
                assert response.status == 200
                login = await response.json()
            async with http.post("/v1/tokens", json={"tenant_id": t, "user_id": "x"}) as response:
                assert response.status == 401  # everything else still needs the secret
        refresher = TokenRefresher(server.url, login["refresh_token"])
        access = await refresher.refresh()
        assert (await service.authenticate(access, "web", "1.0")).user_id == "carol"
        stale = TokenRefresher(server.url, login["refresh_token"])  # the rotated-away one
        with pytest.raises(RefreshRefused) as caught:
            await stale.refresh()
        assert (caught.value.status, caught.value.code) == (403, "TOKEN_REVOKED")
    finally:
        await server.close()


@pytest_asyncio.fixture(loop_scope="session")
async def gw(stack: Stack, service: AuthService) -> AsyncIterator[Gateway]:
    async def mint(tenant: str, user: str, device: str, ttl_ms: int) -> str:
        return await service.issue_token(tenant, user, device, ttl_s=ttl_ms / 1000)

    async with running_gateway(
        authenticator=AuthServiceAdapter(service), mint=mint, settings=SETTINGS, node_id="gw-rt",
        kafka_bootstrap=stack.cfg.kafka.bootstrap,
    ) as gateway:  # fmt: skip
        yield gateway


async def test_the_sdk_renews_silently_when_a_write_meets_token_expired(
    service: AuthService, gw: Gateway
) -> None:
    server = await start_admin_server(service, SECRET, port=free_port())
    t = tenant()
    try:
        tokens = RefreshTokens(service, service.redis)
        login = await tokens.issue(t, "dave", "phone", now_ms=now())
        ttl_ms = service.config.access_token_ttl_ms
        short = await service.issue(t, "dave", "phone", now_ms=now() - ttl_ms + 1500)
        client = QimClient()
        ok = await client.connect(gw.ws_url, short.token, "phone")
        send = SendMessage(conversation_id="d:dave:erin", client_message_id="c1", payload=b"x")
        # the barrier: wait until the gateway itself answers TOKEN_EXPIRED (its expiry rule)
        while True:
            with pytest.raises(QimError) as caught:
                await client.request(send)
            if caught.value.code == int(ErrorCode.TOKEN_EXPIRED):
                break
            assert caught.value.code == int(ErrorCode.PERMISSION_DENIED)  # not offered here
            await asyncio.sleep(0.2)
        client.refresher = TokenRefresher(server.url, login.refresh_token)
        with pytest.raises(QimError) as after:
            await client.request(send)
        # past the expiry check again: this gateway does not route sends, so "not offered"
        assert after.value.code == int(ErrorCode.PERMISSION_DENIED)
        assert client.refresher.refresh_token != login.refresh_token  # it rotated
        assert (await client.ping()).server_time > 0
        assert ok.session_epoch > 0
        await client.close()
    finally:
        await server.close()
