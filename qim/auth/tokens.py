"""Signed compact tokens: ``access_token`` and ``route_token`` (spec §20.2.1, §15.3, §5.3.2).

Pure: no I/O, no clock. ``now_ms`` is always an argument, so expiry is testable to the
millisecond and every node that verifies gives the same answer for the same inputs.

Wire form (ASCII, four dot-separated parts)::

    <typ>.<kid>.<payload>.<sig>

    typ      "qat1" = access_token, "qrt1" = route_token. It is inside the MAC input and selects
             a per-type subkey, so a route token can never be replayed as an access token.
    kid      the signing key's id in the :class:`KeyRing`, ``[A-Za-z0-9_-]{1,32}``.
    payload  base64url, no padding, of the canonical JSON claims (sorted keys, no spaces).
    sig      base64url, no padding, of HMAC-SHA256(subkey, "<typ>.<kid>.<payload>"),
             subkey = HMAC-SHA256(secret, "qim-auth-v1/" + typ).

Verification order matters: shape -> kid -> MAC (constant-time) -> claims -> time. Claims are
parsed only after the MAC matched, so a forged token never reaches the JSON parser, and an
expired *forged* token is ``PERMISSION_DENIED``, never ``TOKEN_EXPIRED`` (no oracle).

Times are Unix milliseconds. A token is valid while ``now_ms < expires_at + clock_skew_ms`` and
once ``issued_at <= now_ms + clock_skew_ms``; the skew absorbs clock differences between the
issuing and the verifying node.

Key rotation (§17 "signing keys external"): the :class:`KeyRing` holds several keys; the first is
active and signs, every key verifies. Rotate by putting a new key first and keeping the old one
for at least ``access_token_ttl`` + skew; a token signed by a key that was removed from the ring
fails with ``PERMISSION_DENIED``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Literal, Protocol, TypeVar

from qim.auth.errors import PERMISSION_DENIED, TOKEN_EXPIRED, AuthError

__all__ = [
    "ACCESS_TOKEN_TYPE",
    "DEFAULT_CLOCK_SKEW_MS",
    "MAX_ID_BYTES",
    "MAX_TOKEN_CHARS",
    "MIN_SECRET_BYTES",
    "ROUTE_TOKEN_TYPE",
    "AccessClaims",
    "Issued",
    "KeyRing",
    "RouteClaims",
    "SigningKey",
    "TokenCodec",
    "check_id",
    "looks_like_jwt",
]

ACCESS_TOKEN_TYPE: Final = "qat1"
ROUTE_TOKEN_TYPE: Final = "qrt1"
TokenType = Literal["qat1", "qrt1"]
_TOKEN_TYPES: Final[tuple[TokenType, ...]] = (ACCESS_TOKEN_TYPE, ROUTE_TOKEN_TYPE)

DEFAULT_CLOCK_SKEW_MS: Final = 30_000
MAX_TOKEN_CHARS: Final = 4096  # refuse before any work: a login path must not be a CPU sink
MAX_ID_BYTES: Final = 256  # tenant/user/device/token ids, UTF-8 bytes
MIN_SECRET_BYTES: Final = 32  # HMAC-SHA256 key strength
_MAX_TIME_MS: Final = (1 << 63) - 1
_SIG_BYTES: Final = 32
_SUBKEY_LABEL: Final = b"qim-auth-v1/"
_KID_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,32}")
_B64URL_RE: Final = re.compile(r"[A-Za-z0-9_-]*")

_INVALID: Final = "invalid_token"


def _deny(reason: str, detail: str = _INVALID) -> AuthError:
    return AuthError(PERMISSION_DENIED, detail=detail, reason=reason)


def check_id(value: object, name: str) -> str:
    """Ids go into Redis keys, hash inputs and frames: non-empty text, no NUL, bounded."""
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string")
    if not value:
        raise ValueError(f"{name} must be non-empty")
    if "\x00" in value:
        raise ValueError(f"{name} must not contain NUL")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:  # lone surrogates
        raise ValueError(f"{name} is not valid Unicode") from exc
    if size > MAX_ID_BYTES:
        raise ValueError(f"{name} must be at most {MAX_ID_BYTES} UTF-8 bytes")
    return value


def _check_time(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_TIME_MS:
        raise ValueError(f"{name} must be an int of Unix milliseconds, got {value!r}")
    return value


def _b64e(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _b64d(text: str) -> bytes | None:
    """Strict, canonical base64url without padding; ``None`` on anything else."""
    if len(text) % 4 == 1 or _B64URL_RE.fullmatch(text) is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    return raw if _b64e(raw) == text else None


def _subkey(secret: bytes, typ: str) -> bytes:
    return hmac.new(secret, _SUBKEY_LABEL + typ.encode("ascii"), hashlib.sha256).digest()


@dataclass(frozen=True, slots=True)
class SigningKey:
    """One HMAC key; ``secret`` never appears in a repr (§20.6: key material is never logged)."""

    kid: str
    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.kid, str) or _KID_RE.fullmatch(self.kid) is None:
            raise ValueError(f"kid must match [A-Za-z0-9_-]{{1,32}}, got {self.kid!r}")
        if not isinstance(self.secret, bytes) or len(self.secret) < MIN_SECRET_BYTES:
            raise ValueError(f"secret of key {self.kid!r} must be >= {MIN_SECRET_BYTES} bytes")

    @classmethod
    def generate(cls, kid: str | None = None) -> SigningKey:
        """A fresh random key (for ``qim token keygen`` and the dev key file)."""
        return cls(kid or f"k{secrets.token_hex(4)}", secrets.token_bytes(MIN_SECRET_BYTES))


class KeyRing:
    """Signing keys by ``kid``: the first signs, all verify. Immutable; rotation returns a new ring.

    Text form (env ``QIM_AUTH_KEYS``): ``"kid1:base64secret,kid2:base64secret"``, first = active;
    standard or URL-safe base64, padding optional.
    """

    __slots__ = ("_keys", "_subkeys")

    def __init__(self, keys: Iterable[SigningKey]) -> None:
        ordered = list(keys)
        if not ordered:
            raise ValueError("a key ring needs at least one key")
        by_kid: dict[str, SigningKey] = {}
        for key in ordered:
            if key.kid in by_kid:
                raise ValueError(f"duplicate kid {key.kid!r} in key ring")
            by_kid[key.kid] = key
        self._keys: tuple[SigningKey, ...] = tuple(ordered)
        self._subkeys: dict[str, dict[str, bytes]] = {
            k.kid: {typ: _subkey(k.secret, typ) for typ in _TOKEN_TYPES} for k in ordered
        }

    @property
    def active(self) -> SigningKey:
        return self._keys[0]

    @property
    def kids(self) -> tuple[str, ...]:
        return tuple(k.kid for k in self._keys)

    def __iter__(self) -> Iterator[SigningKey]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, kid: object) -> bool:
        return kid in self._subkeys

    def __repr__(self) -> str:
        return f"KeyRing(kids={self.kids!r})"

    def subkey(self, kid: str, typ: TokenType) -> bytes | None:
        per_kid = self._subkeys.get(kid)
        return None if per_kid is None else per_kid[typ]

    def rotated(self, new_key: SigningKey) -> KeyRing:
        """``new_key`` becomes active; older keys keep verifying until :meth:`without`."""
        return KeyRing([new_key, *(k for k in self._keys if k.kid != new_key.kid)])

    def without(self, kid: str) -> KeyRing:
        """Drop a retired key: tokens it signed stop verifying. The active key cannot go."""
        if kid == self.active.kid:
            raise ValueError("cannot remove the active key; rotate first")
        if kid not in self:
            raise KeyError(kid)
        return KeyRing(k for k in self._keys if k.kid != kid)

    @classmethod
    def parse(cls, text: str) -> KeyRing:
        """Parse ``"kid1:base64,kid2:base64"``; errors name the kid, never the secret."""
        keys: list[SigningKey] = []
        for n, item in enumerate(text.split(",")):
            item = item.strip()
            if not item:
                continue
            kid, sep, b64 = item.partition(":")
            kid = kid.strip()
            if not sep:
                raise ValueError(f"key entry #{n} has no ':' (expected kid:base64secret)")
            secret = _decode_secret(b64.strip())
            if secret is None:
                raise ValueError(f"secret of key {kid!r} is not valid base64")
            keys.append(SigningKey(kid, secret))
        return cls(keys)

    def format(self) -> str:
        """The inverse of :meth:`parse` (contains secrets: for key files, never for logs)."""
        return ",".join(f"{k.kid}:{base64.b64encode(k.secret).decode('ascii')}" for k in self)


def _decode_secret(text: str) -> bytes | None:
    std = text.replace("-", "+").replace("_", "/").rstrip("=")
    try:
        return base64.b64decode(std + "=" * (-len(std) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class AccessClaims:
    """What an ``access_token`` asserts. ``device_id=None``: usable from any device of the user."""

    tenant_id: str
    user_id: str
    device_id: str | None
    issued_at_ms: int
    expires_at_ms: int
    token_id: str
    kid: str = ""  # filled in from the token on verify; ignored when signing

    def __post_init__(self) -> None:
        check_id(self.tenant_id, "tenant_id")
        check_id(self.user_id, "user_id")
        if self.device_id is not None:
            check_id(self.device_id, "device_id")
        check_id(self.token_id, "token_id")
        _check_time(self.issued_at_ms, "issued_at")
        _check_time(self.expires_at_ms, "expires_at")
        if self.expires_at_ms <= self.issued_at_ms:
            raise ValueError("expires_at must be after issued_at")

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "user_id": self.user_id,
            "device_id": self.device_id,
            "issued_at": self.issued_at_ms,
            "expires_at": self.expires_at_ms,
            "token_id": self.token_id,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], kid: str) -> AccessClaims:
        device = obj.get("device_id")
        return cls(
            tenant_id=obj["tenant_id"],
            user_id=obj["user_id"],
            device_id=device,
            issued_at_ms=obj["issued_at"],
            expires_at_ms=obj["expires_at"],
            token_id=obj["token_id"],
            kid=kid,
        )


@dataclass(frozen=True, slots=True)
class RouteClaims:
    """What a ``route_token`` asserts: this client identity was sent to this ConnectionShard."""

    tenant_id: str
    user_id: str
    device_id: str
    connection_shard: int
    issued_at_ms: int
    expires_at_ms: int
    token_id: str
    kid: str = ""

    def __post_init__(self) -> None:
        check_id(self.tenant_id, "tenant_id")
        check_id(self.user_id, "user_id")
        check_id(self.device_id, "device_id")
        check_id(self.token_id, "token_id")
        shard = self.connection_shard
        if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < 1 << 32:
            raise ValueError("connection_shard must be a u32")
        _check_time(self.issued_at_ms, "issued_at")
        _check_time(self.expires_at_ms, "expires_at")
        if self.expires_at_ms <= self.issued_at_ms:
            raise ValueError("expires_at must be after issued_at")

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "user_id": self.user_id,
            "device_id": self.device_id,
            "connection_shard": self.connection_shard,
            "issued_at": self.issued_at_ms,
            "expires_at": self.expires_at_ms,
            "token_id": self.token_id,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], kid: str) -> RouteClaims:
        return cls(
            tenant_id=obj["tenant_id"],
            user_id=obj["user_id"],
            device_id=obj["device_id"],
            connection_shard=obj["connection_shard"],
            issued_at_ms=obj["issued_at"],
            expires_at_ms=obj["expires_at"],
            token_id=obj["token_id"],
            kid=kid,
        )


ClaimsT = TypeVar("ClaimsT", AccessClaims, RouteClaims)


@dataclass(frozen=True, slots=True)
class Issued(Generic[ClaimsT]):
    """A freshly signed token and its claims (callers need ``expires_at`` and ``token_id``)."""

    token: str = field(repr=False)
    claims: ClaimsT


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} in claims")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate claim {key!r}")
        out[key] = value
    return out


def _new_token_id() -> str:
    return secrets.token_urlsafe(16)


def _expiry(now_ms: int, ttl_ms: int) -> int:
    """The expiry of a token issued at ``now_ms`` for ``ttl_ms``; both checked."""
    _check_time(now_ms, "now_ms")
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or ttl_ms <= 0:
        raise ValueError("ttl_ms must be a positive int")
    return now_ms + ttl_ms


class JwtVerifier(Protocol):
    """Standard JWTs of the configured issuers (``qim.auth.standard_jwt.JwtIssuers``)."""

    def verify(self, token: str, *, now_ms: int, clock_skew_ms: int) -> AccessClaims: ...


def looks_like_jwt(token: object) -> bool:
    """Three parts with a JSON header: never a ``qat1`` / ``qrt1`` token (four parts)."""
    return isinstance(token, str) and token.count(".") == 2 and token.startswith("eyJ")


class TokenCodec:
    """Signs and verifies both token kinds with one :class:`KeyRing` and one clock-skew rule."""

    __slots__ = ("_clock_skew_ms", "_jwt", "_keyring")

    def __init__(
        self,
        keyring: KeyRing,
        *,
        clock_skew_ms: int = DEFAULT_CLOCK_SKEW_MS,
        jwt_issuers: JwtVerifier | None = None,
    ) -> None:
        if isinstance(clock_skew_ms, bool) or not isinstance(clock_skew_ms, int):
            raise ValueError("clock_skew_ms must be an int")
        if clock_skew_ms < 0:
            raise ValueError("clock_skew_ms must be >= 0")
        self._keyring = keyring
        self._clock_skew_ms = clock_skew_ms
        self._jwt = jwt_issuers

    @property
    def keyring(self) -> KeyRing:
        return self._keyring

    @property
    def clock_skew_ms(self) -> int:
        return self._clock_skew_ms

    # -- signing -------------------------------------------------------------------------------

    def _seal(self, typ: TokenType, claims: Mapping[str, Any]) -> str:
        kid = self._keyring.active.kid
        subkey = self._keyring.subkey(kid, typ)
        assert subkey is not None  # the active key is always in the ring
        body = json.dumps(claims, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        signing_input = f"{typ}.{kid}.{_b64e(body.encode('utf-8'))}"
        sig = hmac.new(subkey, signing_input.encode("ascii"), hashlib.sha256).digest()
        token = f"{signing_input}.{_b64e(sig)}"
        if len(token) > MAX_TOKEN_CHARS:
            raise ValueError("claims too large for a token")
        return token

    def issue_access(
        self,
        tenant_id: str,
        user_id: str,
        device_id: str | None,
        *,
        now_ms: int,
        ttl_ms: int,
        token_id: str | None = None,
    ) -> Issued[AccessClaims]:
        """Sign an access token valid for ``ttl_ms`` from ``now_ms``."""
        expires_at_ms = _expiry(now_ms, ttl_ms)
        claims = AccessClaims(
            tenant_id=tenant_id,
            user_id=user_id,
            device_id=device_id,
            issued_at_ms=now_ms,
            expires_at_ms=expires_at_ms,
            token_id=token_id if token_id is not None else _new_token_id(),
            kid=self._keyring.active.kid,
        )
        return Issued(self._seal(ACCESS_TOKEN_TYPE, claims.to_json()), claims)

    def issue_route(
        self,
        tenant_id: str,
        user_id: str,
        device_id: str,
        connection_shard: int,
        *,
        now_ms: int,
        ttl_ms: int,
        token_id: str | None = None,
    ) -> Issued[RouteClaims]:
        """Sign a route token (REDIRECT): single use is enforced by the caller's store."""
        expires_at_ms = _expiry(now_ms, ttl_ms)
        claims = RouteClaims(
            tenant_id=tenant_id,
            user_id=user_id,
            device_id=device_id,
            connection_shard=connection_shard,
            issued_at_ms=now_ms,
            expires_at_ms=expires_at_ms,
            token_id=token_id if token_id is not None else _new_token_id(),
            kid=self._keyring.active.kid,
        )
        return Issued(self._seal(ROUTE_TOKEN_TYPE, claims.to_json()), claims)

    # -- verification --------------------------------------------------------------------------

    def _open(self, token: object, typ: TokenType) -> tuple[str, dict[str, Any]]:
        """Check shape, kid and MAC; return (kid, claims object). Raises PERMISSION_DENIED only."""
        if not isinstance(token, str):
            raise _deny("not_a_string")
        if not token or len(token) > MAX_TOKEN_CHARS or not token.isascii():
            raise _deny("bad_shape")
        parts = token.split(".")
        if len(parts) != 4:
            raise _deny("bad_shape")
        got_typ, kid, payload, sig_text = parts
        if got_typ != typ:
            raise _deny("wrong_token_type")
        if _KID_RE.fullmatch(kid) is None:
            raise _deny("bad_kid")
        subkey = self._keyring.subkey(kid, typ)
        if subkey is None:
            raise _deny("unknown_kid")
        sig = _b64d(sig_text)
        if sig is None or len(sig) != _SIG_BYTES:
            raise _deny("bad_signature_encoding")
        expected = hmac.new(
            subkey, f"{typ}.{kid}.{payload}".encode("ascii"), hashlib.sha256
        ).digest()
        if not hmac.compare_digest(expected, sig):
            raise _deny("bad_signature")
        # Only our own signed payloads get this far; still parse defensively (old issuers, bugs).
        raw = _b64d(payload)
        if raw is None:
            raise _deny("bad_payload_encoding")
        try:
            obj = json.loads(
                raw.decode("utf-8"),
                object_pairs_hook=_no_duplicates,
                parse_constant=_reject_constant,
            )
        except (ValueError, RecursionError) as exc:  # JSONDecodeError/UnicodeDecodeError are both
            raise _deny("bad_payload_json") from exc
        if not isinstance(obj, dict):
            raise _deny("bad_claims")
        return kid, obj

    def _check_times(self, issued_at_ms: int, expires_at_ms: int, now_ms: int) -> bool:
        """Raise if not yet valid; return True if expired (the caller picks the code)."""
        if issued_at_ms > now_ms + self._clock_skew_ms:
            raise _deny("not_yet_valid")
        return now_ms >= expires_at_ms + self._clock_skew_ms

    def verify_access(self, token: object, *, now_ms: int) -> AccessClaims:
        """Return the claims of a genuine, unexpired access token, else raise :class:`AuthError`.

        Revocation is not checked here (it needs the store): see ``AuthService.authenticate``.
        """
        _check_time(now_ms, "now_ms")
        if self._jwt is not None and isinstance(token, str) and looks_like_jwt(token):
            return self._jwt.verify(token, now_ms=now_ms, clock_skew_ms=self._clock_skew_ms)
        kid, obj = self._open(token, ACCESS_TOKEN_TYPE)
        try:
            claims = AccessClaims.from_json(obj, kid)
        except (KeyError, TypeError, ValueError) as exc:
            raise _deny("bad_claims") from exc
        if self._check_times(claims.issued_at_ms, claims.expires_at_ms, now_ms):
            raise AuthError(TOKEN_EXPIRED, detail="access_token_expired")
        return claims

    def verify_route(self, token: object, *, now_ms: int) -> RouteClaims:
        """Return the claims of a genuine, unexpired route token (single use is not checked here).

        An expired route token is ``PERMISSION_DENIED``: A.6 ``TOKEN_EXPIRED`` means "refresh the
        access token", which would be the wrong client action (§20.2.1: void after 60 s).
        """
        _check_time(now_ms, "now_ms")
        kid, obj = self._open(token, ROUTE_TOKEN_TYPE)
        try:
            claims = RouteClaims.from_json(obj, kid)
        except (KeyError, TypeError, ValueError) as exc:
            raise _deny("bad_claims", "invalid_route_token") from exc
        if self._check_times(claims.issued_at_ms, claims.expires_at_ms, now_ms):
            raise _deny("route_token_expired", "invalid_route_token")
        return claims
