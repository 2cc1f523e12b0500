"""The AuthService admin HTTP endpoint: issue tokens and revoke them (operators, account system).

Bound to 127.0.0.1 by default and protected by a shared secret in the ``X-Qim-Admin-Secret``
header (compared in constant time). Put it behind service-to-service mTLS before exposing it
beyond loopback (§20.1: nothing is trusted for being on the internal network).

``POST /v1/tokens``      ``{tenant_id, user_id, device_id?, ttl_s?}``
                         -> ``200 {access_token, token_id, issued_at, expires_at}`` (Unix ms)
``POST /v1/tokens`` with ``refresh: true`` and a ``device_id`` (a login)
                         -> ``200 {access_token, expires_at, refresh_token, refresh_expires_at}``
``POST /v1/token/refresh`` ``{refresh_token}`` -- the client's own call, no admin secret (the
                         refresh token is the credential; ``qim.auth.refresh``): the same
                         answer with a rotated refresh token; ``401`` unknown / expired,
                         ``403 {error: TOKEN_REVOKED}`` revoked or reused (reuse revokes the
                         family and the device)
``POST /v1/revocations`` one of
                         ``{token_id, until?}``                        one token (until: exp ms)
                         ``{tenant_id, user_id, device_id, reason?}``  one device
                         ``{tenant_id, user_id, reason?}``             all the user's devices
                         ``reason`` = ``KICKED.reason``: ``admin`` (default here, §20.3.2 "admin
                         revokes a device"), ``token_revoked`` (user logout) or ``banned``
                         -> ``200 {revocation: {...}}``
Errors: ``401 {error: "unauthorized"}``, ``400 {error: "<what is wrong>"}``. Tokens are never
logged (§20.6); the access log shows only method, path and status.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, cast

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from qim.auth.errors import PERMISSION_DENIED, AuthError
from qim.auth.refresh import Refreshed, RefreshTokens
from qim.auth.service import AuthService, KickReason, now_ms

__all__ = [
    "ADMIN_SECRET_HEADER",
    "DEFAULT_ADMIN_HOST",
    "DEFAULT_ADMIN_PORT",
    "AdminServer",
    "make_admin_app",
    "serve_admin",
    "start_admin_server",
]

ADMIN_SECRET_HEADER: Final = "X-Qim-Admin-Secret"
DEFAULT_ADMIN_HOST: Final = "127.0.0.1"
DEFAULT_ADMIN_PORT: Final = 16090
_MAX_BODY_BYTES: Final = 64 * 1024
_SERVICE: Final = web.AppKey("auth_service", AuthService)
_REFRESH: Final = web.AppKey("refresh_tokens", RefreshTokens)
REFRESH_PATH: Final = "/v1/token/refresh"


class _BadRequest(Exception):
    pass


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _str_field(body: dict[str, Any], name: str, *, required: bool) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise _BadRequest(f"{name} is required")
        return None
    if not isinstance(value, str):
        raise _BadRequest(f"{name} must be a string")
    return value


async def _json_object(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise _BadRequest("body must be JSON") from None
    if not isinstance(body, dict):
        raise _BadRequest("body must be a JSON object")
    return body


async def _issue(request: web.Request) -> web.Response:
    service = request.app[_SERVICE]
    body = await _json_object(request)
    tenant_id = cast(str, _str_field(body, "tenant_id", required=True))
    user_id = cast(str, _str_field(body, "user_id", required=True))
    device_id = _str_field(body, "device_id", required=False)
    ttl_s = body.get("ttl_s")
    if ttl_s is not None and (isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float)):
        raise _BadRequest("ttl_s must be a number")
    if body.get("refresh") is True:  # a login: the first refresh token of a new family too
        if device_id is None or ttl_s is not None:
            raise _BadRequest("refresh needs device_id and the default ttl")
        pair = await request.app[_REFRESH].issue(tenant_id, user_id, device_id, now_ms=now_ms())
        return web.json_response(_refreshed(pair))
    issued = await service.issue(tenant_id, user_id, device_id, ttl_s=ttl_s)
    return web.json_response(
        {
            "access_token": issued.token,
            "token_id": issued.claims.token_id,
            "issued_at": issued.claims.issued_at_ms,
            "expires_at": issued.claims.expires_at_ms,
        }
    )


async def _revoke(request: web.Request) -> web.Response:
    service = request.app[_SERVICE]
    body = await _json_object(request)
    reason = cast(KickReason, _str_field(body, "reason", required=False) or "admin")
    token_id = _str_field(body, "token_id", required=False)
    if token_id is not None:
        if "tenant_id" in body or "user_id" in body or "device_id" in body:
            raise _BadRequest("give either token_id or tenant_id/user_id[/device_id]")
        until = body.get("until")
        if until is not None and (isinstance(until, bool) or not isinstance(until, int)):
            raise _BadRequest("until must be an int of Unix ms")
        revocation = await service.revoke_token(token_id, until, reason=reason)
    else:
        tenant_id = cast(str, _str_field(body, "tenant_id", required=True))
        user_id = cast(str, _str_field(body, "user_id", required=True))
        device_id = _str_field(body, "device_id", required=False)
        if device_id is None:
            revocation = await service.revoke_user(tenant_id, user_id, reason=reason)
        else:
            revocation = await service.revoke_device(tenant_id, user_id, device_id, reason=reason)
    return web.json_response({"revocation": revocation.to_json()})


def _refreshed(pair: Refreshed) -> dict[str, object]:
    return {
        "access_token": pair.access_token,
        "expires_at": pair.expires_at_ms,
        "refresh_token": pair.refresh_token,
        "refresh_expires_at": pair.refresh_expires_at_ms,
    }


async def _refresh(request: web.Request) -> web.Response:
    """The client's own call: the refresh token is the credential (no admin secret)."""
    body = await _json_object(request)
    token = _str_field(body, "refresh_token", required=True)
    try:
        pair = await request.app[_REFRESH].refresh(token, now_ms=now_ms())
    except AuthError as exc:
        status = 401 if exc.code == PERMISSION_DENIED else 403
        return web.json_response({"error": exc.code, "detail": exc.detail}, status=status)
    return web.json_response(_refreshed(pair))


def _guard(admin_secret: bytes) -> Middleware:
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        presented = request.headers.get(ADMIN_SECRET_HEADER, "").encode("utf-8", "replace")
        if request.path != REFRESH_PATH and not hmac.compare_digest(presented, admin_secret):
            return _error(401, "unauthorized")
        try:
            return await handler(request)
        except _BadRequest as exc:
            return _error(400, str(exc))
        except ValueError as exc:  # the service's input validation
            return _error(400, str(exc))

    return guard


def make_admin_app(
    service: AuthService, admin_secret: str, refresh: RefreshTokens | None = None
) -> web.Application:
    """The admin aiohttp app; every route requires ``X-Qim-Admin-Secret: <admin_secret>``."""
    if len(admin_secret) < 16:
        raise ValueError("admin_secret must be at least 16 characters")
    app = web.Application(
        middlewares=[_guard(admin_secret.encode("utf-8"))], client_max_size=_MAX_BODY_BYTES
    )
    app[_SERVICE] = service
    app[_REFRESH] = refresh or RefreshTokens(
        service,
        service.redis,
        ttl_ms=service.config.refresh_token_ttl_ms,
        key_prefix=service.config.key_prefix,
    )
    app.router.add_post("/v1/tokens", _issue)
    app.router.add_post("/v1/revocations", _revoke)
    app.router.add_post(REFRESH_PATH, _refresh)
    return app


@dataclass(frozen=True, slots=True)
class AdminServer:
    """A started admin endpoint; ``await server.close()`` stops it."""

    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def close(self) -> None:
        await self.runner.cleanup()


async def start_admin_server(
    service: AuthService,
    admin_secret: str,
    *,
    host: str = DEFAULT_ADMIN_HOST,
    port: int = DEFAULT_ADMIN_PORT,
) -> AdminServer:
    """Start the admin app in the running loop (``port=0`` picks a free one)."""
    runner = web.AppRunner(make_admin_app(service, admin_secret))
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = port
    addresses = runner.addresses
    if addresses:
        bound = int(addresses[0][1])
    return AdminServer(runner, host, bound)


async def serve_admin(
    service: AuthService,
    admin_secret: str,
    *,
    host: str = DEFAULT_ADMIN_HOST,
    port: int = DEFAULT_ADMIN_PORT,
    ready: Callable[[AdminServer], None] | None = None,
) -> None:
    """Run the admin endpoint until cancelled (``qim token serve``)."""
    server = await start_admin_server(service, admin_secret, host=host, port=port)
    try:
        if ready is not None:
            ready(server)
        await asyncio.Event().wait()
    finally:
        await server.close()
