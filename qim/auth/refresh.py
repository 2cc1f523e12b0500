"""Refresh tokens (spec 15.3): issue, rotate on every use, and catch a stolen one by its reuse.

A refresh token is 32 random bytes (base64url), never a signed blob: it is only ever checked
against Redis, which holds its SHA-256, not the token. Every refresh token belongs to a *family*
started at login. Using one rotates it: the old one is marked used (kept until it would have
expired) and a new one of the same family is handed out with a fresh ``refresh_token_ttl``
(sliding, 15.3). Presenting a used one again means two parties hold the family (the classic
theft signal): the family is revoked and so is the device (a watermark: every access token it
got so far stops, and live sessions are kicked through the revocation sink), and the caller gets
``TOKEN_REVOKED``. The check-and-mark is one Lua script, so two concurrent refreshes with the
same token cannot both win.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from dataclasses import dataclass
from typing import Final

from redis.asyncio import Redis

from qim.auth import keys
from qim.auth.errors import PERMISSION_DENIED, TOKEN_REVOKED, AuthError
from qim.auth.service import AuthService
from qim.auth.tokens import check_id

__all__ = ["DEFAULT_REFRESH_TOKEN_TTL_MS", "RefreshTokens", "Refreshed"]

DEFAULT_REFRESH_TOKEN_TTL_MS: Final = 30 * 86_400_000  # Appendix B refresh_token_ttl, 30 d
_MAX_TOKEN_CHARS: Final = 128

# KEYS: the presented token's record, its family's revocation mark; ARGV: family mark ttl ms
# -> {1} rotated (marked used) | {2} reused (family now revoked) | {3} family revoked | {0} unknown
_ROTATE: Final = """
local raw = redis.call('GET', KEYS[1])
if not raw then return {0} end
local rec = cjson.decode(raw)
if redis.call('EXISTS', KEYS[2]) == 1 then return {3} end
if rec.used == 1 then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[1])
  return {2}
end
rec.used = 1
redis.call('SET', KEYS[1], cjson.encode(rec), 'KEEPTTL')
return {1}
"""


@dataclass(frozen=True, slots=True)
class Refreshed:
    """A new access token and the refresh token that replaces the presented one."""

    access_token: str
    expires_at_ms: int
    refresh_token: str
    refresh_expires_at_ms: int


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("ascii")).hexdigest()


def _deny(reason: str) -> AuthError:
    return AuthError(PERMISSION_DENIED, detail="invalid_refresh_token", reason=reason)


class RefreshTokens:
    """Refresh tokens over the AuthService's Redis; access tokens come from ``service``."""

    def __init__(
        self,
        service: AuthService,
        redis: Redis,
        *,
        ttl_ms: int = DEFAULT_REFRESH_TOKEN_TTL_MS,
        key_prefix: str = "qim",
    ) -> None:
        if ttl_ms < 1:
            raise ValueError("refresh_token_ttl must be positive")
        self._service = service
        self._redis = redis
        self._ttl_ms = ttl_ms
        self._prefix = key_prefix
        self._rotate = redis.register_script(_ROTATE)

    def _record_key(self, digest: str) -> bytes:
        return keys._key(self._prefix, "refresh", digest)

    def _family_key(self, family: str) -> bytes:
        return keys._key(self._prefix, "refresh-family-revoked", family)

    async def _new(
        self, tenant_id: str, user_id: str, device_id: str, family: str, now_ms: int
    ) -> tuple[str, int]:
        token = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
        record = {"t": tenant_id, "u": user_id, "d": device_id, "f": family, "used": 0}
        await self._redis.set(self._record_key(_digest(token)), json.dumps(record), px=self._ttl_ms)
        return token, now_ms + self._ttl_ms

    async def issue(
        self, tenant_id: str, user_id: str, device_id: str, *, now_ms: int
    ) -> Refreshed:
        """A login: an access token bound to the device and the first token of a new family."""
        for value, name in (
            (tenant_id, "tenant_id"),
            (user_id, "user_id"),
            (device_id, "device_id"),
        ):
            check_id(value, name)
        issued = await self._service.issue(tenant_id, user_id, device_id, now_ms=now_ms)
        family = secrets.token_hex(16)
        token, until = await self._new(tenant_id, user_id, device_id, family, now_ms)
        return Refreshed(issued.token, issued.claims.expires_at_ms, token, until)

    async def refresh(self, refresh_token: object, *, now_ms: int) -> Refreshed:
        """Rotate ``refresh_token``: PERMISSION_DENIED if unknown or expired, TOKEN_REVOKED if
        its family was revoked or it was already used (which revokes the family and device)."""
        if (
            not isinstance(refresh_token, str)
            or not 16 <= len(refresh_token) <= _MAX_TOKEN_CHARS
            or not refresh_token.isascii()
        ):
            raise _deny("bad_shape")
        record_key = self._record_key(_digest(refresh_token))
        raw = await self._redis.get(record_key)
        if raw is None:
            raise _deny("unknown_or_expired")
        record = json.loads(raw)
        tenant, user, device, family = record["t"], record["u"], record["d"], record["f"]
        (verdict,) = await self._rotate(
            keys=[record_key, self._family_key(family)], args=[self._ttl_ms]
        )
        if verdict == 0:
            raise _deny("unknown_or_expired")
        if verdict == 2:
            await self._service.revoke_device(tenant, user, device, reason="token_revoked")
            raise AuthError(TOKEN_REVOKED, detail="refresh_token_reused", reason="reused")
        if verdict == 3:
            raise AuthError(TOKEN_REVOKED, detail="refresh_token_revoked", reason="family")
        issued = await self._service.issue(tenant, user, device, now_ms=now_ms)
        token, until = await self._new(tenant, user, device, family, now_ms)
        return Refreshed(issued.token, issued.claims.expires_at_ms, token, until)
