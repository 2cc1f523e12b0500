"""An in-process Authenticator: HMAC-signed tokens, epochs in a dict (tests, ``--dev-auth``).

It follows the AuthService contract the node relies on: tokens are bound to (tenant, user,
device) and expire; revoked devices get TOKEN_REVOKED; a client below
``minimum_client_version`` gets UPGRADE_REQUIRED; session_epoch is strictly increasing per
(tenant, user, device) - within this process only, so it is no substitute for the Redis-backed
AuthService in production (§5.4.4: epochs must survive restarts).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets

from qim.gateway.ports import AuthGrant, AuthRejected, AuthRequest, RouteToken
from qim.schemas.frames import ErrorCode

__all__ = ["MemoryAuthenticator", "version_tuple"]


def version_tuple(version: str) -> tuple[int, ...]:
    """'2.10.1' -> (2, 10, 1); a non-numeric part counts as 0 (never raises)."""
    parts = []
    for part in version.split("/")[-1].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class MemoryAuthenticator:
    """Issues and checks its own tokens; ``epochs`` is the per-device session_epoch counter."""

    def __init__(
        self,
        secret: bytes | None = None,
        *,
        minimum_client_version: str = "",
        route_token_ttl_ms: int = 60_000,
    ) -> None:
        self._secret = secret or secrets.token_bytes(32)
        self.minimum_client_version = minimum_client_version
        self.route_token_ttl_ms = route_token_ttl_ms
        self.epochs: dict[tuple[str, str, str], int] = {}
        self.revoked: set[tuple[str, str, str]] = set()
        self.route_tokens: dict[bytes, tuple[tuple[str, str, str], int]] = {}
        self.calls = 0

    def issue_token(
        self, tenant_id: str, user_id: str, device_id: str, *, now_ms: int, ttl_ms: int = 3_600_000
    ) -> str:
        claims = {"t": tenant_id, "u": user_id, "d": device_id, "exp": now_ms + ttl_ms}
        payload = json.dumps(claims, separators=(",", ":"), sort_keys=True).encode()
        return f"{_b64(payload)}.{_b64(self._sign(payload))}"

    def revoke(self, tenant_id: str, user_id: str, device_id: str) -> None:
        self.revoked.add((tenant_id, user_id, device_id))

    async def authenticate(self, request: AuthRequest) -> AuthGrant:
        identity, exp = self._verify(request)
        epoch = self.epochs.get(identity, 0) + 1
        self.epochs[identity] = epoch
        issued = self.route_tokens.pop(request.route_token, None) if request.route_token else None
        redirected = issued is not None and issued[0] == identity and issued[1] > request.now_ms
        return AuthGrant(
            *identity, session_epoch=epoch, token_expires_at_ms=exp, redirected=redirected
        )

    async def renew(self, request: AuthRequest, grant: AuthGrant) -> AuthGrant:
        identity, exp = self._verify(request)
        return AuthGrant(*identity, session_epoch=grant.session_epoch, token_expires_at_ms=exp)

    async def issue_route_token(
        self, grant: AuthGrant, connection_shard: int, now_ms: int
    ) -> RouteToken | None:
        exp = now_ms + self.route_token_ttl_ms
        body = f"{grant.tenant_id}\0{grant.user_id}\0{grant.device_id}\0{connection_shard}\0{exp}"
        token = self._sign(body.encode() + secrets.token_bytes(8))
        self.route_tokens[token] = ((grant.tenant_id, grant.user_id, grant.device_id), exp)
        return RouteToken(token=token, exp_ms=exp)

    def _sign(self, payload: bytes) -> bytes:
        return hmac.new(self._secret, payload, hashlib.sha256).digest()

    def _verify(self, request: AuthRequest) -> tuple[tuple[str, str, str], int]:
        self.calls += 1
        try:
            head, sig = request.access_token.split(".", 1)
            payload = _unb64(head)
            good = hmac.compare_digest(_unb64(sig), self._sign(payload))
            claims = json.loads(payload) if good else None
            identity = (str(claims["t"]), str(claims["u"]), str(claims["d"])) if claims else None
            exp = int(claims["exp"]) if claims else 0
        except (ValueError, KeyError, TypeError):
            identity, exp = None, 0
        if identity is None:
            raise AuthRejected(ErrorCode.PERMISSION_DENIED, "invalid access_token")
        if identity[2] != request.device_id:
            raise AuthRejected(ErrorCode.PERMISSION_DENIED, "token bound to another device")
        if identity in self.revoked:
            raise AuthRejected(ErrorCode.TOKEN_REVOKED, "device revoked")
        if exp <= request.now_ms:
            raise AuthRejected(ErrorCode.TOKEN_EXPIRED, "access_token expired")
        minimum = self.minimum_client_version
        if minimum and version_tuple(request.client_version) < version_tuple(minimum):
            raise AuthRejected(
                ErrorCode.UPGRADE_REQUIRED,
                "client below minimum_client_version",
                minimum_client_version=minimum,
            )
        return identity, exp
