"""Standard JWTs minted by a tenant's own backend (issue 21; ``qim.auth.standard_jwt``).

Tokens are made with PyJWT exactly as a customer's backend would (README example), and keys
with ``cryptography``. The refusals are the classic JWT attacks: ``alg=none``, the HS/RS
confusion, a foreign issuer or audience, an unknown ``kid``, another tenant in a claim.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from qim.auth.config import AuthConfig
from qim.auth.errors import PERMISSION_DENIED, TOKEN_EXPIRED, AuthError
from qim.auth.standard_jwt import JwtIssuers
from qim.auth.tokens import AccessClaims, KeyRing, SigningKey, TokenCodec

NOW_S = 1_780_000_000
NOW_MS = NOW_S * 1000
SECRET = b"s" * 40
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
RING = KeyRing([SigningKey("u1", b"\x22" * 32)])


def _jwk(private: Any, kid: str, alg: str) -> dict[str, Any]:
    algo = jwt.get_algorithm_by_name(alg)
    jwk: dict[str, Any] = json.loads(algo.to_jwk(private.public_key()))
    return {**jwk, "kid": kid, "alg": alg, "use": "sig"}


def _claims(**over: Any) -> dict[str, Any]:
    base = {
        "iss": "https://id.acme.example",
        "aud": "qim",
        "sub": "alice",
        "device_id": "phone",
        "iat": NOW_S - 10,
        "exp": NOW_S + 600,
        "jti": "tok-1",
    }
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


@pytest.fixture
def issuers(tmp_path: Path) -> JwtIssuers:
    (tmp_path / "acme.secret").write_bytes(SECRET)
    (tmp_path / "globex.jwks").write_text(
        json.dumps({"keys": [_jwk(RSA_KEY, "rsa-1", "RS256"), _jwk(EC_KEY, "ec-1", "ES256")]})
    )
    doc = {
        "issuers": [
            {
                "tenant_id": "acme",
                "issuer": "https://id.acme.example",
                "audience": "qim",
                "hs256_secret_file": "acme.secret",
            },
            {
                "tenant_id": "globex",
                "issuer": "https://login.globex.example",
                "audience": "chat",
                "jwks_file": "globex.jwks",
                "user_claim": "uid",
            },
        ]
    }
    path = tmp_path / "issuers.json"
    path.write_text(json.dumps(doc))
    return JwtIssuers.load(path)


def _verify(issuers: JwtIssuers, token: str, now_ms: int = NOW_MS) -> AccessClaims:
    codec = TokenCodec(RING, clock_skew_ms=30_000, jwt_issuers=issuers)
    return codec.verify_access(token, now_ms=now_ms)


def _refused(issuers: JwtIssuers, token: str, code: str = PERMISSION_DENIED) -> AuthError:
    with pytest.raises(AuthError) as caught:
        _verify(issuers, token)
    assert caught.value.code == code, caught.value
    return caught.value


def test_an_hs256_token_of_the_tenants_backend_logs_in_as_its_claims(issuers: JwtIssuers) -> None:
    token = jwt.encode(_claims(), SECRET, algorithm="HS256")
    claims = _verify(issuers, token)
    assert (claims.tenant_id, claims.user_id, claims.device_id) == ("acme", "alice", "phone")
    assert (claims.issued_at_ms, claims.expires_at_ms) == (
        (NOW_S - 10) * 1000,
        (NOW_S + 600) * 1000,
    )
    assert claims.token_id == "tok-1"


def test_rs256_and_es256_tokens_verify_by_kid_with_the_mapped_user_claim(
    issuers: JwtIssuers,
) -> None:
    globex = {"iss": "https://login.globex.example", "aud": "chat", "sub": None, "uid": "bob"}
    rs = jwt.encode(_claims(**globex), RSA_KEY, algorithm="RS256", headers={"kid": "rsa-1"})
    es = jwt.encode(_claims(**globex, jti=None), EC_KEY, algorithm="ES256", headers={"kid": "ec-1"})
    assert _verify(issuers, rs).user_id == "bob" and _verify(issuers, rs).tenant_id == "globex"
    by_es = _verify(issuers, es)
    assert by_es.user_id == "bob" and by_es.token_id.startswith("jwt-")  # no jti: a digest
    assert _verify(issuers, es).token_id == by_es.token_id  # deterministic


def test_the_tenant_comes_from_the_issuer_never_from_a_claim(issuers: JwtIssuers) -> None:
    token = jwt.encode(_claims(tenant_id="globex"), SECRET, algorithm="HS256")
    assert _verify(issuers, token).tenant_id == "acme"


def test_alg_none_is_refused(issuers: JwtIssuers) -> None:
    token = jwt.encode(_claims(), "", algorithm="none")
    _refused(issuers, token)


def test_the_hs_rs_confusion_is_refused(issuers: JwtIssuers) -> None:
    """An HS256 token whose 'secret' is the issuer's public key must not verify."""
    pem = RSA_KEY.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    header = {"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}
    globex = _claims(iss="https://login.globex.example", aud="chat", uid="bob")

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(globex).encode())}"
    sig = hmac.new(pem, signing_input.encode(), hashlib.sha256).digest()
    error = _refused(issuers, f"{signing_input}.{b64(sig)}")
    assert error.reason == "jwt_algorithm_not_allowed"


def test_a_wrong_audience_an_unknown_issuer_and_a_bad_signature_are_refused(
    issuers: JwtIssuers,
) -> None:
    _refused(issuers, jwt.encode(_claims(aud="other"), SECRET, algorithm="HS256"))
    _refused(issuers, jwt.encode(_claims(iss="https://evil.example"), SECRET, algorithm="HS256"))
    _refused(issuers, jwt.encode(_claims(), b"x" * 40, algorithm="HS256"))
    globex = _claims(iss="https://login.globex.example", aud="chat", uid="bob")
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _refused(issuers, jwt.encode(globex, other, algorithm="RS256", headers={"kid": "rsa-1"}))
    unknown = jwt.encode(globex, RSA_KEY, algorithm="RS256", headers={"kid": "rsa-9"})
    assert _refused(issuers, unknown).reason == "jwt_unknown_kid"
    # an ES256 token naming the RSA key's kid: the algorithm is the key's
    wrong = jwt.encode(globex, EC_KEY, algorithm="ES256", headers={"kid": "rsa-1"})
    assert _refused(issuers, wrong).reason == "jwt_algorithm_not_the_keys"


def test_missing_claims_are_refused(issuers: JwtIssuers) -> None:
    for missing in ("exp", "iat", "sub", "aud", "iss"):
        _refused(issuers, jwt.encode(_claims(**{missing: None}), SECRET, algorithm="HS256"))


def test_expiry_is_judged_on_now_ms_and_only_a_genuine_token_is_token_expired(
    issuers: JwtIssuers,
) -> None:
    expired = jwt.encode(_claims(iat=NOW_S - 120, exp=NOW_S - 60), SECRET, algorithm="HS256")
    _refused(issuers, expired, TOKEN_EXPIRED)
    assert _verify(issuers, expired, now_ms=(NOW_S - 61) * 1000).user_id == "alice"
    forged = jwt.encode(_claims(exp=NOW_S - 60), b"y" * 40, algorithm="HS256")
    _refused(issuers, forged, PERMISSION_DENIED)  # no expiry oracle for a forgery
    future = jwt.encode(_claims(iat=NOW_S + 3600, exp=NOW_S + 7200), SECRET, algorithm="HS256")
    _refused(issuers, future)


def test_qat1_tokens_still_verify_next_to_jwts(issuers: JwtIssuers) -> None:
    codec = TokenCodec(RING, clock_skew_ms=30_000, jwt_issuers=issuers)
    issued = codec.issue_access("acme", "carol", "laptop", now_ms=NOW_MS, ttl_ms=60_000)
    assert codec.verify_access(issued.token, now_ms=NOW_MS).user_id == "carol"


def test_without_issuers_a_jwt_is_just_an_invalid_token() -> None:
    token = jwt.encode(_claims(), SECRET, algorithm="HS256")
    with pytest.raises(AuthError) as caught:
        TokenCodec(RING).verify_access(token, now_ms=NOW_MS)
    assert caught.value.code == PERMISSION_DENIED


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"issuer": "i", "audience": "a", "hs256_secret_file": "s"}, "tenant_id"),
        ({"tenant_id": "t", "issuer": "i", "audience": "a"}, "hs256_secret, jwks or jwks_url"),
        ({"tenant_id": "t", "issuer": "i", "audience": "a", "colour": 1}, "unknown issuer"),
        ({"tenant_id": "t", "issuer": "i", "audience": "a", "hs256_secret_file": "short"}, ">= 32"),
    ],
)
def test_a_bad_issuer_document_is_refused_at_start(
    tmp_path: Path, entry: dict[str, Any], message: str
) -> None:
    (tmp_path / "s").write_bytes(SECRET)
    (tmp_path / "short").write_bytes(b"tiny")
    path = tmp_path / "issuers.json"
    path.write_text(json.dumps({"issuers": [entry]}))
    with pytest.raises(ValueError, match=message):
        JwtIssuers.load(path)


def test_qim_jwt_issuers_file_reaches_the_auth_config(tmp_path: Path) -> None:
    config = AuthConfig.from_env({"QIM_JWT_ISSUERS_FILE": str(tmp_path / "i.json")})
    assert config.jwt_issuers_file == tmp_path / "i.json"
    assert AuthConfig.from_env({}).jwt_issuers_file is None


@pytest.fixture
def jwks_server() -> Iterator[tuple[str, dict[str, Any]]]:
    """A JWKS endpoint on loopback whose key set the test rotates."""
    served: dict[str, Any] = {"keys": [_jwk(RSA_KEY, "rsa-1", "RS256")], "hits": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served["hits"] += 1
            body = json.dumps({"keys": served["keys"]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/jwks.json", served
    finally:
        server.shutdown()
        server.server_close()


def test_a_jwks_url_is_fetched_off_the_verify_path_and_refetched_for_a_new_kid(
    tmp_path: Path, jwks_server: tuple[str, dict[str, Any]]
) -> None:
    url, served = jwks_server
    path = tmp_path / "issuers.json"
    entry = {"tenant_id": "initech", "issuer": "https://sso.initech", "audience": "qim"}
    fast = {"jwks_url": url, "jwks_refetch_cooldown_s": 0}
    path.write_text(json.dumps({"issuers": [{**entry, **fast}]}))
    issuers = JwtIssuers.load(path)
    claims = _claims(iss="https://sso.initech")
    token = jwt.encode(claims, RSA_KEY, algorithm="RS256", headers={"kid": "rsa-1"})
    assert _refused(issuers, token).reason == "jwt_unknown_kid"  # verify does no network I/O
    issuers.prefetch(token)
    assert _verify(issuers, token).tenant_id == "initech" and served["hits"] == 1
    issuers.prefetch(token)  # cached: no second fetch
    assert served["hits"] == 1
    # rotation: the issuer publishes a new key; a token with its kid triggers one refetch
    new_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    served["keys"] = [_jwk(new_key, "rsa-2", "RS256")]
    rotated = jwt.encode(claims, new_key, algorithm="RS256", headers={"kid": "rsa-2"})
    issuers.prefetch(rotated)
    assert _verify(issuers, rotated).user_id == "alice" and served["hits"] == 2
