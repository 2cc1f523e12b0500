"""AuthService: token issue/verify, revocation, route tokens and ``session_epoch`` (§5.4.4, §15.3).

Used by the gateway at login (``AUTH``), on in-connection renewal (re-``AUTH``, §15.3.1), at the
``authz_recheck_interval`` recheck (§20.3.1) and for REDIRECT. Never per message, push or
heartbeat (direction §1: Redis is off the hot path).

``session_epoch`` (§5.4.4, §15.2.2, I-10/INV-45): per ``(tenant_id, user_id, device_id)``,
strictly increasing, never backwards across restarts or failover. Allocation is one Lua script::

    epoch = max(stored + 1, now_ms)

The ``+ 1`` makes it strictly increasing under any concurrency (Redis runs scripts serially).
The ``now_ms`` floor is the deliberate extra over a plain ``INCR``: Redis persists with AOF
``everysec`` and replicates asynchronously, so a crash or failover can lose the last increments
and a plain counter would hand out an old epoch again -- the one thing the spec forbids. With the
floor, any epoch issued after the loss is above the wall clock and so above every epoch issued
before it (those were at most their own ``now_ms`` plus the logins of that one millisecond). The
same argument lets the counter key expire after ``device_inactive_gc_days`` idle. Epochs are
therefore Unix-ms-sized u64 values, not small integers.

Revocation (§15.3.2, §20.3.2): a revoked ``token_id`` is remembered until that token expires; a
revoked device or user is a *watermark*: every token issued at or before ``revoked_at`` is
rejected with ``TOKEN_REVOKED``, and logging in again later (a new token) works. Records expire
after ``revocation_record_retention``, when every token they could hit has expired anyway. The
check and the epoch allocation are one atomic script, so a login racing a revocation either sees
it or got its epoch before the revocation was committed (and is then kicked by the broadcast).
Publishing the ``PresenceRevoke`` record to the presence topic is the caller's job, through the
optional ``revocation_sink``; a user-scope revocation must be expanded to one record per device
there (§15.3.2).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, cast

from redis.asyncio import Redis

from qim.auth import keys
from qim.auth.config import AuthConfig
from qim.auth.errors import PERMISSION_DENIED, TOKEN_REVOKED, UPGRADE_REQUIRED, AuthError
from qim.auth.standard_jwt import JwtIssuers, looks_like_jwt
from qim.auth.tokens import AccessClaims, Issued, KeyRing, RouteClaims, TokenCodec, check_id
from qim.auth.versions import client_version_at_least
from qim.schemas.routing import connection_shard_id, lane_id, mailbox_shard_id, user_bucket

__all__ = [
    "AuthGrant",
    "AuthService",
    "BoundSession",
    "KickReason",
    "Revocation",
    "RevocationSink",
    "now_ms",
]

KickReason = Literal["token_revoked", "admin", "banned"]
"""``KICKED.reason`` the revocation should produce on live connections (§20.3.2 table)."""
_KICK_REASONS: Final = frozenset({"token_revoked", "admin", "banned"})

# KEYS: revoked-token, revoked-device, revoked-user, epoch
# ARGV: issued_at_ms, epoch floor (now_ms), allocate ("1"/"0"), epoch key ttl ms
# -> {0, epoch} ok (epoch 0 when not allocating), {1|2|3, 0} revoked by token|device|user
_CHECK_AND_ALLOCATE: Final = """
if redis.call('EXISTS', KEYS[1]) == 1 then return {1, 0} end
local iat = tonumber(ARGV[1])
local dev = redis.call('GET', KEYS[2])
if dev and iat <= tonumber(dev) then return {2, 0} end
local usr = redis.call('GET', KEYS[3])
if usr and iat <= tonumber(usr) then return {3, 0} end
if ARGV[3] ~= '1' then return {0, 0} end
local nxt = tonumber(redis.call('GET', KEYS[4]) or '0') + 1
local floor = tonumber(ARGV[2])
if floor > nxt then nxt = floor end
redis.call('SET', KEYS[4], string.format('%d', nxt), 'PX', ARGV[4])
return {0, nxt}
"""

# KEYS: watermark key; ARGV: revoked_at_ms, retention ms -> the stored (max) watermark
_RAISE_WATERMARK: Final = """
local v = tonumber(ARGV[1])
local cur = redis.call('GET', KEYS[1])
if cur and tonumber(cur) > v then v = tonumber(cur) end
redis.call('SET', KEYS[1], string.format('%d', v), 'PX', ARGV[2])
return v
"""

_MAX_REVOCATION_HORIZON_MS: Final = 366 * 86_400_000  # no token lives longer than this
_REVOKED_BY: Final = {1: "token_revoked", 2: "device_revoked", 3: "user_revoked"}


def now_ms() -> int:
    """Wall clock in Unix ms: the default ``now`` of every AuthService call."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class AuthGrant:
    """A successful ``AUTH``: who, which ``session_epoch``, and where the user's data lives."""

    tenant_id: str
    user_id: str
    device_id: str
    session_epoch: int
    token_id: str
    issued_at_ms: int
    expires_at_ms: int
    client_version: str
    user_bucket: int
    mailbox_shard_id: int
    connection_shard_id: int
    lane_id: int


@dataclass(frozen=True, slots=True)
class Revocation:
    """A committed revocation; what the ``PresenceRevoke`` publisher needs (§20.3.2)."""

    scope: Literal["token", "device", "user"]
    reason: KickReason
    revoked_at_ms: int
    retained_until_ms: int
    tenant_id: str | None = None
    user_id: str | None = None
    device_id: str | None = None
    token_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "reason": self.reason,
            "revoked_at": self.revoked_at_ms,
            "retained_until": self.retained_until_ms,
            "tenant_id": self.tenant_id,
            "user_id": self.user_id,
            "device_id": self.device_id,
            "token_id": self.token_id,
        }


RevocationSink = Callable[[Revocation], Awaitable[None]]


class BoundSession(Protocol):
    """The identity a live connection is bound to (what re-``AUTH`` must match)."""

    @property
    def tenant_id(self) -> str: ...
    @property
    def user_id(self) -> str: ...
    @property
    def device_id(self) -> str: ...
    @property
    def session_epoch(self) -> int: ...


def _now(value: int | None) -> int:
    return now_ms() if value is None else value


def _deny(reason: str, detail: str) -> AuthError:
    return AuthError(PERMISSION_DENIED, detail=detail, reason=reason)


def _check_reason(reason: str) -> KickReason:
    if reason not in _KICK_REASONS:
        raise ValueError(f"reason must be one of {sorted(_KICK_REASONS)}, got {reason!r}")
    return cast(KickReason, reason)


class AuthService:
    """Redis-backed AuthService. Does not own ``redis``: the caller opens and closes it."""

    def __init__(
        self,
        redis: Redis,
        keyring: KeyRing,
        config: AuthConfig | None = None,
        *,
        revocation_sink: RevocationSink | None = None,
    ) -> None:
        self._redis = redis
        self._config = config if config is not None else AuthConfig()
        path = self._config.jwt_issuers_file
        self._jwt = JwtIssuers.load(path) if path is not None else None
        self._codec = TokenCodec(
            keyring, clock_skew_ms=self._config.clock_skew_ms, jwt_issuers=self._jwt
        )
        self._sink = revocation_sink
        self._check_script = redis.register_script(_CHECK_AND_ALLOCATE)
        self._watermark_script = redis.register_script(_RAISE_WATERMARK)

    async def _prefetch(self, token: str) -> None:
        """A JWT whose issuer publishes a JWKS URL: fetch an unseen kid off the event loop."""
        if self._jwt is not None and looks_like_jwt(token):
            await asyncio.to_thread(self._jwt.prefetch, token)

    @property
    def redis(self) -> Redis:
        return self._redis

    @property
    def config(self) -> AuthConfig:
        return self._config

    @property
    def codec(self) -> TokenCodec:
        return self._codec

    # -- access tokens -------------------------------------------------------------------------

    def _ttl_ms(self, ttl_s: float | None, default_ms: int) -> int:
        if ttl_s is None:
            return default_ms
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float):
            raise ValueError("ttl_s must be a number of seconds")
        if not (math.isfinite(ttl_s) and ttl_s > 0):
            raise ValueError("ttl_s must be a positive, finite number of seconds")
        ttl_ms = round(ttl_s * 1000)
        if not 0 < ttl_ms <= self._config.max_token_ttl_ms:
            raise ValueError(f"ttl_s must be <= {self._config.max_token_ttl_ms // 1000} s")
        return ttl_ms

    async def issue(
        self,
        tenant_id: str,
        user_id: str,
        device_id: str | None = None,
        *,
        ttl_s: float | None = None,
        now_ms: int | None = None,
    ) -> Issued[AccessClaims]:
        """Sign an access token (bound to ``device_id``, or to any device of the user if None)."""
        ttl_ms = self._ttl_ms(ttl_s, self._config.access_token_ttl_ms)
        return self._codec.issue_access(
            tenant_id, user_id, device_id, now_ms=_now(now_ms), ttl_ms=ttl_ms
        )

    async def issue_token(
        self,
        tenant_id: str,
        user_id: str,
        device_id: str | None = None,
        ttl_s: float | None = None,
        *,
        now_ms: int | None = None,
    ) -> str:
        """Just the token string of :meth:`issue`."""
        issued = await self.issue(tenant_id, user_id, device_id, ttl_s=ttl_s, now_ms=now_ms)
        return issued.token

    # -- AUTH ----------------------------------------------------------------------------------

    def _presented_device(self, device_id: object, claims: AccessClaims) -> str:
        try:
            device = check_id(device_id, "device_id")
        except ValueError:
            raise _deny("bad_device_id", "invalid_device_id") from None
        if claims.device_id is not None and claims.device_id != device:
            raise _deny("device_mismatch", "device_mismatch")
        return device

    def _version_ok(self, tenant_id: str, client_version: object) -> str | None:
        """None if the version is acceptable, else the minimum it failed."""
        minimum = self._config.minimum_for(tenant_id)
        if minimum is None or client_version_at_least(client_version, minimum):
            return None
        return minimum

    async def _check(
        self, claims: AccessClaims, device_id: str, now: int, *, allocate: bool
    ) -> int:
        prefix = self._config.key_prefix
        result = await self._check_script(
            keys=[
                keys.token_revocation_key(prefix, claims.token_id),
                keys.device_revocation_key(prefix, claims.tenant_id, claims.user_id, device_id),
                keys.user_revocation_key(prefix, claims.tenant_id, claims.user_id),
                keys.epoch_key(prefix, claims.tenant_id, claims.user_id, device_id),
            ],
            args=[
                claims.issued_at_ms,
                now,
                "1" if allocate else "0",
                self._config.epoch_key_ttl_ms,
            ],
        )
        status, epoch = int(result[0]), int(result[1])
        if status:
            raise AuthError(TOKEN_REVOKED, detail="token_revoked", reason=_REVOKED_BY[status])
        return epoch

    def _grant(
        self, claims: AccessClaims, device_id: str, epoch: int, client_version: str
    ) -> AuthGrant:
        shards = self._config.shards
        bucket = user_bucket(claims.tenant_id, claims.user_id, shards.virtual_bucket_count)
        return AuthGrant(
            tenant_id=claims.tenant_id,
            user_id=claims.user_id,
            device_id=device_id,
            session_epoch=epoch,
            token_id=claims.token_id,
            issued_at_ms=claims.issued_at_ms,
            expires_at_ms=claims.expires_at_ms,
            client_version=client_version,
            user_bucket=bucket,
            mailbox_shard_id=mailbox_shard_id(bucket, shards.mailbox_shard_count),
            connection_shard_id=connection_shard_id(bucket, shards.connection_shard_count),
            lane_id=lane_id(claims.tenant_id, claims.user_id, shards.lane_count),
        )

    async def authenticate(
        self,
        token: str,
        device_id: str,
        client_version: str,
        now_ms: int | None = None,
    ) -> AuthGrant:
        """First ``AUTH`` of a connection: verify, check revocation and version, new epoch.

        Check order: signature/shape (PERMISSION_DENIED) -> expiry (TOKEN_EXPIRED) -> device
        binding (PERMISSION_DENIED) -> revocation (TOKEN_REVOKED, ahead of the version so a lost
        device learns to wipe itself) -> ``minimum_client_version`` (UPGRADE_REQUIRED, no
        session, §27.1.3). A failed AUTH never consumes a ``session_epoch``.
        """
        now = _now(now_ms)
        await self._prefetch(token)
        claims = self._codec.verify_access(token, now_ms=now)
        device = self._presented_device(device_id, claims)
        minimum = self._version_ok(claims.tenant_id, client_version)
        epoch = await self._check(claims, device, now, allocate=minimum is None)
        if minimum is not None:
            raise AuthError(
                UPGRADE_REQUIRED,
                detail="client_version_below_minimum",
                extras={"minimum_client_version": minimum},
            )
        return self._grant(claims, device, epoch, client_version)

    async def reauthenticate(
        self,
        token: str,
        device_id: str,
        client_version: str,
        *,
        bound: BoundSession,
        now_ms: int | None = None,
    ) -> AuthGrant:
        """Re-``AUTH`` on a live connection (§15.3.1): same ``session_epoch``, newer token.

        ``bound`` is the connection's session (an :class:`AuthGrant`, or anything with the same
        four identity fields). The new token must name its tenant and user, and ``device_id`` must
        be the bound one, else PERMISSION_DENIED (the gateway then closes, INV-47). No epoch is
        allocated and nothing is written.
        """
        now = _now(now_ms)
        await self._prefetch(token)
        claims = self._codec.verify_access(token, now_ms=now)
        if (claims.tenant_id, claims.user_id) != (bound.tenant_id, bound.user_id):
            raise _deny("identity_mismatch", "identity_mismatch")
        if device_id != bound.device_id:
            raise _deny("device_mismatch", "device_mismatch")
        device = self._presented_device(device_id, claims)
        minimum = self._version_ok(claims.tenant_id, client_version)
        await self._check(claims, device, now, allocate=False)
        if minimum is not None:
            raise AuthError(
                UPGRADE_REQUIRED,
                detail="client_version_below_minimum",
                extras={"minimum_client_version": minimum},
            )
        return self._grant(claims, device, bound.session_epoch, client_version)

    async def recheck(self, grant: AuthGrant, now_ms: int | None = None) -> None:
        """The ``authz_recheck_interval`` fallback (§20.3.1): raise TOKEN_REVOKED if revoked.

        Expiry is not judged here: the read-only ``token_expiry_grace`` is the gateway's rule.
        """
        claims = AccessClaims(
            tenant_id=grant.tenant_id,
            user_id=grant.user_id,
            device_id=grant.device_id,
            issued_at_ms=grant.issued_at_ms,
            expires_at_ms=grant.expires_at_ms,
            token_id=grant.token_id,
        )
        await self._check(claims, grant.device_id, _now(now_ms), allocate=False)

    async def current_session_epoch(self, tenant_id: str, user_id: str, device_id: str) -> int:
        """The last epoch handed out for a device (0 if none or expired); for ops and tests."""
        key = keys.epoch_key(
            self._config.key_prefix,
            check_id(tenant_id, "tenant_id"),
            check_id(user_id, "user_id"),
            check_id(device_id, "device_id"),
        )
        raw = await self._redis.get(key)
        return int(raw) if raw is not None else 0

    # -- revocation ----------------------------------------------------------------------------

    async def _publish(self, revocation: Revocation) -> Revocation:
        if self._sink is not None:
            await self._sink(revocation)
        return revocation

    async def revoke_token(
        self,
        token_id: str,
        until_ms: int | None = None,
        *,
        reason: KickReason = "token_revoked",
        now_ms: int | None = None,
    ) -> Revocation:
        """Revoke one access token. ``until_ms`` = its ``expires_at`` if known (keeps the record
        no longer than needed); otherwise the longest any token can live is assumed."""
        check_id(token_id, "token_id")
        reason = _check_reason(reason)
        now = _now(now_ms)
        if until_ms is None:
            until_ms = now + self._config.max_token_ttl_ms
        if isinstance(until_ms, bool) or not isinstance(until_ms, int):
            raise ValueError("until_ms must be an int of Unix ms")
        if not 0 <= until_ms <= now + _MAX_REVOCATION_HORIZON_MS:
            raise ValueError("until_ms must be a Unix ms time within a year from now")
        retained_until = until_ms + self._config.clock_skew_ms + self._config.revocation_margin_ms
        ttl = max(retained_until - now, 1)
        await self._redis.set(
            keys.token_revocation_key(self._config.key_prefix, token_id), b"1", px=ttl
        )
        return await self._publish(Revocation("token", reason, now, now + ttl, token_id=token_id))

    async def _raise_watermark(self, key: bytes, now: int) -> tuple[int, int]:
        ttl = self._config.revocation_retention_ms
        stored = await self._watermark_script(keys=[key], args=[now, ttl])
        return int(stored), now + ttl

    async def revoke_device(
        self,
        tenant_id: str,
        user_id: str,
        device_id: str,
        *,
        reason: KickReason = "token_revoked",
        now_ms: int | None = None,
    ) -> Revocation:
        """Remote logout of one device: every token it got so far stops working."""
        check_id(tenant_id, "tenant_id")
        check_id(user_id, "user_id")
        check_id(device_id, "device_id")
        reason = _check_reason(reason)
        key = keys.device_revocation_key(self._config.key_prefix, tenant_id, user_id, device_id)
        at, until = await self._raise_watermark(key, _now(now_ms))
        return await self._publish(
            Revocation("device", reason, at, until, tenant_id, user_id, device_id)
        )

    async def revoke_user(
        self,
        tenant_id: str,
        user_id: str,
        *,
        reason: KickReason = "token_revoked",
        now_ms: int | None = None,
    ) -> Revocation:
        """Log out everywhere (password change, ``banned``): all devices' tokens so far."""
        check_id(tenant_id, "tenant_id")
        check_id(user_id, "user_id")
        reason = _check_reason(reason)
        key = keys.user_revocation_key(self._config.key_prefix, tenant_id, user_id)
        at, until = await self._raise_watermark(key, _now(now_ms))
        return await self._publish(Revocation("user", reason, at, until, tenant_id, user_id))

    # -- route tokens (REDIRECT, §5.3.2) -------------------------------------------------------

    async def issue_route_token(
        self,
        tenant_id: str,
        user_id: str,
        device_id: str,
        connection_shard: int,
        *,
        now_ms: int | None = None,
    ) -> Issued[RouteClaims]:
        """Sign the ``route_token`` of a ``REDIRECT{route_token, connection_shard, exp}``."""
        count = self._config.shards.connection_shard_count
        if isinstance(connection_shard, bool) or not 0 <= connection_shard < count:
            raise ValueError(f"connection_shard must be in [0, {count})")
        return self._codec.issue_route(
            tenant_id,
            user_id,
            device_id,
            connection_shard,
            now_ms=_now(now_ms),
            ttl_ms=self._config.route_token_ttl_ms,
        )

    async def consume_route_token(
        self,
        token: str,
        *,
        tenant_id: str,
        user_id: str,
        device_id: str,
        now_ms: int | None = None,
    ) -> RouteClaims:
        """Accept a route token once, for the identity it was issued to; PERMISSION_DENIED else.

        Call after the access token was verified, with that identity. Used-marks live in Redis
        (``SET NX``) until the token could no longer verify anyway.
        """
        now = _now(now_ms)
        claims = self._codec.verify_route(token, now_ms=now)
        if (claims.tenant_id, claims.user_id, claims.device_id) != (tenant_id, user_id, device_id):
            raise _deny("route_token_identity_mismatch", "invalid_route_token")
        ttl = claims.expires_at_ms + self._codec.clock_skew_ms - now + 1
        key = keys.route_used_key(self._config.key_prefix, claims.token_id)
        if not await self._redis.set(key, b"1", px=max(ttl, 1), nx=True):
            raise _deny("route_token_reused", "invalid_route_token")
        return claims
