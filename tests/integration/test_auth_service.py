"""AuthService against the suite's real Redis: session_epoch, revocation, route tokens, admin API.

Spec §5.4.4 / §15.2.2 / I-10 (epoch strictly increasing per device, persisted), §15.3.2 / §20.3
(revocation -> TOKEN_REVOKED), §5.3.2 (route_token single use), §27.1.3 (UPGRADE_REQUIRED).
Every test uses its own random tenant id, so tests never see each other's keys.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from redis.asyncio import Redis

from qim.auth import keys
from qim.auth.admin import ADMIN_SECRET_HEADER, start_admin_server
from qim.auth.config import AuthConfig
from qim.auth.errors import (
    PERMISSION_DENIED,
    TOKEN_EXPIRED,
    TOKEN_REVOKED,
    UPGRADE_REQUIRED,
    AuthError,
)
from qim.auth.service import AuthService, Revocation, now_ms
from qim.auth.tokens import KeyRing, SigningKey, TokenCodec
from qim.devstack.procs import free_port
from qim.devstack.stack import Stack
from qim.schemas import ShardConfig, connection_shard_id, lane_id, mailbox_shard_id, user_bucket

pytestmark = pytest.mark.integration

RING = KeyRing([SigningKey("it1", b"\x11" * 32)])
NOW = 1_750_000_000_000
SHARDS = ShardConfig(mailbox_shard_count=64, connection_shard_count=256)
ADMIN_SECRET = "it-admin-secret-0123456789"


@pytest.fixture
async def redis_client(stack: Stack) -> AsyncIterator[Redis]:
    client = Redis.from_url(stack.cfg.redis.url)
    try:
        yield client
    finally:
        await client.aclose()


@dataclass(frozen=True)
class GatewaySession:
    tenant_id: str
    user_id: str
    device_id: str
    session_epoch: int


def new_tenant() -> str:
    return f"it-{uuid.uuid4().hex[:10]}"


def make_service(redis: Redis, **config: Any) -> AuthService:
    return AuthService(redis, RING, AuthConfig(shards=SHARDS, **config))


async def auth_error(coro: Any) -> AuthError:
    with pytest.raises(AuthError) as info:
        await coro
    return info.value


# -- session_epoch ------------------------------------------------------------------------------


async def test_session_epoch_strictly_increases_and_is_persisted(
    stack: Stack, redis_client: Redis
) -> None:
    tenant = new_tenant()
    svc = make_service(redis_client)
    token = await svc.issue_token(tenant, "alice", "phone", now_ms=NOW)
    epochs = [
        (await svc.authenticate(token, "phone", "1.0", now_ms=NOW + 1)).session_epoch
        for _ in range(5)
    ]
    # Same millisecond: the counter alone orders them, one apart.
    assert epochs == [NOW + 1 + i for i in range(5)]

    # A fresh client and service (a restarted gateway) continue from the stored value.
    other = Redis.from_url(stack.cfg.redis.url)
    try:
        svc2 = make_service(other)
        assert await svc2.current_session_epoch(tenant, "alice", "phone") == epochs[-1]
        grant = await svc2.authenticate(token, "phone", "1.0", now_ms=NOW + 1)
        assert grant.session_epoch == epochs[-1] + 1
    finally:
        await other.aclose()


async def test_session_epoch_never_goes_back_even_if_redis_lost_the_counter(
    redis_client: Redis,
) -> None:
    tenant = new_tenant()
    svc = make_service(redis_client)
    token = await svc.issue_token(tenant, "alice", "phone")
    before = (await svc.authenticate(token, "phone", "1.0")).session_epoch
    assert before >= now_ms() - 60_000  # the wall-clock floor
    # Simulate an AOF/failover loss (or the idle-expiry of the counter key).
    await redis_client.delete(keys.epoch_key("qim", tenant, "alice", "phone"))
    await asyncio.sleep(0.005)
    after = (await svc.authenticate(token, "phone", "1.0")).session_epoch
    assert after > before
    ttl = await redis_client.pttl(keys.epoch_key("qim", tenant, "alice", "phone"))
    assert 0 < ttl <= AuthConfig().epoch_key_ttl_ms


async def test_concurrent_logins_of_one_device_get_distinct_epochs(redis_client: Redis) -> None:
    tenant = new_tenant()
    svc = make_service(redis_client)
    token = await svc.issue_token(tenant, "alice", "phone", now_ms=NOW)
    grants = await asyncio.gather(
        *(svc.authenticate(token, "phone", "1.0", now_ms=NOW) for _ in range(50))
    )
    assert sorted(g.session_epoch for g in grants) == list(range(NOW, NOW + 50))


async def test_session_epoch_is_independent_per_device_and_per_tenant(redis_client: Redis) -> None:
    tenant_a, tenant_b = new_tenant(), new_tenant()
    svc = make_service(redis_client)
    any_device_a = await svc.issue_token(tenant_a, "alice", None, now_ms=NOW)
    any_device_b = await svc.issue_token(tenant_b, "alice", None, now_ms=NOW)

    async def login(token: str, device: str) -> int:
        return (await svc.authenticate(token, device, "1.0", now_ms=NOW)).session_epoch

    assert [await login(any_device_a, "phone") for _ in range(3)] == [NOW, NOW + 1, NOW + 2]
    assert await login(any_device_a, "laptop") == NOW  # another device: its own counter
    assert await login(any_device_b, "phone") == NOW  # same user id, other tenant
    assert await login(any_device_a, "phone") == NOW + 3

    # Ids that would collide if keys were joined with ':' naively.
    t1 = await svc.issue_token(f"{tenant_a}:x", "y", "d", now_ms=NOW)
    t2 = await svc.issue_token(tenant_a, "x:y", "d", now_ms=NOW)
    assert await login(t1, "d") == NOW
    assert await login(t2, "d") == NOW


async def test_grant_carries_the_routing_facts_of_the_configured_shards(
    redis_client: Redis,
) -> None:
    svc = make_service(redis_client)
    token = await svc.issue_token("t1", "u42", "phone")
    grant = await svc.authenticate(token, "phone", "1.0")
    bucket = user_bucket("t1", "u42")
    assert (grant.tenant_id, grant.user_id, grant.device_id) == ("t1", "u42", "phone")
    assert grant.user_bucket == bucket == 34290  # spec §5.2 worked example
    assert grant.mailbox_shard_id == mailbox_shard_id(bucket, 64)
    assert grant.connection_shard_id == connection_shard_id(bucket, 256)
    assert grant.lane_id == lane_id("t1", "u42", 64) == 15
    assert grant.client_version == "1.0"


# -- failures that must not hand out an epoch ---------------------------------------------------


async def test_expired_forged_and_misbound_tokens(redis_client: Redis) -> None:
    tenant = new_tenant()
    svc = make_service(redis_client, clock_skew_ms=0)
    token = await svc.issue_token(tenant, "alice", "phone", ttl_s=60, now_ms=NOW)
    err = await auth_error(svc.authenticate(token, "phone", "1.0", now_ms=NOW + 60_000))
    assert err.code == TOKEN_EXPIRED

    forged = TokenCodec(KeyRing([SigningKey("it1", b"\x22" * 32)])).issue_access(
        tenant, "alice", "phone", now_ms=NOW, ttl_ms=60_000
    )
    err = await auth_error(svc.authenticate(forged.token, "phone", "1.0", now_ms=NOW))
    assert (err.code, err.detail) == (PERMISSION_DENIED, "invalid_token")

    err = await auth_error(svc.authenticate(token, "laptop", "1.0", now_ms=NOW))
    assert (err.code, err.detail) == (PERMISSION_DENIED, "device_mismatch")
    err = await auth_error(svc.authenticate(token, "", "1.0", now_ms=NOW))
    assert err.code == PERMISSION_DENIED

    assert await svc.current_session_epoch(tenant, "alice", "phone") == 0
    assert await svc.current_session_epoch(tenant, "alice", "laptop") == 0


async def test_upgrade_required_below_the_minimum_client_version(redis_client: Redis) -> None:
    tenant = new_tenant()
    svc = make_service(
        redis_client,
        minimum_client_version="2.0.0",
        tenant_minimum_client_version={f"{tenant}-strict": "3.0"},
    )
    token = await svc.issue_token(tenant, "alice", "phone", now_ms=NOW)
    for old in ("1.9.9", "2.0.0-rc.1", "garbage", ""):
        err = await auth_error(svc.authenticate(token, "phone", old, now_ms=NOW))
        assert err.code == UPGRADE_REQUIRED
        assert err.error_fields() == {
            "code": "UPGRADE_REQUIRED",
            "detail": "client_version_below_minimum",
            "minimum_client_version": "2.0.0",
        }
    assert await svc.current_session_epoch(tenant, "alice", "phone") == 0  # no session (§27.1.3)
    assert (await svc.authenticate(token, "phone", "ios/2.0.0", now_ms=NOW)).session_epoch == NOW

    strict = await svc.issue_token(f"{tenant}-strict", "alice", "phone", now_ms=NOW)
    err = await auth_error(svc.authenticate(strict, "phone", "2.5", now_ms=NOW))
    assert err.extras == {"minimum_client_version": "3.0"}

    # A revoked device learns it is revoked (and wipes itself) before being told to upgrade.
    await svc.revoke_device(tenant, "alice", "phone", now_ms=NOW + 1)
    err = await auth_error(svc.authenticate(token, "phone", "1.0", now_ms=NOW + 2))
    assert err.code == TOKEN_REVOKED


# -- revocation ---------------------------------------------------------------------------------


async def test_revoke_token_hits_only_that_token(redis_client: Redis) -> None:
    tenant = new_tenant()
    svc = make_service(redis_client)
    first = await svc.issue(tenant, "alice", "phone", now_ms=NOW)
    second = await svc.issue(tenant, "alice", "phone", now_ms=NOW)
    revocation = await svc.revoke_token(
        first.claims.token_id, first.claims.expires_at_ms, now_ms=NOW + 5
    )
    assert (revocation.scope, revocation.reason, revocation.token_id) == (
        "token",
        "token_revoked",
        first.claims.token_id,
    )
    err = await auth_error(svc.authenticate(first.token, "phone", "1.0", now_ms=NOW + 6))
    assert (err.code, err.detail) == (TOKEN_REVOKED, "token_revoked")
    assert (await svc.authenticate(second.token, "phone", "1.0", now_ms=NOW + 6)).session_epoch

    # Kept until the token could no longer verify anyway, plus the B.4 margin; not forever.
    ttl = await redis_client.pttl(keys.token_revocation_key("qim", first.claims.token_id))
    cfg = svc.config
    expected = first.claims.expires_at_ms + cfg.clock_skew_ms + cfg.revocation_margin_ms - NOW - 5
    assert expected - 5_000 < ttl <= expected


async def test_revoke_device_voids_earlier_tokens_but_not_a_later_login(
    redis_client: Redis,
) -> None:
    tenant = new_tenant()
    published: list[Revocation] = []

    async def sink(revocation: Revocation) -> None:
        published.append(revocation)

    svc = AuthService(redis_client, RING, AuthConfig(shards=SHARDS), revocation_sink=sink)
    bound = await svc.issue_token(tenant, "alice", "phone", now_ms=NOW)
    unbound = await svc.issue_token(tenant, "alice", None, now_ms=NOW)
    grant = await svc.authenticate(bound, "phone", "1.0", now_ms=NOW)

    revocation = await svc.revoke_device(tenant, "alice", "phone", reason="admin", now_ms=NOW + 10)
    assert published == [revocation]
    assert (revocation.scope, revocation.reason, revocation.device_id) == (
        "device",
        "admin",
        "phone",
    )

    for token in (bound, unbound):
        err = await auth_error(svc.authenticate(token, "phone", "1.0", now_ms=NOW + 20))
        assert err.code == TOKEN_REVOKED
    # The authz recheck of the live connection (§20.3.1) sees it too.
    assert (await auth_error(svc.recheck(grant, now_ms=NOW + 20))).code == TOKEN_REVOKED
    # Another device of the same user is untouched.
    assert await svc.authenticate(unbound, "laptop", "1.0", now_ms=NOW + 20)
    # Logging in again on the phone (a token issued after the revocation) works.
    fresh = await svc.issue_token(tenant, "alice", "phone", now_ms=NOW + 11)
    assert (await svc.authenticate(fresh, "phone", "1.0", now_ms=NOW + 20)).session_epoch > (
        grant.session_epoch
    )
    # A second, earlier-stamped revocation never lowers the watermark.
    await svc.revoke_device(tenant, "alice", "phone", now_ms=NOW + 1)
    assert await svc.authenticate(fresh, "phone", "1.0", now_ms=NOW + 20)


async def test_revoke_user_logs_out_every_device(redis_client: Redis) -> None:
    tenant = new_tenant()
    svc = make_service(redis_client)
    phone = await svc.issue_token(tenant, "alice", "phone", now_ms=NOW)
    laptop = await svc.issue_token(tenant, "alice", "laptop", now_ms=NOW)
    bob = await svc.issue_token(tenant, "bob", "phone", now_ms=NOW)
    revocation = await svc.revoke_user(tenant, "alice", reason="banned", now_ms=NOW + 1)
    assert (revocation.scope, revocation.device_id) == ("user", None)
    for token, device in ((phone, "phone"), (laptop, "laptop")):
        err = await auth_error(svc.authenticate(token, device, "1.0", now_ms=NOW + 2))
        assert err.code == TOKEN_REVOKED
    assert await svc.authenticate(bob, "phone", "1.0", now_ms=NOW + 2)
    ttl = await redis_client.pttl(keys.user_revocation_key("qim", tenant, "alice"))
    assert 0 < ttl <= svc.config.revocation_retention_ms
    with pytest.raises(ValueError):
        await svc.revoke_user(tenant, "alice", reason="because")  # type: ignore[arg-type]


async def test_reauthentication_keeps_the_epoch_and_checks_identity(redis_client: Redis) -> None:
    tenant = new_tenant()
    svc = make_service(redis_client)
    first = await svc.issue_token(tenant, "alice", "phone", now_ms=NOW)
    grant = await svc.authenticate(first, "phone", "1.0", now_ms=NOW)
    renewed_token = await svc.issue(tenant, "alice", "phone", now_ms=NOW + 1000)
    renewed = await svc.reauthenticate(
        renewed_token.token, "phone", "1.1", bound=grant, now_ms=NOW + 1000
    )
    assert renewed.session_epoch == grant.session_epoch  # §15.3.1, INV-47
    assert renewed.token_id == renewed_token.claims.token_id
    assert renewed.expires_at_ms == renewed_token.claims.expires_at_ms
    assert await svc.current_session_epoch(tenant, "alice", "phone") == grant.session_epoch
    # The gateway may keep its own session record: any object with the identity fields will do.
    bound = GatewaySession(tenant, "alice", "phone", grant.session_epoch)
    again = await svc.reauthenticate(
        renewed_token.token, "phone", "1.1", bound=bound, now_ms=NOW + 1000
    )
    assert again == renewed

    err = await auth_error(svc.reauthenticate(first, "laptop", "1.0", bound=grant, now_ms=NOW))
    assert (err.code, err.detail) == (PERMISSION_DENIED, "device_mismatch")
    bob = await svc.issue_token(tenant, "bob", "phone", now_ms=NOW)
    err = await auth_error(svc.reauthenticate(bob, "phone", "1.0", bound=grant, now_ms=NOW))
    assert err.code == PERMISSION_DENIED
    await svc.revoke_token(renewed_token.claims.token_id, now_ms=NOW + 1001)
    err = await auth_error(
        svc.reauthenticate(renewed_token.token, "phone", "1.1", bound=grant, now_ms=NOW + 1002)
    )
    assert err.code == TOKEN_REVOKED


# -- route tokens -------------------------------------------------------------------------------


async def test_route_token_is_single_use_and_bound_to_the_client(redis_client: Redis) -> None:
    tenant = new_tenant()
    svc = make_service(redis_client)
    issued = await svc.issue_route_token(tenant, "alice", "phone", 200, now_ms=NOW)
    assert issued.claims.expires_at_ms == NOW + 60_000  # route_token_ttl (B.1)

    who = {"tenant_id": tenant, "user_id": "alice"}
    err = await auth_error(
        svc.consume_route_token(issued.token, **who, device_id="laptop", now_ms=NOW)
    )
    assert err.code == PERMISSION_DENIED  # another client: rejected, and the token not burnt
    claims = await svc.consume_route_token(issued.token, **who, device_id="phone", now_ms=NOW + 1)
    assert claims.connection_shard == 200
    err = await auth_error(
        svc.consume_route_token(issued.token, **who, device_id="phone", now_ms=NOW + 2)
    )
    assert (err.code, err.reason) == (PERMISSION_DENIED, "route_token_reused")

    late = await svc.issue_route_token(tenant, "alice", "phone", 200, now_ms=NOW)
    skew = svc.config.clock_skew_ms
    err = await auth_error(
        svc.consume_route_token(late.token, **who, device_id="phone", now_ms=NOW + 60_000 + skew)
    )
    assert (err.code, err.reason) == (PERMISSION_DENIED, "route_token_expired")

    access = await svc.issue_token(tenant, "alice", "phone", now_ms=NOW)
    err = await auth_error(svc.consume_route_token(access, **who, device_id="phone", now_ms=NOW))
    assert err.code == PERMISSION_DENIED
    with pytest.raises(ValueError):
        await svc.issue_route_token(tenant, "alice", "phone", 256)  # only 256 shards


async def test_issue_refuses_a_ttl_above_the_cap(redis_client: Redis) -> None:
    svc = make_service(redis_client)
    with pytest.raises(ValueError):
        await svc.issue_token("t", "u", ttl_s=3601)
    with pytest.raises(ValueError):
        await svc.issue_token("t", "u", ttl_s=0)
    longer = make_service(redis_client, max_access_token_ttl_ms=86_400_000)
    assert await longer.issue_token("t", "u", ttl_s=86_400)


# -- admin HTTP endpoint ------------------------------------------------------------------------


async def test_admin_endpoint_issues_tokens_that_authenticate_and_revokes(
    redis_client: Redis,
) -> None:
    tenant = new_tenant()
    svc = make_service(redis_client)
    server = await start_admin_server(svc, ADMIN_SECRET, port=free_port())
    headers = {ADMIN_SECRET_HEADER: ADMIN_SECRET}
    try:
        async with aiohttp.ClientSession(server.url) as http:
            body = {"tenant_id": tenant, "user_id": "alice", "device_id": "phone", "ttl_s": 600}
            async with http.post("/v1/tokens", json=body) as resp:
                assert resp.status == 401
            bad = {ADMIN_SECRET_HEADER: ADMIN_SECRET + "x"}
            async with http.post("/v1/tokens", json=body, headers=bad) as resp:
                assert resp.status == 401
            async with http.post("/v1/tokens", json=body, headers=headers) as resp:
                assert resp.status == 200
                issued = await resp.json()
            assert issued["expires_at"] - issued["issued_at"] == 600_000
            grant = await svc.authenticate(issued["access_token"], "phone", "1.0")
            assert grant.token_id == issued["token_id"]

            for wrong in (
                {"user_id": "alice"},
                {"tenant_id": tenant, "user_id": 7},
                {"tenant_id": tenant, "user_id": "alice", "ttl_s": 999_999},
                {"tenant_id": tenant, "user_id": "alice", "ttl_s": "1"},
                {"tenant_id": "", "user_id": "alice"},
            ):
                async with http.post("/v1/tokens", json=wrong, headers=headers) as resp:
                    assert resp.status == 400, wrong
                    assert "error" in await resp.json()
            for raw in (b"{nope", b'{"tenant_id":"t","user_id":"u","ttl_s":Infinity}', b"[]"):
                async with http.post("/v1/tokens", data=raw, headers=headers) as resp:
                    assert resp.status == 400, raw

            revoke = {"tenant_id": tenant, "user_id": "alice", "device_id": "phone"}
            async with http.post("/v1/revocations", json=revoke, headers=headers) as resp:
                assert resp.status == 200
                record = (await resp.json())["revocation"]
            assert (record["scope"], record["reason"], record["device_id"]) == (
                "device",
                "admin",
                "phone",
            )
            err = await auth_error(svc.authenticate(issued["access_token"], "phone", "1.0"))
            assert err.code == TOKEN_REVOKED

            async with http.post("/v1/tokens", json=body, headers=headers) as resp:
                second = await resp.json()
            one = {"token_id": second["token_id"], "until": second["expires_at"]}
            async with http.post("/v1/revocations", json=one, headers=headers) as resp:
                assert resp.status == 200
            err = await auth_error(svc.authenticate(second["access_token"], "phone", "1.0"))
            assert err.code == TOKEN_REVOKED

            for wrong in (
                {"tenant_id": tenant, "user_id": "alice", "reason": "whim"},
                {"token_id": "x", "tenant_id": tenant},
                {"token_id": "x", "until": "soon"},
                {"token_id": "x", "until": 10**30},
                {},
            ):
                async with http.post("/v1/revocations", json=wrong, headers=headers) as resp:
                    assert resp.status == 400, wrong
    finally:
        await server.close()


async def test_admin_app_refuses_a_weak_secret(redis_client: Redis) -> None:
    with pytest.raises(ValueError):
        await start_admin_server(make_service(redis_client), "short", port=free_port())
