"""A tenant's own backend mints standard JWTs and its users log in with them (issue 21).

A real gateway (WSS) over the real AuthService on the suite's Redis, configured with a
``QIM_JWT_ISSUERS_FILE`` document: a PyJWT-minted HS256 token gets AUTH_OK; ``alg=none``, an
HS/RS confusion and a token for another device are refused with PERMISSION_DENIED; a revoked
``jti`` is TOKEN_REVOKED on the next login; the user's qat1 tokens keep working next to it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator

import jwt
import pytest
import pytest_asyncio
from redis.asyncio import Redis

from qim.auth import AuthConfig, AuthService, KeyRing, SigningKey
from qim.auth.config import configured_shards
from qim.devstack.stack import Stack
from qim.gateway.auth_adapter import AuthServiceAdapter
from qim.params import Settings
from qim.schemas.frames import AuthOk, Error, ErrorCode, Frame
from tests.gateway_support import Gateway, make_cert, running_gateway

pytestmark = pytest.mark.integration

TENANT = "t-jwt"
ISSUER = "https://id.jwt-test.example"
SECRET = b"jwt-integration-secret-0123456789abcdef"
RING = KeyRing([SigningKey("jwt-it", b"\x33" * 32)])
SETTINGS = Settings.load(
    overrides={"per_ip_connect_rate": {"count": 100_000, "period_ms": 1000}}, env={}
)


def mint(user: str, device: str, **over: object) -> str:
    """What the customer's backend runs (the README shows the same lines)."""
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": "qim", "sub": user, "device_id": device,
              "iat": now, "exp": now + 600, "jti": uuid.uuid4().hex}  # fmt: skip
    claims.update(over)
    return jwt.encode(claims, SECRET, algorithm="HS256")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def service(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[AuthService]:
    folder = tmp_path_factory.mktemp("jwt")
    (folder / "secret").write_bytes(SECRET)
    doc = {"issuers": [{"tenant_id": TENANT, "issuer": ISSUER, "audience": "qim",
                        "hs256_secret_file": "secret"}]}  # fmt: skip
    (folder / "issuers.json").write_text(json.dumps(doc))
    config = AuthConfig(
        shards=configured_shards(SETTINGS), jwt_issuers_file=folder / "issuers.json"
    )
    redis = Redis.from_url(stack.cfg.redis.url)
    try:
        yield AuthService(redis, RING, config)
    finally:
        await redis.aclose()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def gw(
    stack: Stack, service: AuthService, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gateway]:
    async def qat1(tenant: str, user: str, device: str, ttl_ms: int) -> str:
        return await service.issue_token(tenant, user, device, ttl_s=ttl_ms / 1000)

    async with running_gateway(
        authenticator=AuthServiceAdapter(service),
        mint=qat1,
        cert=make_cert(tmp_path_factory.mktemp("jwt-cert"))[0],
        settings=SETTINGS,
        node_id="gw-jwt-1",
        metrics_port=0,
        kafka_bootstrap=stack.cfg.kafka.bootstrap,
    ) as gateway:
        yield gateway


async def refused(gw: Gateway, token: str, device: str) -> list[int]:
    """The error codes of a refused AUTH after its answer, up to the close (the convention of
    ``test_gateway.test_expired_and_forged_tokens_are_refused``)."""
    client = await gw.ws()
    first = await client.login(token, device)
    assert isinstance(first, Frame) and isinstance(first.body, Error), first
    return [b.code for b in await client.refusal() if isinstance(b, Error)]


async def logged_in(gw: Gateway, token: str, device: str) -> AuthOk:
    client = await gw.ws()
    frame = await client.login(token, device)
    assert isinstance(frame, Frame) and isinstance(frame.body, AuthOk), frame
    assert (await client.ping()).ping_id == 1  # served afterwards
    await client.close()
    return frame.body


async def test_a_jwt_from_the_tenants_backend_logs_in_and_a_qat1_token_still_does(
    gw: Gateway,
) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    client, ok = await gw.online(user, "phone", TENANT, client=await gw.ws())
    assert isinstance(ok, AuthOk)  # the qat1 path
    await client.close()
    assert (await logged_in(gw, mint(user, "laptop"), "laptop")).session_epoch > 0


async def test_forged_confused_and_foreign_device_jwts_are_permission_denied(
    gw: Gateway,
) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    denied = [int(ErrorCode.PERMISSION_DENIED)]
    now = int(time.time())
    none = jwt.encode(
        {"iss": ISSUER, "aud": "qim", "sub": user, "iat": now, "exp": now + 600}, "",
        algorithm="none",
    )  # fmt: skip
    assert await refused(gw, none, "phone") == denied
    assert await refused(gw, mint(user, "phone", aud="someone-else"), "phone") == denied
    assert await refused(gw, mint(user, "phone"), "tablet") == denied  # bound to phone
    wrong_key = jwt.encode(
        {"iss": ISSUER, "aud": "qim", "sub": user, "iat": now, "exp": now + 600},
        b"not-the-tenant-secret-0123456789abcdef", algorithm="HS256",
    )  # fmt: skip
    assert await refused(gw, wrong_key, "phone") == denied
    expired = mint(user, "phone", iat=now - 7200, exp=now - 3600)
    assert await refused(gw, expired, "phone") == [int(ErrorCode.TOKEN_EXPIRED)]


async def test_a_revoked_jti_is_token_revoked_at_the_next_login(
    gw: Gateway, service: AuthService
) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    token = mint(user, "phone", jti=f"jti-{uuid.uuid4().hex[:8]}")
    await logged_in(gw, token, "phone")
    claims = jwt.decode(token, options={"verify_signature": False})
    await service.revoke_token(claims["jti"])
    assert await refused(gw, token, "phone") == [int(ErrorCode.TOKEN_REVOKED)]
    fresh = mint(user, "phone")  # another token of the same device still works
    await logged_in(gw, fresh, "phone")
