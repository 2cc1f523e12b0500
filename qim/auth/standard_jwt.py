"""Access tokens a customer's own backend mints: standard JWTs (RFC 7519), verified with PyJWT.

Our own ``qat1`` tokens (``qim.auth.tokens``) can only be made by ``qim token issue`` or the admin
API. A team that already runs an identity service signs a JWT instead, with a secret or a key
pair it configures here per tenant (issue 21). The tenant comes from the configuration entry
whose ``issuer`` the token names, never from a claim, so one tenant's backend cannot mint for
another.

Rules (each refusal is ``PERMISSION_DENIED``; only a genuine, expired token is ``TOKEN_EXPIRED``,
as for ``qat1``, so a forgery learns nothing):

* the algorithm comes from the key, never from the token: HS256 only for an issuer with a shared
  secret, RS256 / ES256 only for its JWKS keys, by ``kid``; ``alg=none`` and an HS256 token
  "signed" with a public key (the HS/RS confusion) never verify;
* ``iss`` and ``aud`` must be the configured ones; ``exp``, ``iat`` and ``sub`` are required;
* times are checked against ``now_ms`` with the codec's clock skew (PyJWT's own clock is not
  used), so every gateway gives the same answer for the same inputs;
* claims map to tenant (configuration), user (``user_claim``, default ``sub``), device
  (``device_claim``, default ``device_id``; absent = any device of the user) and token id
  (``jti``, else a digest of the token, so revocation by token id works for both kinds).

JWKS: inline in the configuration, from a file, or from a URL fetched through PyJWT's
``PyJWKClient`` (cached; an unknown ``kid`` refetches, which is how rotation works). A URL fetch
is blocking I/O: :meth:`JwtIssuers.prefetch` runs it, and the AuthService calls it in a thread.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import jwt

from qim.auth.errors import PERMISSION_DENIED, TOKEN_EXPIRED, AuthError
from qim.auth.tokens import AccessClaims, looks_like_jwt

__all__ = ["JWT_ISSUERS_ENV", "JwtIssuer", "JwtIssuers", "looks_like_jwt"]

JWT_ISSUERS_ENV: Final = "QIM_JWT_ISSUERS_FILE"
_ASYMMETRIC: Final = ("RS256", "ES256")
_MIN_SECRET_BYTES: Final = 32
_MAX_JWT_CHARS: Final = 8192


def _deny(reason: str) -> AuthError:
    return AuthError(PERMISSION_DENIED, detail="invalid_token", reason=f"jwt_{reason}")


@dataclass(frozen=True)
class JwtIssuer:
    """One tenant's identity service: who signs, for which audience, with which keys."""

    tenant_id: str
    issuer: str
    audience: str
    hs256_secret: bytes | None = None
    jwks: Mapping[str, jwt.PyJWK] = field(default_factory=dict)
    jwks_url: str | None = None
    user_claim: str = "sub"
    device_claim: str = "device_id"
    jwks_refetch_cooldown_s: float = 30.0
    """At most one refetch per cooldown for unknown kids (a flood of made-up kids costs one)."""
    _client: jwt.PyJWKClient | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not (self.tenant_id and self.issuer and self.audience):
            raise ValueError("a JWT issuer needs tenant_id, issuer and audience")
        if self.hs256_secret is not None and len(self.hs256_secret) < _MIN_SECRET_BYTES:
            raise ValueError(f"{self.issuer}: hs256 secret must be >= {_MIN_SECRET_BYTES} bytes")
        if self.hs256_secret is None and not self.jwks and self.jwks_url is None:
            raise ValueError(f"{self.issuer}: configure hs256_secret, jwks or jwks_url")
        for kid, key in self.jwks.items():
            if key.algorithm_name not in _ASYMMETRIC:
                raise ValueError(f"{self.issuer}: JWKS key {kid!r} is not RS256 / ES256")
        if self.jwks_url is not None and self._client is None:
            client = jwt.PyJWKClient(
                self.jwks_url,
                lifespan=300,
                timeout=5,
                cooldown_duration=self.jwks_refetch_cooldown_s,
            )
            object.__setattr__(self, "_client", client)

    def key_for(self, header: Mapping[str, Any], *, fetch: bool = False) -> tuple[Any, str]:
        """(verification key, the one algorithm it verifies), or PERMISSION_DENIED."""
        alg = header.get("alg")
        if alg == "HS256" and self.hs256_secret is not None:
            return self.hs256_secret, "HS256"
        if alg not in _ASYMMETRIC:
            raise _deny("algorithm_not_allowed")
        kid = header.get("kid")
        if not isinstance(kid, str):
            raise _deny("no_kid")
        key = self.jwks.get(kid)
        if key is None and self._client is not None:
            try:
                key = self._client.get_signing_key(kid) if fetch else _cached(self._client, kid)
            except jwt.PyJWKClientError as exc:
                raise _deny("unknown_kid") from exc
        if key is None:
            raise _deny("unknown_kid")
        if key.algorithm_name != alg:
            raise _deny("algorithm_not_the_keys")
        return key.key, alg


def _cached(client: jwt.PyJWKClient, kid: str) -> jwt.PyJWK | None:
    """The key from the client's cache only: no network I/O on the event loop."""
    cached = client.jwk_set_cache.get() if client.jwk_set_cache is not None else None
    if cached is None:
        return None
    for key in cached.keys:
        if key.key_id == kid:
            return key
    return None


class JwtIssuers:
    """Every configured issuer, by ``iss``."""

    def __init__(self, issuers: list[JwtIssuer]) -> None:
        self._by_iss: dict[str, JwtIssuer] = {}
        for issuer in issuers:
            if issuer.issuer in self._by_iss:
                raise ValueError(f"issuer {issuer.issuer!r} is configured twice")
            self._by_iss[issuer.issuer] = issuer

    def __len__(self) -> int:
        return len(self._by_iss)

    @classmethod
    def load(cls, path: Path) -> JwtIssuers:
        """The ``QIM_JWT_ISSUERS_FILE`` document: ``{"issuers": [{...}, ...]}``.

        Per issuer: ``tenant_id``, ``issuer``, ``audience``, and keys: ``hs256_secret_file``
        (the secret's bytes, >= 32), ``jwks`` (an inline JWK Set), ``jwks_file`` or
        ``jwks_url`` (optional ``jwks_refetch_cooldown_s``); optional ``user_claim`` and
        ``device_claim``. Relative paths are read
        from the document's folder.
        """
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or not isinstance(doc.get("issuers"), list):
            raise ValueError(f'{path}: expected {{"issuers": [...]}}')
        return cls([_issuer(entry, path.parent) for entry in doc["issuers"]])

    def _issuer_of(self, token: str) -> JwtIssuer:
        try:
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError as exc:
            raise _deny("malformed") from exc
        iss = unverified.get("iss") if isinstance(unverified, dict) else None
        issuer = self._by_iss.get(iss) if isinstance(iss, str) else None
        if issuer is None:
            raise _deny("unknown_issuer")
        return issuer

    def prefetch(self, token: str) -> None:
        """Blocking: fetch the JWKS of the token's issuer if its ``kid`` is not cached yet."""
        if not looks_like_jwt(token) or len(token) > _MAX_JWT_CHARS:
            return
        try:
            issuer = self._issuer_of(token)
            issuer.key_for(jwt.get_unverified_header(token), fetch=True)
        except (AuthError, jwt.PyJWTError):
            return  # verify() gives the answer

    def verify(self, token: str, *, now_ms: int, clock_skew_ms: int) -> AccessClaims:
        """The claims of a genuine, unexpired JWT of a configured issuer, else AuthError."""
        if len(token) > _MAX_JWT_CHARS or not token.isascii():
            raise _deny("bad_shape")
        issuer = self._issuer_of(token)
        try:
            key, alg = issuer.key_for(jwt.get_unverified_header(token))
            claims = jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=issuer.audience,
                issuer=issuer.issuer,
                options={
                    "require": ["exp", "iat", "iss", "aud", issuer.user_claim],
                    "verify_exp": False,  # checked below against now_ms, not PyJWT's clock
                    "verify_iat": False,
                    "verify_nbf": False,
                },
            )
        except AuthError:
            raise
        except jwt.PyJWTError as exc:
            raise _deny(type(exc).__name__) from exc
        return _claims(issuer, token, claims, now_ms=now_ms, clock_skew_ms=clock_skew_ms)


def _claims(
    issuer: JwtIssuer, token: str, claims: Mapping[str, Any], *, now_ms: int, clock_skew_ms: int
) -> AccessClaims:
    exp, iat = claims.get("exp"), claims.get("iat")
    if not all(isinstance(t, int | float) and not isinstance(t, bool) for t in (exp, iat)):
        raise _deny("bad_times")
    assert isinstance(exp, int | float) and isinstance(iat, int | float)
    issued_ms, expires_ms = int(iat * 1000), int(exp * 1000)
    nbf = claims.get("nbf")
    not_before_ms = int(nbf * 1000) if isinstance(nbf, int | float) else issued_ms
    if max(issued_ms, not_before_ms) > now_ms + clock_skew_ms:
        raise _deny("not_yet_valid")
    if now_ms >= expires_ms + clock_skew_ms:
        raise AuthError(TOKEN_EXPIRED, detail="access_token_expired")
    user, device = claims.get(issuer.user_claim), claims.get(issuer.device_claim)
    if not isinstance(user, str) or not (device is None or isinstance(device, str)):
        raise _deny("bad_claims")
    jti = claims.get("jti")
    token_id = (
        jti
        if isinstance(jti, str) and jti
        else "jwt-" + hashlib.sha256(token.encode()).hexdigest()[:32]
    )
    try:
        return AccessClaims(
            tenant_id=issuer.tenant_id,
            user_id=user,
            device_id=device,
            issued_at_ms=issued_ms,
            expires_at_ms=expires_ms,
            token_id=token_id,
            kid=f"jwt:{issuer.issuer}",
        )
    except (TypeError, ValueError) as exc:
        raise _deny("bad_claims") from exc


def _issuer(entry: object, base: Path) -> JwtIssuer:
    if not isinstance(entry, dict):
        raise ValueError("each issuer is a JSON object")
    known = {
        "tenant_id", "issuer", "audience", "hs256_secret_file", "jwks", "jwks_file", "jwks_url",
        "user_claim", "device_claim", "jwks_refetch_cooldown_s",
    }  # fmt: skip
    unknown = set(entry) - known
    if unknown:
        raise ValueError(f"unknown issuer fields: {sorted(unknown)}")
    secret = None
    if "hs256_secret_file" in entry:
        secret = (base / entry["hs256_secret_file"]).read_bytes().strip()
    jwks_doc = entry.get("jwks")
    if "jwks_file" in entry:
        jwks_doc = json.loads((base / entry["jwks_file"]).read_text())
    jwks: dict[str, jwt.PyJWK] = {}
    if jwks_doc is not None:
        for key in jwt.PyJWKSet.from_dict(jwks_doc).keys:
            if not key.key_id:
                raise ValueError(f"{entry.get('issuer')}: every JWKS key needs a kid")
            jwks[key.key_id] = key
    return JwtIssuer(
        tenant_id=str(entry.get("tenant_id", "")),
        issuer=str(entry.get("issuer", "")),
        audience=str(entry.get("audience", "")),
        hs256_secret=secret,
        jwks=jwks,
        jwks_url=entry.get("jwks_url"),
        user_claim=str(entry.get("user_claim", "sub")),
        device_claim=str(entry.get("device_claim", "device_id")),
        jwks_refetch_cooldown_s=float(entry.get("jwks_refetch_cooldown_s", 30.0)),
    )
