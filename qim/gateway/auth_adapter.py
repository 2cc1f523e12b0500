"""The gateway's :class:`~qim.gateway.ports.Authenticator` over ``qim.auth.AuthService``.

Translation only: ``AuthError`` (an A.6 code name and extras) becomes ``AuthRejected``; the
route token a redirected client presents is consumed once (``consume_route_token``, Redis
``SET NX``) and only counts when it was issued to this identity for this user's
ConnectionShard. A bad, reused or expired route token is treated as absent: the client is then
redirected again rather than refused, since its access token is good. Redis is touched only here,
at login (direction.md §1).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from redis.asyncio import Redis

from qim.auth import AuthConfig, AuthError, AuthService, load_keyring
from qim.auth import AuthGrant as ServiceGrant
from qim.auth.config import configured_shards
from qim.auth.redis_check import ensure_safe_redis
from qim.gateway.ports import AuthGrant, AuthRejected, AuthRequest, RouteToken
from qim.params import Settings
from qim.schemas.frames import ErrorCode

__all__ = ["AuthServiceAdapter", "connect_auth_service"]


def _rejected(error: AuthError) -> AuthRejected:
    minimum = error.extras.get("minimum_client_version")
    return AuthRejected(
        ErrorCode[error.code],
        error.detail,
        minimum_client_version=None if minimum is None else str(minimum),
    )


class AuthServiceAdapter:
    """Wraps a running AuthService; it does not own the service's Redis client."""

    def __init__(self, service: AuthService) -> None:
        self.service = service

    async def authenticate(self, request: AuthRequest) -> AuthGrant:
        try:
            grant = await self.service.authenticate(
                request.access_token,
                request.device_id,
                request.client_version,
                now_ms=request.now_ms,
            )
        except AuthError as exc:
            raise _rejected(exc) from None
        redirected = False
        if request.route_token:
            redirected = await self._consume(request, grant)
        return _grant(grant, redirected)

    async def renew(self, request: AuthRequest, grant: AuthGrant) -> AuthGrant:
        try:
            renewed = await self.service.reauthenticate(
                request.access_token,
                request.device_id,
                request.client_version,
                bound=grant,
                now_ms=request.now_ms,
            )
        except AuthError as exc:
            raise _rejected(exc) from None
        return _grant(renewed, False)

    async def issue_route_token(
        self, grant: AuthGrant, connection_shard: int, now_ms: int
    ) -> RouteToken | None:
        issued = await self.service.issue_route_token(
            grant.tenant_id, grant.user_id, grant.device_id, connection_shard, now_ms=now_ms
        )
        return RouteToken(token=issued.token.encode("ascii"), exp_ms=issued.claims.expires_at_ms)

    async def _consume(self, request: AuthRequest, grant: ServiceGrant) -> bool:
        try:
            claims = await self.service.consume_route_token(
                request.route_token.decode("ascii"),
                tenant_id=grant.tenant_id,
                user_id=grant.user_id,
                device_id=grant.device_id,
                now_ms=request.now_ms,
            )
        except (AuthError, UnicodeDecodeError, ValueError):
            return False
        return bool(claims.connection_shard == grant.connection_shard_id)


def _grant(grant: ServiceGrant, redirected: bool) -> AuthGrant:
    return AuthGrant(
        tenant_id=grant.tenant_id,
        user_id=grant.user_id,
        device_id=grant.device_id,
        session_epoch=grant.session_epoch,
        token_expires_at_ms=grant.expires_at_ms,
        redirected=redirected,
        token_id=grant.token_id,
        token_issued_at_ms=grant.issued_at_ms,
    )


async def connect_auth_service(
    redis_url: str, settings: Settings
) -> tuple[AuthServiceAdapter, Callable[[], Awaitable[None]]]:
    """An adapter over a new AuthService on ``redis_url`` and the coroutine that closes it.

    Keys and knobs come from the environment as ``qim.auth.config`` documents them; the shard
    counts from ``settings`` so AUTH_OK and the gateway route identically.
    """
    redis = Redis.from_url(redis_url)
    try:
        await ensure_safe_redis(redis)  # before serving: M-6, issue 21
    except BaseException:
        await redis.aclose()
        raise
    keyring, _source = load_keyring()
    service = AuthService(redis, keyring, AuthConfig.from_env(shards=configured_shards(settings)))

    async def close() -> None:
        await redis.aclose()

    return AuthServiceAdapter(service), close
