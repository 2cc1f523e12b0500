"""Pure auth pieces: token codec, key rotation, versions, key layout, config, CLI (spec §20.2)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import stat
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import example, given, settings
from hypothesis import strategies as st

from qim.auth import keys
from qim.auth.cli import token as token_cli
from qim.auth.config import AuthConfig, load_keyring
from qim.auth.errors import (
    AUTH_ERROR_CODES,
    PERMISSION_DENIED,
    TOKEN_EXPIRED,
    AuthError,
)
from qim.auth.tokens import (
    ACCESS_TOKEN_TYPE,
    MAX_TOKEN_CHARS,
    ROUTE_TOKEN_TYPE,
    AccessClaims,
    KeyRing,
    SigningKey,
    TokenCodec,
)
from qim.auth.versions import client_version_at_least, parse_client_version

NOW = 1_750_000_000_000  # a fixed Unix ms: the codec never reads the clock
HOUR = 3_600_000

# App. A.6 codes, copied from the spec so a typo in qim.auth cannot validate itself.
A6_CODES = {
    "CURSOR_EXPIRED",
    "CURSOR_REBASED",
    "CURSOR_INVALID",
    "MAILBOX_DIRTY",
    "SYNC_INCOMPLETE",
    "SHARD_MOVED",
    "REGION_FAILOVER",
    "RATE_LIMITED",
    "FANOUT_QUOTA_EXCEEDED",
    "TOKEN_EXPIRED",
    "TOKEN_REVOKED",
    "UPGRADE_REQUIRED",
    "CLOCK_UNSAFE",
    "PAYLOAD_TOO_LARGE",
    "PERMISSION_DENIED",
    "PREKEY_EXHAUSTED",
}


def key(kid: str, fill: int) -> SigningKey:
    return SigningKey(kid, bytes([fill]) * 32)


RING = KeyRing([key("k1", 1)])
CODEC = TokenCodec(RING, clock_skew_ms=0)


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def sign_raw(secret: bytes, typ: str, kid: str, payload: bytes) -> str:
    """The wire format written out independently of the codec (module docstring of tokens)."""
    subkey = hmac.new(secret, b"qim-auth-v1/" + typ.encode(), hashlib.sha256).digest()
    signing_input = f"{typ}.{kid}.{b64(payload)}"
    sig = hmac.new(subkey, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(sig)}"


def denied(codec: TokenCodec, token: object, now_ms: int = NOW) -> AuthError:
    with pytest.raises(AuthError) as info:
        codec.verify_access(token, now_ms=now_ms)
    assert info.value.code == PERMISSION_DENIED
    return info.value


# -- round trip -----------------------------------------------------------------------------------


def test_access_token_round_trip_bound_to_a_device() -> None:
    issued = CODEC.issue_access("t1", "u42", "phone", now_ms=NOW, ttl_ms=HOUR)
    claims = CODEC.verify_access(issued.token, now_ms=NOW)
    assert claims == issued.claims
    assert (claims.tenant_id, claims.user_id, claims.device_id) == ("t1", "u42", "phone")
    assert (claims.issued_at_ms, claims.expires_at_ms, claims.kid) == (NOW, NOW + HOUR, "k1")
    assert issued.token.startswith(f"{ACCESS_TOKEN_TYPE}.k1.")
    assert issued.token.isascii() and len(issued.token) < 400


def test_unbound_access_token_and_unicode_ids_round_trip() -> None:
    issued = CODEC.issue_access("租户:1", "用户.二", None, now_ms=NOW, ttl_ms=1)
    claims = CODEC.verify_access(issued.token, now_ms=NOW)
    assert claims.device_id is None
    assert (claims.tenant_id, claims.user_id) == ("租户:1", "用户.二")


def test_token_ids_are_unique_and_can_be_fixed() -> None:
    ids = {
        CODEC.issue_access("t", "u", None, now_ms=NOW, ttl_ms=1).claims.token_id for _ in range(50)
    }
    assert len(ids) == 50
    fixed = CODEC.issue_access("t", "u", None, now_ms=NOW, ttl_ms=1, token_id="jti-1")
    assert CODEC.verify_access(fixed.token, now_ms=NOW).token_id == "jti-1"


def test_the_wire_format_is_the_documented_one() -> None:
    claims = {
        "device_id": None,
        "expires_at": NOW + 5,
        "issued_at": NOW,
        "tenant_id": "t",
        "token_id": "j",
        "user_id": "u",
    }
    payload = json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()
    expected = sign_raw(bytes([1]) * 32, ACCESS_TOKEN_TYPE, "k1", payload)
    issued = CODEC.issue_access("t", "u", None, now_ms=NOW, ttl_ms=5, token_id="j")
    assert issued.token == expected


def test_route_token_round_trip() -> None:
    issued = CODEC.issue_route("t1", "u42", "phone", 498, now_ms=NOW, ttl_ms=60_000)
    claims = CODEC.verify_route(issued.token, now_ms=NOW + 59_999)
    assert claims == issued.claims
    assert claims.connection_shard == 498
    assert issued.token.startswith(f"{ROUTE_TOKEN_TYPE}.k1.")


def test_issue_rejects_bad_input() -> None:
    for bad_ids in (("", "u", None), ("t", "", None), ("t", "u", ""), ("t\x00", "u", None)):
        with pytest.raises(ValueError):
            CODEC.issue_access(*bad_ids, now_ms=NOW, ttl_ms=1)
    with pytest.raises(ValueError):
        CODEC.issue_access("t" * 257, "u", None, now_ms=NOW, ttl_ms=1)
    for ttl in (0, -1):
        with pytest.raises(ValueError):
            CODEC.issue_access("t", "u", None, now_ms=NOW, ttl_ms=ttl)
    with pytest.raises(ValueError):
        CODEC.issue_route("t", "u", "d", 1 << 32, now_ms=NOW, ttl_ms=1)
    with pytest.raises(ValueError):
        TokenCodec(RING, clock_skew_ms=-1)


# -- time -----------------------------------------------------------------------------------------


def test_expiry_is_exact_to_the_millisecond_without_skew() -> None:
    token = CODEC.issue_access("t", "u", None, now_ms=NOW, ttl_ms=HOUR).token
    assert CODEC.verify_access(token, now_ms=NOW + HOUR - 1).token_id
    with pytest.raises(AuthError) as info:
        CODEC.verify_access(token, now_ms=NOW + HOUR)
    assert info.value.code == TOKEN_EXPIRED
    assert info.value.error_fields() == {"code": "TOKEN_EXPIRED", "detail": "access_token_expired"}


def test_clock_skew_extends_expiry_and_tolerates_an_issuer_ahead() -> None:
    skewed = TokenCodec(RING, clock_skew_ms=5_000)
    token = skewed.issue_access("t", "u", None, now_ms=NOW, ttl_ms=HOUR).token
    assert skewed.verify_access(token, now_ms=NOW + HOUR + 4_999)
    with pytest.raises(AuthError) as info:
        skewed.verify_access(token, now_ms=NOW + HOUR + 5_000)
    assert info.value.code == TOKEN_EXPIRED
    # Verifier's clock behind the issuer's: fine within the skew, not beyond it.
    assert skewed.verify_access(token, now_ms=NOW - 5_000)
    assert denied(skewed, token, now_ms=NOW - 5_001).reason == "not_yet_valid"


def test_an_expired_forgery_is_permission_denied_not_token_expired() -> None:
    token = CODEC.issue_access("t", "u", None, now_ms=NOW, ttl_ms=1).token
    forged = token[:-2] + ("AA" if token[-2:] != "AA" else "BA")
    assert denied(CODEC, forged, now_ms=NOW + HOUR).reason in {
        "bad_signature",
        "bad_signature_encoding",
    }


def test_route_token_expiry_is_permission_denied() -> None:
    token = CODEC.issue_route("t", "u", "d", 1, now_ms=NOW, ttl_ms=60_000).token
    with pytest.raises(AuthError) as info:
        CODEC.verify_route(token, now_ms=NOW + 60_000)
    assert info.value.code == PERMISSION_DENIED
    assert info.value.reason == "route_token_expired"


# -- forgery and tampering ------------------------------------------------------------------------


def test_every_single_character_change_of_the_signature_is_rejected() -> None:
    token = CODEC.issue_access("t", "u", "d", now_ms=NOW, ttl_ms=HOUR).token
    head, sig = token.rsplit(".", 1)
    for i, ch in enumerate(sig):
        other = "A" if ch != "A" else "B"
        denied(CODEC, f"{head}.{sig[:i]}{other}{sig[i + 1 :]}")


def test_tampered_claims_are_rejected() -> None:
    token = CODEC.issue_access("t", "alice", "d", now_ms=NOW, ttl_ms=HOUR).token
    typ, kid, payload, sig = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    for field, value in (
        ("user_id", "mallory"),
        ("expires_at", NOW + 10 * HOUR),
        ("device_id", None),
    ):
        changed = b64(json.dumps({**claims, field: value}).encode())
        assert denied(CODEC, f"{typ}.{kid}.{changed}.{sig}").reason == "bad_signature"


def test_a_token_signed_with_another_secret_under_a_known_kid_is_rejected() -> None:
    other = TokenCodec(KeyRing([key("k1", 9)]))
    token = other.issue_access("t", "u", None, now_ms=NOW, ttl_ms=HOUR).token
    assert denied(CODEC, token).reason == "bad_signature"


def test_unknown_kid_and_kid_swap_are_rejected() -> None:
    foreign = TokenCodec(KeyRing([key("k9", 1)]))  # same secret, kid not in our ring
    token = foreign.issue_access("t", "u", None, now_ms=NOW, ttl_ms=HOUR).token
    assert denied(CODEC, token).reason == "unknown_kid"
    both = TokenCodec(KeyRing([key("k1", 1), key("k2", 2)]))
    mine = both.issue_access("t", "u", None, now_ms=NOW, ttl_ms=HOUR).token
    assert denied(both, mine.replace(".k1.", ".k2.", 1)).reason == "bad_signature"


def test_route_and_access_tokens_are_not_interchangeable() -> None:
    route = CODEC.issue_route("t", "u", "d", 1, now_ms=NOW, ttl_ms=60_000).token
    access = CODEC.issue_access("t", "u", "d", now_ms=NOW, ttl_ms=HOUR).token
    assert denied(CODEC, route).reason == "wrong_token_type"
    relabelled = ACCESS_TOKEN_TYPE + route[len(ROUTE_TOKEN_TYPE) :]
    assert denied(CODEC, relabelled).reason == "bad_signature"
    with pytest.raises(AuthError) as info:
        CODEC.verify_route(access, now_ms=NOW)
    assert info.value.code == PERMISSION_DENIED


@pytest.mark.parametrize(
    "payload",
    [
        b"[]",
        b'"x"',
        b"not json",
        b"\xff\xfe",
        b'{"tenant_id":"t"}',
        b'{"tenant_id":"t","tenant_id":"t","user_id":"u","device_id":null,'
        b'"issued_at":1,"expires_at":2,"token_id":"j"}',
        b'{"tenant_id":"t","user_id":"u","device_id":null,"issued_at":NaN,'
        b'"expires_at":2,"token_id":"j"}',
        b'{"tenant_id":"t","user_id":"u","device_id":null,"issued_at":true,'
        b'"expires_at":2,"token_id":"j"}',
        b'{"tenant_id":"t","user_id":"u","device_id":null,"issued_at":1.5,'
        b'"expires_at":2,"token_id":"j"}',
        b'{"tenant_id":"","user_id":"u","device_id":null,"issued_at":1,'
        b'"expires_at":2,"token_id":"j"}',
        b'{"tenant_id":"t","user_id":"u","device_id":7,"issued_at":1,'
        b'"expires_at":2,"token_id":"j"}',
        b'{"tenant_id":"t","user_id":"u","device_id":null,"issued_at":5,'
        b'"expires_at":5,"token_id":"j"}',
        b'{"tenant_id":"\\ud800","user_id":"u","device_id":null,"issued_at":1,'
        b'"expires_at":2,"token_id":"j"}',
        b"[" * 3000 + b"]" * 3000,
    ],
)
def test_correctly_signed_but_malformed_claims_are_permission_denied(payload: bytes) -> None:
    token = sign_raw(bytes([1]) * 32, ACCESS_TOKEN_TYPE, "k1", payload)
    if len(token) > MAX_TOKEN_CHARS:
        assert denied(CODEC, token).reason == "bad_shape"
    else:
        assert denied(CODEC, token).reason in {"bad_claims", "bad_payload_json"}


def test_extra_claims_from_a_newer_issuer_are_ignored() -> None:
    payload = json.dumps(
        {
            "tenant_id": "t",
            "user_id": "u",
            "device_id": None,
            "issued_at": NOW,
            "expires_at": NOW + 1,
            "token_id": "j",
            "future_claim": [1, 2],
        }
    ).encode()
    token = sign_raw(bytes([1]) * 32, ACCESS_TOKEN_TYPE, "k1", payload)
    assert CODEC.verify_access(token, now_ms=NOW).token_id == "j"


@pytest.mark.parametrize(
    "token",
    [
        None,
        b"qat1.k1.e30.AAAA",
        12,
        "",
        ".",
        "...",
        "....",
        "qat1.k1.e30",
        "qat1.k1.e30.AAAA.AAAA",
        "qat1..e30.AAAA",
        "qat1.k1!.e30.AAAA",
        "qat1.k1.e30.A",
        "qat1.k1.e30.AAA=",
        "qat1.k1.e30.AAAA",
        "qat1.k1.e30." + "A" * 43,
        "qat1.k1.e30." + "A" * 42 + "B",  # non-canonical trailing bits
        "qat1.k1.e30.é",
        "qat1.k1.e30." + "A" * 5000,
    ],
)
def test_malformed_tokens_are_permission_denied(token: object) -> None:
    denied(CODEC, token)


# -- rotation -------------------------------------------------------------------------------------


def test_key_rotation_keeps_old_tokens_until_the_old_key_is_removed() -> None:
    old_ring = KeyRing([key("old", 1)])
    old_token = TokenCodec(old_ring).issue_access("t", "u", None, now_ms=NOW, ttl_ms=HOUR).token

    rotated = old_ring.rotated(key("new", 2))
    assert rotated.kids == ("new", "old")
    codec = TokenCodec(rotated)
    assert codec.verify_access(old_token, now_ms=NOW).kid == "old"
    new_token = codec.issue_access("t", "u", None, now_ms=NOW, ttl_ms=HOUR).token
    assert codec.verify_access(new_token, now_ms=NOW).kid == "new"
    assert denied(TokenCodec(old_ring), new_token).reason == "unknown_kid"

    retired = TokenCodec(rotated.without("old"))
    assert denied(retired, old_token).reason == "unknown_kid"
    assert retired.verify_access(new_token, now_ms=NOW).kid == "new"
    with pytest.raises(ValueError):
        rotated.without("new")
    with pytest.raises(KeyError):
        rotated.without("nope")


def test_keyring_text_form_round_trips_and_hides_secrets() -> None:
    ring = KeyRing([key("a", 3), key("b-2", 4)])
    text = ring.format()
    parsed = KeyRing.parse(text)
    assert parsed.kids == ("a", "b-2") and parsed.active.secret == bytes([3]) * 32
    urlsafe = " a:" + base64.urlsafe_b64encode(b"\xfb" * 32).decode().rstrip("=") + " ,"
    assert KeyRing.parse(urlsafe).active.secret == b"\xfb" * 32
    assert "\\x03" not in repr(ring) and "AwMD" not in repr(ring)
    assert "AwMD" not in repr(ring.active)


@pytest.mark.parametrize(
    "text",
    ["", " , ", "a", "a:", "a:!!!!", "a:" + base64.b64encode(b"x" * 31).decode(), "bad kid:AAAA"],
)
def test_bad_keyring_text_is_rejected(text: str) -> None:
    with pytest.raises(ValueError):
        KeyRing.parse(text)


def test_keyring_rejects_duplicates_and_empty() -> None:
    with pytest.raises(ValueError):
        KeyRing([key("a", 1), key("a", 2)])
    with pytest.raises(ValueError):
        KeyRing([])


# -- property: nothing but the typed error ever escapes -------------------------------------------

_TOKEN = CODEC.issue_access("t", "u", "d", now_ms=NOW, ttl_ms=HOUR).token
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.=+/ é\x00"


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.text(max_size=200),
        st.text(alphabet=_ALPHABET, max_size=200),
        st.lists(st.text(alphabet=_ALPHABET, max_size=60), min_size=1, max_size=6).map(".".join),
        st.binary(max_size=100),
        st.none(),
        st.integers(),
    )
)
@example("qat1.k1..")
@example("qat1.k1.." + "A" * 43)
def test_arbitrary_input_only_ever_raises_permission_denied(token: object) -> None:
    denied(CODEC, token)
    with pytest.raises(AuthError) as info:
        CODEC.verify_route(token, now_ms=NOW)
    assert info.value.code == PERMISSION_DENIED


@settings(max_examples=400, deadline=None)
@given(
    st.integers(0, len(_TOKEN) - 1),
    st.sampled_from(["delete", "insert", "replace"]),
    st.sampled_from(list(_ALPHABET)),
)
def test_every_mutation_of_a_valid_token_is_permission_denied(index: int, op: str, ch: str) -> None:
    if op == "delete":
        mutated = _TOKEN[:index] + _TOKEN[index + 1 :]
    elif op == "insert":
        mutated = _TOKEN[:index] + ch + _TOKEN[index:]
    else:
        mutated = _TOKEN[:index] + ch + _TOKEN[index + 1 :]
    if mutated == _TOKEN:
        return
    denied(CODEC, mutated)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_validly_signed_random_payloads_only_raise_the_typed_error(payload: bytes) -> None:
    token = sign_raw(bytes([1]) * 32, ACCESS_TOKEN_TYPE, "k1", payload)
    denied(CODEC, token)


# -- errors ---------------------------------------------------------------------------------------


def test_auth_error_codes_are_a6_codes_verbatim() -> None:
    assert AUTH_ERROR_CODES <= A6_CODES
    err = AuthError("UPGRADE_REQUIRED", detail="x", extras={"minimum_client_version": "2.0"})
    assert err.error_fields() == {
        "code": "UPGRADE_REQUIRED",
        "detail": "x",
        "minimum_client_version": "2.0",
    }
    assert err.reason == "x"
    with pytest.raises(ValueError):
        AuthError("INVALID_TOKEN", detail="x")  # type: ignore[arg-type]


def test_detail_does_not_tell_forgery_kinds_apart() -> None:
    token = CODEC.issue_access("t", "u", None, now_ms=NOW, ttl_ms=HOUR).token
    unknown = TokenCodec(KeyRing([key("zz", 1)])).issue_access("t", "u", None, now_ms=NOW, ttl_ms=1)
    details = {
        denied(CODEC, "garbage").detail,
        denied(CODEC, token[:-3] + "AAA").detail,
        denied(CODEC, unknown.token).detail,
    }
    assert details == {"invalid_token"}


# -- client versions ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "minimum", "ok"),
    [
        ("2.0.0", "2.0.0", True),
        ("2.0", "2.0.0", True),
        ("2.0.1", "2.0.0", True),
        ("10.0.0", "9.9.9", True),
        ("1.99.99", "2.0.0", False),
        ("v2.1.0", "2.0.0", True),
        ("ios/2.1.0", "2.0.0", True),
        ("android/1.9", "2.0", False),
        ("2.0.0+build.7", "2.0.0", True),
        ("2.0.0-rc.1", "2.0.0", False),
        ("2.0.1-rc.1", "2.0.0", True),
        ("", "1.0", False),
        ("latest", "1.0", False),
        ("2.0.0rc1", "1.0", False),
        ("1." * 9 + "1", "1.0", False),
        ("9" * 10, "1.0", False),
    ],
)
def test_client_version_against_minimum(version: str, minimum: str, ok: bool) -> None:
    assert client_version_at_least(version, minimum) is ok


def test_non_string_versions_never_pass_and_bad_minimums_are_config_errors() -> None:
    assert parse_client_version(None) is None
    assert not client_version_at_least(3, "1.0")
    with pytest.raises(ValueError):
        client_version_at_least("1.0", "latest")


# -- Redis key layout -----------------------------------------------------------------------------


def test_redis_keys_separate_tenants_users_and_devices_unambiguously() -> None:
    a = keys.epoch_key("qim", "a:b", "c", "d")
    b = keys.epoch_key("qim", "a", "b:c", "d")
    c = keys.epoch_key("qim", "a", "b", "c:d")
    assert len({a, b, c}) == 3
    assert a == b"qim:auth:epoch:3:a:b:1:c:1:d"
    assert keys.epoch_key("qim", "租", "u", "d") == "qim:auth:epoch:3:租:1:u:1:d".encode()
    assert keys.user_revocation_key("qim", "t", "u") != keys.device_revocation_key(
        "qim", "t", "u", ""
    )


ids = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=8)


@given(st.tuples(ids, ids, ids), st.tuples(ids, ids, ids))
def test_epoch_keys_are_injective(one: tuple[str, str, str], two: tuple[str, str, str]) -> None:
    assert (keys.epoch_key("qim", *one) == keys.epoch_key("qim", *two)) == (one == two)


# -- config and key loading -----------------------------------------------------------------------


def test_config_defaults_are_the_spec_values() -> None:
    cfg = AuthConfig()
    assert cfg.access_token_ttl_ms == 3_600_000  # B.4 access_token_ttl 1 h
    assert cfg.route_token_ttl_ms == 60_000  # B.1 route_token_ttl 60 s
    # B.4 revocation_record_retention = access_token_ttl + 2 h margin (plus our clock skew)
    assert cfg.revocation_retention_ms == 3_600_000 + 7_200_000 + cfg.clock_skew_ms
    assert cfg.minimum_for("t") is None


def test_config_validation_and_env() -> None:
    with pytest.raises(ValueError):
        AuthConfig(minimum_client_version="latest")
    with pytest.raises(ValueError):
        AuthConfig(access_token_ttl_ms=0)
    with pytest.raises(ValueError):
        AuthConfig(access_token_ttl_ms=10, max_access_token_ttl_ms=5)
    cfg = AuthConfig(minimum_client_version="1.0", tenant_minimum_client_version={"acme": "2.0"})
    assert (cfg.minimum_for("acme"), cfg.minimum_for("other")) == ("2.0", "1.0")
    env = {
        "QIM_AUTH_ACCESS_TOKEN_TTL_S": "600",
        "QIM_AUTH_MAX_TOKEN_TTL_S": "86400",
        "QIM_AUTH_MIN_CLIENT_VERSION": "3.1",
    }
    cfg = AuthConfig.from_env(env)
    assert (cfg.access_token_ttl_ms, cfg.max_token_ttl_ms) == (600_000, 86_400_000)
    assert cfg.minimum_client_version == "3.1"
    with pytest.raises(ValueError):
        AuthConfig.from_env({"QIM_AUTH_CLOCK_SKEW_S": "soon"})


def test_keyring_from_env_wins_over_the_dev_file(tmp_path: Path) -> None:
    spec = KeyRing([key("prod", 7), key("prev", 8)]).format()
    ring, source = load_keyring({"QIM_AUTH_KEYS": spec}, tmp_path / "auth-keys")
    assert (ring.kids, source) == (("prod", "prev"), "env")
    assert not (tmp_path / "auth-keys").exists()


def test_dev_keyring_is_generated_once_private_and_stable(tmp_path: Path) -> None:
    path = tmp_path / "run" / "auth-keys"
    first, source = load_keyring({}, path)
    assert source == "dev-file" and path.exists()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    second, _ = load_keyring({"QIM_AUTH_KEYS_FILE": str(path)})
    assert second.format() == first.format()
    assert [p.name for p in path.parent.iterdir()] == ["auth-keys"]  # no temp file left


# -- CLI ------------------------------------------------------------------------------------------


def test_cli_issue_prints_a_token_that_verifies_with_the_configured_ring() -> None:
    ring = KeyRing([key("cli", 5)])
    env = {"QIM_AUTH_KEYS": ring.format()}
    result = CliRunner().invoke(
        token_cli, ["issue", "--tenant", "t1", "--user", "u42", "--device", "d1"], env=env
    )
    assert result.exit_code == 0, result.output
    token = result.output.strip()
    claims = TokenCodec(ring).verify_access(token, now_ms=_now_ms())
    assert (claims.tenant_id, claims.user_id, claims.device_id, claims.kid) == (
        "t1",
        "u42",
        "d1",
        "cli",
    )
    assert claims.expires_at_ms - claims.issued_at_ms == 3_600_000

    result = CliRunner().invoke(
        token_cli, ["issue", "--tenant", "t1", "--user", "u42", "--ttl", "60", "--json"], env=env
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    claims = TokenCodec(ring).verify_access(out["access_token"], now_ms=_now_ms())
    assert claims.device_id is None and out["expires_at"] - claims.issued_at_ms == 60_000
    assert out["token_id"] == claims.token_id


def test_cli_issue_refuses_ttl_above_the_cap_and_uses_the_dev_file(tmp_path: Path) -> None:
    env = {"QIM_AUTH_KEYS": KeyRing([key("cli", 5)]).format()}
    result = CliRunner().invoke(
        token_cli, ["issue", "--tenant", "t", "--user", "u", "--ttl", "3601"], env=env
    )
    assert result.exit_code != 0 and "--ttl" in result.output
    dev = tmp_path / "auth-keys"
    result = CliRunner().invoke(
        token_cli,
        ["issue", "--tenant", "t", "--user", "u"],
        env={"QIM_AUTH_KEYS": "", "QIM_AUTH_KEYS_FILE": str(dev)},
    )
    assert result.exit_code == 0, result.output
    token = result.stdout.strip().splitlines()[-1]
    ring, _ = load_keyring({}, dev)
    assert TokenCodec(ring).verify_access(token, now_ms=_now_ms()).user_id == "u"


def test_cli_keygen_output_is_a_valid_keyring_entry() -> None:
    result = CliRunner().invoke(token_cli, ["keygen", "--kid", "2026-01"])
    assert result.exit_code == 0, result.output
    ring = KeyRing.parse(result.output.strip())
    assert ring.kids == ("2026-01",) and len(ring.active.secret) == 32
    assert CliRunner().invoke(token_cli, ["keygen", "--kid", "bad kid"]).exit_code != 0


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_access_claims_reject_inverted_times() -> None:
    with pytest.raises(ValueError):
        AccessClaims("t", "u", None, issued_at_ms=5, expires_at_ms=5, token_id="j")
